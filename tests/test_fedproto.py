"""FedProto: per-class mean features, one Allreduce of [C x D means ; C flags], MSE to the prototype."""

import numpy as np
import torch
import torch.nn.functional as F

from mpicd.algorithms.base import Batch, Context
from mpicd.algorithms.fedproto import FedProto, FedProtoParams, PerClassMeans, mean_over_clients
from mpicd.models import build_model

from conftest import rank_dumps


STATS_ROUNDS = 3  # tests/drivers/baselines.py


class EchoComm:
    rank, size = 0, 1

    def allreduce_sum(self, array):
        return array.copy()


def make(params=None, classes=3, d=4):
    torch.manual_seed(0)
    model = build_model("mlp", (5,), classes, d, 7)
    ctx = Context(comm=EchoComm(), model=model, device=torch.device("cpu"), seed=0, num_classes=classes,
                  expertise=np.array([0]), train_x=torch.randn(12, 5), train_y=torch.arange(12) % classes)
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
    np.testing.assert_array_equal(flags, [1, 0, 1])                 # ... and flag 0
    stats.reset()
    assert not stats.payload().any()


def test_global_prototype_is_the_mean_over_the_clients_that_have_the_class():
    summed = np.array([[2.0, 4.0], [0.0, 0.0], [3.0, 3.0]], dtype=np.float32)
    means, has = mean_over_clients(summed, np.array([2, 0, 1], dtype=np.float32))
    np.testing.assert_allclose(means, [[1, 2], [0, 0], [3, 3]])
    np.testing.assert_array_equal(has, [True, False, True])


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


def test_statistics_are_detached_training_features_of_the_epoch():
    algorithm, model = make()
    algorithm.before_epoch(0)
    x, y = torch.randn(6, 5), torch.tensor([0, 1, 2, 0, 1, 2])
    b = batch(model, x, y)
    algorithm.extra_loss(b)
    algorithm.after_epoch(0)
    means, flags = algorithm.local.split(algorithm.sent)
    for c in range(3):
        np.testing.assert_allclose(means[c], b.features[y == c].mean(dim=0).detach().numpy(), rtol=1e-6)
    np.testing.assert_array_equal(flags, 1)
    torch.testing.assert_close(algorithm.prototypes, torch.from_numpy(means))  # one client: its own means


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


def test_every_rank_receives_the_sum_of_all_local_statistics(baselines):
    ranks, out = baselines
    dumps = rank_dumps(out, "fedproto", ranks)
    c, d = 2, 200
    for r in range(STATS_ROUNDS):
        sent = np.stack([x[f"sent_{r}"] for x in dumps])
        assert sent.shape == (ranks, c * (d + 1)) and sent.dtype == np.float32
        serial = sent.astype(np.float64).sum(axis=0)
        for rank, x in enumerate(dumps):
            np.testing.assert_allclose(x[f"received_{r}"], serial, rtol=1e-5, atol=1e-6)
            means, has = mean_over_clients(serial[: c * d].reshape(c, d), serial[c * d:])
            np.testing.assert_allclose(x[f"derived_{r}"], means, rtol=1e-5, atol=1e-6)
            np.testing.assert_array_equal(x[f"has_{r}"], has)
        # class 1 is absent on rank 0: zero mean row, flag 0; everyone else contributes it
        assert not sent[0, d: 2 * d].any() and sent[0, c * d + 1] == 0 and sent[0, c * d] == 1
        np.testing.assert_array_equal(serial[c * d:], [ranks, ranks - 1])
        assert dumps[0][f"has_{r}"].all()  # rank 0 still gets the others' prototype of class 1
        assert np.abs(dumps[0][f"derived_{r}"][1]).sum() > 0
