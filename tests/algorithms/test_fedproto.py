"""FedProto: per-class features, one Allreduce of [C x D rows ; C weights], MSE to the prototype.

Default weighting: samples (the paper's Eq. 6), rows = n_c * mean_c and weights = n_c; option
equal (the reference code): rows = mean_c, weights = presence flags.
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mpicd.algorithms.base import Batch, Context
from mpicd.algorithms.fedproto import FedProto, FedProtoParams, mean_over_clients, PerClassMeans
from mpicd.models.networks import build_model
from mpicd.results.reader import Results

from conftest import rank_dumps
from drivers.driver_settings import STATS_ROUNDS


class EchoComm:
    """A job of one rank, or of two when ``other`` (the other rank's payload) is given."""

    rank = 0

    def __init__(self, other=None):
        self.other, self.size = other, 1 if other is None else 2

    def allreduce_sum(self, array, *, channel):
        assert channel == "payload"
        return array.copy() if self.other is None else array + self.other


def make(params=None, classes=3, d=4, other=None):
    torch.manual_seed(0)
    model = build_model("mlp", (5,), classes, d, 7)
    ctx = Context(
        comm=EchoComm(other),
        model=model,
        device=torch.device("cpu"),
        seed=0,
        num_classes=classes,
        expertise=np.array([0]),
        train_x=torch.randn(12, 5),
        train_y=torch.arange(12) % classes,
    )
    return FedProto(params or FedProtoParams(), ctx), model


def batch(model, x, y):
    features = model.features(x)
    return Batch(x, y, features, model.head(features))


def test_per_class_means_and_an_absent_class():
    stats = PerClassMeans(3, 2, torch.device("cpu"))
    values = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 9.0]])
    labels = torch.tensor([0, 0, 2, 2])
    stats.add(values[:3], labels[:3])
    stats.add(values[3:], labels[3:])  # accumulates across batches
    payload = stats.payload()
    assert payload.dtype == np.float32 and payload.flags.c_contiguous and payload.shape == (3 * 2 + 3,)
    means, flags = stats.split(payload)
    np.testing.assert_allclose(means, [[2, 3], [0, 0], [6, 7.5]])  # class 1 absent: zero row
    np.testing.assert_array_equal(flags, [1, 0, 1])  # ... and flag 0
    weighted = stats.payload(weighted=True)
    assert weighted.dtype == np.float32 and weighted.shape == (3 * 2 + 3,)
    sums, counts = stats.split(weighted)
    np.testing.assert_allclose(sums, [[4, 6], [0, 0], [12, 15]])  # n_c * mean_c
    np.testing.assert_array_equal(counts, [2, 0, 2])
    stats.reset()
    assert not stats.payload().any() and not stats.payload(weighted=True).any()


def test_global_prototype_is_the_mean_over_the_clients_that_have_the_class():
    summed = np.array([[2.0, 4.0], [0.0, 0.0], [3.0, 3.0]], dtype=np.float32)
    means, has = mean_over_clients(summed, np.array([2, 0, 1], dtype=np.float32))
    np.testing.assert_allclose(means, [[1, 2], [0, 0], [3, 3]])
    np.testing.assert_array_equal(has, [True, False, True])


@pytest.mark.parametrize(
    "weighting, expected",
    [
        ("samples", [[(1 * 1 + 3 * 4) / 4, (1 * 2 + 3 * 5) / 4], [7, 8]]),  # Eq. 6: n_ic / N_c
        ("equal", [[(1 + 4) / 2, (2 + 5) / 2], [7, 8]]),  # the reference code
    ],
)
def test_two_clients_with_different_counts(weighting, expected):
    """This client saw class 0 once (feature [1, 2]); the other saw it 3 times (mean [4, 5]) and
    class 1 twice (mean [7, 8]): the default weights the means by those counts, equal does not."""
    other = {"samples": [12, 15, 14, 16, 3, 2], "equal": [4, 5, 7, 8, 1, 1]}[weighting]
    algorithm, _ = make(FedProtoParams(weighting=weighting), classes=2, d=2, other=np.array(other, dtype=np.float32))
    algorithm.before_epoch(0)
    algorithm.local.add(torch.tensor([[1.0, 2.0]]), torch.tensor([0]))
    algorithm.after_epoch(0)
    np.testing.assert_allclose(algorithm.sent, [1, 2, 0, 0, 1, 0])  # n * mean = mean when n = 1
    torch.testing.assert_close(algorithm.prototypes, torch.tensor(expected, dtype=torch.float32))
    assert algorithm.has_prototype.all()


