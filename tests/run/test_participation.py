"""mpicd.run.participation: the round's sample of clients, and co-distillation's teachers among them
(end to end, on several layouts: tests/run/test_clients_per_rank.py)."""

import numpy as np
import pytest

from mpicd.algorithms.codistill import teacher_assignment
from mpicd.run.participation import participants, sample_size


@pytest.mark.parametrize(
    "clients, fraction, expected",
    [(10, 0.3, 3), (6, 0.5, 3), (4, 0.1, 1), (7, 0.99, 6), (100, 0.1, 10), (5, 1.0, 5)],
)
def test_sample_size_is_floor_c_n_at_least_one(clients, fraction, expected):
    assert sample_size(clients, fraction) == expected


def test_every_client_without_a_draw_at_one_and_a_seeded_sample_below():
    assert participants(0, 3, 8, 1.0) is None
    drawn = [participants(0, r, 8, 0.5) for r in range(400)]
    assert all(len(d) == 4 and len(set(d.tolist())) == 4 and list(d) == sorted(d) for d in drawn)
    assert np.array_equal(participants(0, 5, 8, 0.5), participants(0, 5, 8, 0.5))
    assert not np.array_equal(participants(0, 5, 8, 0.5), participants(1, 5, 8, 0.5))
    # uniform: each client is in a round's sample with probability 4/8 (400 rounds: sd 10)
    counts = np.bincount(np.concatenate(drawn), minlength=8)
    assert np.all(np.abs(counts - 200) < 50), counts


def test_teachers_are_drawn_among_the_participants_uniformly():
    taking = np.array([1, 3, 4])
    pairs = np.zeros((6, 6), dtype=int)
    for r in range(3000):
        t = teacher_assignment(2, r, 6, taking)
        assert (t[[0, 2, 5]] == -1).all()
        for s in taking:
            assert t[s] in taking and t[s] != s
            pairs[s, t[s]] += 1
    # each participant's teacher uniform over the 2 others: 1500 each (sd ~27)
    for s in taking:
        others = [o for o in taking if o != s]
        assert all(abs(pairs[s, o] - 1500) < 150 for o in others), pairs[s]
    assert (teacher_assignment(2, 0, 6, np.array([4])) == -1).all()  # one participant: no teacher
