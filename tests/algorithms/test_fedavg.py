"""FedAvg: one Allreduce of [n_i theta_i ; n_i]; every rank ends the round with the weighted mean."""

import numpy as np
import pytest
import torch

from mpicd.algorithms.aggregate import assign, averaged_tensors, flatten
from mpicd.algorithms.base import Context
from mpicd.algorithms.fedavg import FedAvg
from mpicd.models.networks import build_model, num_parameters, resnet18
from mpicd.results.reader import Results

from conftest import DRIVERS, mpiexec, rank_dumps
from drivers.driver_settings import FEDAVG_ROUNDS, STATS_ROUNDS


class SummingComm:
    """A stand-in for Comm: the 'other ranks' contribute fixed vectors to the sum."""

    def __init__(self, others):
        self.rank, self.size, self.others, self.sent = 0, 1 + len(others), others, None

    def allreduce_sum(self, array, *, channel):
        assert channel == "payload"
        self.sent = array.copy()
        return array + sum(self.others)


def context(model, comm, n):
    x, y = torch.randn(n, 8), torch.arange(n) % 2
    return Context(
        comm=comm,
        model=model,
        device=torch.device("cpu"),
        seed=0,
        num_classes=2,
        expertise=np.array([0, 1]),
        train_x=x,
        train_y=y,
    )


def test_payload_is_n_theta_then_n_and_the_result_is_the_weighted_mean():
    torch.manual_seed(0)
    model = build_model("mlp", (8,), 2, 4, 6)
    p = num_parameters(model)
    theta = flatten(list(model.parameters()))
    other = np.linspace(-1, 1, p).astype(np.float32)
    comm = SummingComm([np.concatenate([30 * other, [30]]).astype(np.float32)])
    FedAvg(FedAvg.Params(), context(model, comm, 10)).after_epoch(0)
    assert comm.sent.dtype == np.float32 and comm.sent.shape == (p + 1,)
    np.testing.assert_allclose(comm.sent, np.concatenate([10 * theta, [10]]), rtol=1e-6)
    np.testing.assert_allclose(flatten(list(model.parameters())), (10 * theta + 30 * other) / 40, rtol=1e-5, atol=1e-7)


def test_batchnorm_buffers_are_averaged_but_not_the_step_counter():
    model = resnet18(1, 2)
    tensors = averaged_tensors(model)
    names = {id(b): n for n, b in model.named_buffers()}
    buffers = [names[id(t)] for t in tensors if id(t) in names]
    assert buffers and all(n.endswith(("running_mean", "running_var")) for n in buffers)
    assert not any(n.endswith("num_batches_tracked") for n in buffers)
    assert len(tensors) == len(list(model.parameters())) + len(buffers)
    vector = np.arange(sum(t.numel() for t in tensors), dtype=np.float32)
    assign(tensors, vector)
    np.testing.assert_array_equal(flatten(tensors), vector)
    counter = dict(model.named_buffers())["features.bn1.num_batches_tracked"]
    assert counter.dtype == torch.int64 and int(counter) == 0


def test_all_ranks_hold_the_bit_identical_sample_weighted_mean(baselines):
    ranks, out = baselines
    dumps = rank_dumps(out, "fedavg", ranks)
    n = np.array([int(d["n"]) for d in dumps], dtype=np.float64)
    assert len(set(n)) == ranks  # the driver gives every rank a different training-set size
    for r in range(STATS_ROUNDS):
        pre = np.stack([d[f"pre_{r}"] for d in dumps]).astype(np.float64)
        post = np.stack([d[f"post_{r}"] for d in dumps])
        for rank in range(1, ranks):
            assert np.array_equal(post[rank], post[0]), f"round {r}: rank {rank} differs from rank 0"
        weighted = (n[:, None] * pre).sum(axis=0) / n.sum()
        np.testing.assert_allclose(post[0], weighted, rtol=1e-5, atol=1e-6)
        # the weights matter: the unweighted mean is measurably different
        assert np.abs(pre.mean(axis=0) - weighted).max() > 1e-6
        if r + 1 < STATS_ROUNDS:  # every rank starts the next round from the average
            assert not np.array_equal(dumps[0][f"pre_{r + 1}"], post[0])


REPLAY_ROUNDS = FEDAVG_ROUNDS
REPLAY_ATOL = 1e-6  # float32 averaging vs the replay's float64: 5e-8 measured after 3 rounds


@pytest.fixture(scope="module")
def replayed(tmp_path_factory):
    """tests/drivers/fedavg_rounds.py in replay mode: a real 3-rank FedAvg run whose clients hold
    68, 98 and 68 images, and each client's local training replayed serially in one process."""
    out = tmp_path_factory.mktemp("fedavg_replay")
    result = mpiexec(3, str(DRIVERS / "fedavg_rounds.py"), str(out), "replay", timeout=300)
    assert result.returncode == 0, (
        f"fedavg_rounds driver failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
    )
    ranks = [dict(np.load(out / f"rank{r}.npz")) for r in range(3)]
    return Results(out / "run.h5"), ranks, dict(np.load(out / "replay.npz"))


def test_fedavg_equals_the_serial_replay_averaged_by_sample_counts(replayed):
    """Every round ends with sum_j n_j theta_j / sum_j n_j over the clients' locally trained models,
    computed here in numpy from a replay that never touches MPI or FedAvg: an unweighted mean, a
    missing average, or a round that does not start from the previous average all fail."""
    results, ranks, replay = replayed
    n = results.partition["train_counts"].sum(axis=1).astype(np.float64)  # the file's partition
    assert len(set(n)) > 1, n  # data.skew_mode=authors: 68, 98 and 68 images, the weights differ
    assert [int(d["n"]) for d in ranks] == [int(replay[f"n_{j}"]) for j in range(3)] == list(n)
    for r in range(REPLAY_ROUNDS):
        theta = np.stack([replay[f"theta_{r}_{j}"] for j in range(3)]).astype(np.float64)
        expected = (n[:, None] * theta).sum(axis=0) / n.sum()
        for rank, d in enumerate(ranks):  # the MPI clients trained what the replay trained ...
            np.testing.assert_allclose(d[f"pre_{r}"], theta[rank], rtol=0, atol=REPLAY_ATOL, err_msg=f"round {r}")
            # ... and ended the round with its sample-weighted mean
            np.testing.assert_allclose(d[f"post_{r}"], expected, rtol=0, atol=REPLAY_ATOL, err_msg=f"round {r}")
        # the test has power: the unweighted mean and every client's own model are far outside it
        assert np.abs(theta.mean(axis=0) - expected).max() > 50 * REPLAY_ATOL
        assert min(np.abs(theta[j] - expected).max() for j in range(3)) > 500 * REPLAY_ATOL