def test_default_is_the_papers_weighting():
    assert FedProtoParams().weighting == "samples"


def test_regulariser_is_lambda_mse_only_for_classes_with_a_prototype():
    algorithm, model = make(FedProtoParams(lambda_=2.0))
    x, y = torch.randn(6, 5), torch.tensor([0, 1, 2, 0, 1, 2])
    assert algorithm.extra_loss(batch(model, x, y)) is None  # round 0: no prototypes yet
    algorithm.prototypes = torch.randn(3, 4)
    algorithm.has_prototype = torch.tensor([True, False, True])
    b = batch(model, x, y)
    loss = algorithm.extra_loss(b)
    mask = y != 1
    expected = 2.0 * F.mse_loss(b.features[mask], algorithm.prototypes[y[mask]])
    torch.testing.assert_close(loss, expected)
    loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.features.parameters())
    algorithm.has_prototype = torch.tensor([False, True, False])
    assert algorithm.extra_loss(batch(model, x[mask], y[mask])) is None


@pytest.mark.parametrize("weighting", ["samples", "equal"])
def test_statistics_are_detached_training_features_of_the_epoch(weighting):
    algorithm, model = make(FedProtoParams(weighting=weighting))
    algorithm.before_epoch(0)
    x, y = torch.randn(7, 5), torch.tensor([0, 1, 2, 0, 1, 2, 0])
    b = batch(model, x, y)
    algorithm.observe_batch(b)
    algorithm.extra_loss(b)
    algorithm.after_epoch(0)
    rows, weights = algorithm.local.split(algorithm.sent)
    counts = np.array([3, 2, 2])
    means = np.stack([b.features[y == c].mean(dim=0).detach().numpy() for c in range(3)])
    if weighting == "samples":
        np.testing.assert_allclose(rows, counts[:, None] * means, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(weights, counts)
    else:
        np.testing.assert_allclose(rows, means, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(weights, 1)
    # one client: its own means either way
    np.testing.assert_allclose(algorithm.prototypes.numpy(), means, rtol=1e-5, atol=1e-6)


def test_nearest_prototype_prediction():
    algorithm, model = make(FedProtoParams(predict="nearest_prototype"))
    x = torch.randn(5, 5)
    torch.testing.assert_close(algorithm.predict(x), model(x))  # no prototypes yet: the head
    with torch.no_grad():
        features = model.features(x)
    algorithm.prototypes = torch.stack([features[0], features[1], features[2]])
    algorithm.has_prototype = torch.tensor([True, True, False])
    predicted = algorithm.predict(x).argmax(dim=1)
    assert predicted[0] == 0 and predicted[1] == 1 and (predicted != 2).all()
    head, _ = make(FedProtoParams(predict="head"))
    head.prototypes = algorithm.prototypes
    torch.testing.assert_close(head.predict(x), head.ctx.model(x))


def naive_prototypes(sums: np.ndarray, seen: np.ndarray, weighting: str) -> tuple[np.ndarray, np.ndarray]:
    """Serial recomputation from every rank's per-class feature sums (ranks, C, D) and counts (ranks, C)."""
    ranks, classes, d = sums.shape
    prototypes, has = np.zeros((classes, d)), np.zeros(classes, dtype=bool)
    for c in range(classes):
        holders = [i for i in range(ranks) if seen[i, c] > 0]
        if not holders:
            continue
        has[c] = True
        if weighting == "samples":  # sum_i n_ic mean_ic / sum_i n_ic
            prototypes[c] = sum(sums[i, c] for i in holders) / sum(seen[i, c] for i in holders)
        else:  # (1 / |N_c|) sum_i mean_ic
            prototypes[c] = sum(sums[i, c] / seen[i, c] for i in holders) / len(holders)
    return prototypes, has


@pytest.mark.parametrize("weighting", ["samples", "equal"])
def test_global_prototypes_are_the_serial_recomputation_over_all_ranks(baselines, weighting):
    ranks, out = baselines
    dumps = rank_dumps(out, "fedproto" if weighting == "samples" else "fedproto_equal", ranks)
    c, d = 2, 200
    for r in range(STATS_ROUNDS):
        # the driver's own sums of the features of every batch each rank trained on, and their counts
        sums = np.stack([x[f"sums_{r}"] for x in dumps])
        seen = np.stack([x[f"seen_{r}"] for x in dumps])
        np.testing.assert_array_equal(seen, [x["counts"] for x in dumps])  # one epoch: every sample once
        assert len(set(seen[:, 0])) > 1  # skew 0.6: clients hold different counts of class 0
        assert seen[0, 1] == 0 and (seen[1:, 1] > 0).all()  # class 1 absent on rank 0 only
        sent = np.stack([x[f"sent_{r}"] for x in dumps])
        assert sent.shape == (ranks, c * (d + 1)) and sent.dtype == np.float32  # 4 C (D + 1) bytes
        if weighting == "samples":
            rows, weights = sums, seen
        else:
            rows = np.where(seen[:, :, None] > 0, sums / np.maximum(seen, 1)[:, :, None], 0.0)
            weights = (seen > 0).astype(float)
        np.testing.assert_allclose(sent[:, : c * d], rows.reshape(ranks, -1), rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(sent[:, c * d :], weights)
        prototypes, has = naive_prototypes(sums, seen, weighting)
        assert has.all()  # rank 0 still gets the others' prototype of class 1
        for x in dumps:
            np.testing.assert_allclose(x[f"received_{r}"], sent.astype(np.float64).sum(axis=0), rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(x[f"derived_{r}"], prototypes, rtol=1e-5, atol=1e-6)
            np.testing.assert_array_equal(x[f"has_{r}"], has)
        # the weighting matters: the other one is measurably different
        other, _ = naive_prototypes(sums, seen, "equal" if weighting == "samples" else "samples")
        assert np.abs(other - prototypes).max() > 1e-3


def test_the_results_file_says_which_weighting_ran(baselines):
    _, out = baselines
    samples, equal = Results(out / "fedproto_quick.h5"), Results(out / "fedproto_equal_quick.h5")
    assert samples.config["algorithm"]["weighting"] == "samples"  # the default, written out
    assert equal.config["algorithm"]["weighting"] == "equal"
    # round 0 trains without prototypes, so both runs agree bit for bit; then the prototypes differ
    np.testing.assert_array_equal(samples.metrics["train_loss"][0], equal.metrics["train_loss"][0])
    assert not np.array_equal(samples.metrics["train_loss"][1:], equal.metrics["train_loss"][1:])


@pytest.mark.parametrize("name", ["fedproto", "feddistill"])
def test_the_client_shows_every_training_batch_to_the_statistics_at_lambda_0(name):
    """The statistics come from observe_batch, which Client.local_epochs calls on every batch:
    at lambda = 0 (no loss term) the counts are still those of every image of the local epochs."""
    from types import SimpleNamespace

    from mpicd.config.loading import load_config
    from mpicd.run.client import Client
    from mpicd.run.plan import prepare

    from conftest import QUICKSTART

    plan = prepare(load_config(QUICKSTART, ["clients=2", "device=cpu", "train.local_epochs=2", f"algorithm={name}",
                                            "algorithm.lambda=0"]))  # fmt: skip
    client = Client(plan, SimpleNamespace(rank=1, size=2), "cpu")
    client.algorithm.before_epoch(0)
    client.local_epochs(0)
    labels = client.train_y.numpy()
    np.testing.assert_array_equal(client.algorithm.local.counts.numpy(), 2 * np.bincount(labels, minlength=2))
