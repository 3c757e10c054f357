"""FedAvg with a skipped client (``on_nonfinite: skip``): the round's average is the sample-weighted
mean of the OTHER clients' models, and the skipped client goes back to its start-of-round model,
then takes the average like everyone else. Through the real ``mpicd run`` under mpiexec, with NaN
injected into one rank's model after its local epoch (``debug.fail_kind=nan``), recording every
rank's model just before and just after each aggregation (tests/drivers/fedavg_rounds.py)."""

import numpy as np
import pytest

from mpicd.results.reader import Results

from conftest import DRIVERS, mpiexec
from drivers.driver_settings import FEDAVG_ROUNDS

RANKS = 3
ROUNDS = FEDAVG_ROUNDS
FAIL_RANK = 2  # clients 0 and 2 hold 68 images, client 1 98 (data.skew_mode=authors): the others' weights differ
FAIL_ROUND = 1  # counted from 0: the middle round
ATOL = 1e-6  # float32 averaging by MPI vs float64 here


@pytest.fixture(scope="module")
def skipped(tmp_path_factory):
    out = tmp_path_factory.mktemp("fedavg_skip")
    result = mpiexec(
        RANKS,
        str(DRIVERS / "fedavg_rounds.py"),
        str(out),
        "plain",
        "on_nonfinite=skip",
        f"debug.fail_rank={FAIL_RANK}",
        f"debug.fail_round={FAIL_ROUND}",
        "debug.fail_kind=nan",
        "debug.fail_at=after_epoch",
        timeout=300,
    )
    assert result.returncode == 0, (
        f"fedavg_rounds driver failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
    )
    assert "on_nonfinite=skip: this client's update of the round is dropped" in result.stdout
    return Results(out / "run.h5"), [dict(np.load(out / f"rank{r}.npz")) for r in range(RANKS)]


def weighted_mean(models: np.ndarray, weights: np.ndarray) -> np.ndarray:
    return (weights[:, None] * models).sum(axis=0) / weights.sum()


def test_the_skipped_round_averages_only_the_other_clients_by_their_sample_counts(skipped):
    results, ranks = skipped
    expected_skips = np.zeros((ROUNDS, RANKS), dtype=np.int64)
    expected_skips[FAIL_ROUND, FAIL_RANK] = 1
    np.testing.assert_array_equal(results.metrics["skipped"], expected_skips)
    n = results.partition["train_counts"].sum(axis=1).astype(np.float64)  # the file's partition
    assert [int(d["n"]) for d in ranks] == list(n)
    others = [r for r in range(RANKS) if r != FAIL_RANK]
    assert n[others[0]] != n[others[1]], n  # else weighted and unweighted means would coincide
    for r in range(ROUNDS):
        pre = np.stack([d[f"pre_{r}"] for d in ranks]).astype(np.float64)
        post = np.stack([d[f"post_{r}"] for d in ranks])
        assert np.isfinite(pre).all() and np.isfinite(post).all(), f"round {r}"
        for rank in range(1, RANKS):  # the skipped client takes the average too
            assert np.array_equal(post[rank], post[0]), f"round {r}: rank {rank} differs from rank 0"
        weights = n.copy()
        if r == FAIL_ROUND:
            weights[FAIL_RANK] = 0.0
        np.testing.assert_allclose(post[0], weighted_mean(pre, weights), rtol=0, atol=ATOL, err_msg=f"round {r}")
    # In the skipped round the dropped client is back at its start-of-round model (the previous
    # round's average, bit for bit), finite, and yet left out of the average.
    pre = np.stack([d[f"pre_{FAIL_ROUND}"] for d in ranks]).astype(np.float64)
    np.testing.assert_array_equal(ranks[FAIL_RANK][f"pre_{FAIL_ROUND}"], ranks[0][f"post_{FAIL_ROUND - 1}"])
    expected = weighted_mean(pre, np.where(np.arange(RANKS) == FAIL_RANK, 0.0, n))
    # the test has power: averaging it in, or an unweighted mean of the others, is far outside ATOL
    assert np.abs(weighted_mean(pre, n) - expected).max() > 100 * ATOL
    assert np.abs(pre[others].mean(axis=0) - expected).max() > 50 * ATOL
