"""mpicd.mpi.assignment: the assignment of clients to ranks, against assignments worked out by hand."""

import numpy as np
import pytest

from mpicd.config.sections import ConfigError
from mpicd.mpi.assignment import assign, Assignment, check_ranks


@pytest.mark.parametrize(
    "sizes, ranks, expected",
    [
        # largest first, each to the lightest rank: 10->r0, 7->r1, 5->r1 (7 < 10), 4->r0 (10 < 12),
        # 3->r1 (12 < 14), 1->r0 (14 < 15): loads 15 and 15
        ([10, 7, 5, 4, 3, 1], 2, [0, 1, 1, 0, 1, 0]),
        # equal sizes: lower index first; equal loads and counts: the lower rank
        ([5, 5, 5, 5], 2, [0, 1, 0, 1]),
        # equal loads (3, 3): the rank with fewer clients (r0 holds one, r1 three) takes the empty client
        ([3, 1, 1, 1, 0], 2, [0, 1, 1, 1, 0]),
        # three ranks: 9->r0, 8->r1, 2->r2, 2->r2 (2 < 8), 1->r2 (4 < 8): loads 9, 8, 5
        ([2, 9, 1, 8, 2], 3, [2, 0, 2, 1, 2]),
        # one rank holds everyone
        ([4, 3, 2], 1, [0, 0, 0]),
        # as many ranks as clients: client i on rank i, whatever the sizes
        ([1, 9, 5], 3, [0, 1, 2]),
    ],
)
def test_assignment_matches_the_hand_computed_one(sizes, ranks, expected):
    assert assign(sizes, ranks).tolist() == expected


def test_every_rank_gets_a_client_and_the_loads_are_within_grahams_list_scheduling_bound():
    """Greedy list scheduling puts the heaviest rank at most (1 - 1/R) * the largest client above
    the mean load (Graham 1966): the last client added to it went to the lightest rank."""
    rng = np.random.default_rng(5)
    for _ in range(200):
        clients = int(rng.integers(1, 40))
        ranks = int(rng.integers(1, clients + 1))
        sizes = rng.integers(1, 500, size=clients)
        owner = assign(sizes, ranks)
        assert sorted(set(owner.tolist())) == list(range(ranks))
        loads = np.bincount(owner, weights=sizes, minlength=ranks)
        assert loads.max() <= sizes.sum() / ranks + (1 - 1 / ranks) * sizes.max() + 1e-9


def test_layout_lists_each_ranks_clients_in_client_order():
    layout = Assignment.of([10, 7, 5, 4, 3, 1], 2, rank=1)
    assert layout.mine == [1, 2, 4] and layout.held_by(0) == [0, 3, 5]
    assert layout.counts().tolist() == [3, 3] and layout.ranks == 2 and layout.clients == 6


def test_bad_rank_counts_are_refused():
    with pytest.raises(ValueError):
        assign([1, 2], 3)
    with pytest.raises(ValueError):
        assign([1, 2], 0)
    with pytest.raises(ConfigError, match="the config has 4 clients but the job has 2 MPI ranks.*balanced"):
        check_ranks(4, 2, "one", "run mpirun -n 4")
    with pytest.raises(ConfigError, match="at most one rank per client"):
        check_ranks(2, 4, "balanced", "run mpirun -n 2")
    check_ranks(4, 2, "balanced", "")
    check_ranks(4, 4, "one", "")
