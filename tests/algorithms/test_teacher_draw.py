"""Co-distillation's teacher draw is uniform over the other clients, never the client itself: a
chi-square goodness-of-fit test of the draw as the algorithm makes it (``CoDistillation.before_epoch``,
whose ``teacher()`` is what the loop writes to ``/comm/teacher``; tests/algorithms/test_codistill.py checks
that a real run's ``/comm/teacher`` is ``teacher_assignment``), over many seeds and rounds.

Sample size and threshold. Each client i draws M = SEEDS * ROUNDS teachers; the statistic sums
(O_ij - E)^2 / E over the N (N - 1) cells (i, j != i) with E = M / (N - 1). Clients draw
independently (one ``integers`` call of size N) and every (seed, round) is its own stream, so a
fair draw gives N independent multinomial rows: chi-square with N (N - 2) degrees of freedom, 8
for N = 4 and 24 for N = 6 (even, so its tail has the closed form below, no scipy needed). Each N
fails at the chi-square quantile 1 - ALPHA / 2 (44.30 and 74.18): a fair draw fails this file
with probability below ALPHA = 1e-6 (the draws are pseudo-random but fixed, so in fact the
test passes or fails deterministically). A draw with twice the weight on i + 1 has p = 2/N there
and 1/N elsewhere; its noncentrality is M * sum (p - 1/(N-1))^2 / (1/(N-1)) = M / 2 (N = 4) and
2 M / 3 (N = 6), 1000 and 1333 at M = 2000, against thresholds of 44 and 74: the statistic then
has mean ~1000 and sd ~63, and falls below the threshold with probability < 1e-40 (scipy's ncx2
gives 0.0), i.e. it fails always; test_the_test_rejects_a_draw_that_favours_the_next_client
checks that on such a draw. Even 1.5x weight on i + 1 (noncentrality 327 at N = 4) fails.
"""

import math

import numpy as np
import pytest
import torch

from mpicd.algorithms.base import Context
from mpicd.algorithms.codistill import CoDistillation, CoDistillParams
from mpicd.models.networks import build_model

SEEDS = 20
ROUNDS = 100  # M = 2000 draws per client
ALPHA = 1e-6  # for the whole file: ALPHA / 2 per client count
CLIENT_COUNTS = (4, 6)


def chi2_sf_even(x: float, dof: int) -> float:
    """P(X > x) for X ~ chi-square with an even number of degrees of freedom: the Poisson sum
    exp(-x/2) * sum_{j < dof/2} (x/2)^j / j!."""
    assert dof % 2 == 0 and dof > 0
    half, term, total = x / 2.0, 1.0, 1.0
    for j in range(1, dof // 2):
        term *= half / j
        total += term
    return math.exp(-half) * total


def chi2_threshold(dof: int, alpha: float) -> float:
    """The x with P(X > x) = alpha, by bisection on the closed form."""
    lo, hi = 0.0, 10.0 * dof + 200.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if chi2_sf_even(mid, dof) > alpha else (lo, mid)
    return hi


def statistic(counts: np.ndarray) -> float:
    """Chi-square of an (N, N) table of teacher counts against 'uniform over the others'."""
    n = len(counts)
    off = ~np.eye(n, dtype=bool)
    expected = counts.sum(axis=1, keepdims=True) / (n - 1)
    return float((((counts - expected) ** 2 / expected)[off]).sum())


class NoComm:
    """Stands in for mpicd.mpi.comm.Comm: the teacher's message is dropped, the student's 'arrives'."""

    def __init__(self, rank: int, size: int):
        self.rank, self.size = rank, size

    def exchange(self, sends, recvs, tag, *, channel, allow_empty=False):
        assert channel == "payload"
        return [True for _ in recvs]


def algorithm_draws(clients: int) -> np.ndarray:
    """(N, N) counts of the teacher each client's CoDistillation got, over SEEDS x ROUNDS rounds."""
    torch.manual_seed(0)
    model = build_model("mlp", (3,), 2, 4, 4)
    x, y = torch.randn(4, 3), torch.tensor([0, 1, 0, 1])
    counts = np.zeros((clients, clients), dtype=np.int64)
    for seed in range(SEEDS):
        for rank in range(clients):
            ctx = Context(
                comm=NoComm(rank, clients),
                model=model,
                device=torch.device("cpu"),
                seed=seed,
                num_classes=2,
                expertise=np.arange(clients) % 2,
                train_x=x,
                train_y=y,
            )
            algorithm = CoDistillation(CoDistillParams(), ctx)
            algorithm.class_means = lambda r: np.zeros((1, 4), dtype=np.float32)  # the message: not tested here
            for r in range(ROUNDS):
                algorithm.before_epoch(r)
                counts[rank, algorithm.teacher()] += 1
    return counts


def test_thresholds_are_the_chi_square_quantiles():
    assert chi2_threshold(8, ALPHA / 2) == pytest.approx(44.2968, abs=1e-3)
    assert chi2_threshold(24, ALPHA / 2) == pytest.approx(74.1811, abs=1e-3)
    assert chi2_sf_even(2.0, 2) == pytest.approx(math.exp(-1.0))
    try:  # the closed form against scipy where it happens to be installed (it is not required)
        from scipy.stats import chi2
    except ImportError:
        return
    for dof in (2, 8, 24):
        assert chi2_sf_even(50.0, dof) == pytest.approx(chi2.sf(50.0, dof), rel=1e-9)


@pytest.mark.parametrize("clients", CLIENT_COUNTS)
def test_the_teacher_is_uniform_over_the_other_clients(clients):
    counts = algorithm_draws(clients)
    assert np.trace(counts) == 0, "a client was its own teacher"
    assert (counts.sum(axis=1) == SEEDS * ROUNDS).all()
    value, threshold = statistic(counts), chi2_threshold(clients * (clients - 2), ALPHA / 2)
    assert value < threshold, (
        f"chi-square {value:.1f} >= {threshold:.1f} ({clients * (clients - 2)} dof): "
        f"the draw is not uniform over the other clients:\n{counts}"
    )


@pytest.mark.parametrize("clients", CLIENT_COUNTS)
def test_the_test_rejects_a_draw_that_favours_the_next_client(clients):
    """The same sample size on a draw with twice the weight on i + 1 is far past the threshold."""
    rng = np.random.default_rng(12345)
    weights = np.array([2.0] + [1.0] * (clients - 2))  # offsets 1 .. N-1 from the client
    offsets = rng.choice(np.arange(1, clients), size=(SEEDS * ROUNDS, clients), p=weights / weights.sum())
    teachers = (np.arange(clients) + offsets) % clients
    counts = np.zeros((clients, clients), dtype=np.int64)
    for i in range(clients):
        counts[i] = np.bincount(teachers[:, i], minlength=clients)
    assert statistic(counts) > 5 * chi2_threshold(clients * (clients - 2), ALPHA / 2)
