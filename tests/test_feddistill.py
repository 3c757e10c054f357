"""FedDistill: per-class mean logits, one Allreduce of [C x C means ; C flags], soft-target CE."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mpicd.algorithms.base import Batch, Context
from mpicd.algorithms.feddistill import FedDistill, FedDistillParams, teacher_logits
from mpicd.algorithms.fedproto import mean_over_clients
from mpicd.models import build_model

from conftest import rank_dumps


STATS_ROUNDS = 3  # tests/drivers/baselines.py


class PlusComm:
    """One other rank, whose payload is ``other``."""

    rank, size = 0, 2

    def __init__(self, other):
        self.other = other

    def allreduce_sum(self, array):
        return array + self.other


def make(params, other):
    torch.manual_seed(0)
    model = build_model("mlp", (5,), 3, 4, 7)
    ctx = Context(comm=PlusComm(other), model=model, device=torch.device("cpu"), seed=0, num_classes=3,
                  expertise=np.array([0, 1]), train_x=torch.randn(12, 5), train_y=torch.arange(12) % 3)
    return FedDistill(params, ctx), model


def batch(model, x, y):
    features = model.features(x)
    return Batch(x, y, features, model.head(features))


def test_teacher_with_and_without_the_own_contribution():
    c = 2
    own = np.array([1, 2, 0, 0, 1, 0], dtype=np.float32)          # has class 0 only
    total = own + np.array([3, 4, 5, 6, 1, 1], dtype=np.float32)  # another client has both
    logits, has = teacher_logits(total, own, c, exclude_self=False)
    np.testing.assert_allclose(logits, [[2, 3], [5, 6]])
    np.testing.assert_array_equal(has, [True, True])
    logits, has = teacher_logits(total, own, c, exclude_self=True)
    np.testing.assert_allclose(logits, [[3, 4], [5, 6]])
    only_mine = np.array([1, 2, 0, 0, 1, 0], dtype=np.float32)
    _, has = teacher_logits(only_mine, only_mine, c, exclude_self=True)
    np.testing.assert_array_equal(has, [False, False])  # nobody else: no teacher, no term


def test_regulariser_is_lambda_soft_target_cross_entropy_where_a_teacher_exists():
    other = np.zeros(3 * 3 + 3, dtype=np.float32)
    other[[0, 1, 2, 3, 4, 5]] = [2.0, -1.0, 0.5, 0.0, 3.0, 1.0]  # teachers for classes 0 and 1
    other[9:] = [1, 1, 0]
    algorithm, model = make(FedDistillParams(lambda_=0.5, exclude_self=True), other)
    x, y = torch.randn(6, 5), torch.tensor([0, 1, 2, 0, 1, 2])
    algorithm.before_epoch(0)
    assert algorithm.extra_loss(batch(model, x, y)) is None  # round 0: no teacher yet
    algorithm.after_epoch(0)
    np.testing.assert_array_equal(algorithm.has_teacher.numpy(), [True, True, False])
    b = batch(model, x, y)
    loss = algorithm.extra_loss(b)
    target = torch.softmax(torch.tensor([[2.0, -1.0, 0.5], [0.0, 3.0, 1.0]]), dim=1)
    mask = y != 2
    expected = 0.5 * -(target[y[mask]] * F.log_softmax(b.logits[mask], dim=1)).sum(dim=1).mean()
    torch.testing.assert_close(loss, expected)
    loss.backward()
    assert model.head.weight.grad.abs().sum() > 0


def test_local_statistics_are_the_mean_logits_per_class():
    algorithm, model = make(FedDistillParams(), np.zeros(12, dtype=np.float32))
    algorithm.before_epoch(0)
    x, y = torch.randn(6, 5), torch.tensor([0, 0, 2, 0, 2, 2])
    b = batch(model, x, y)
    algorithm.extra_loss(b)
    algorithm.after_epoch(0)
    means, flags = algorithm.local.split(algorithm.sent)
    np.testing.assert_allclose(means[0], b.logits[y == 0].mean(dim=0).detach().numpy(), rtol=1e-6)
    assert not means[1].any() and list(flags) == [1, 0, 1]


@pytest.mark.parametrize("variant", ["feddistill", "feddistill_exclude"])
def test_every_rank_receives_the_sum_of_all_local_statistics(baselines, variant):
    ranks, out = baselines
    dumps = rank_dumps(out, variant, ranks)
    c = 2
    for r in range(STATS_ROUNDS):
        sent = np.stack([x[f"sent_{r}"] for x in dumps])
        assert sent.shape == (ranks, c * (c + 1)) and sent.dtype == np.float32
        serial = sent.astype(np.float64).sum(axis=0)
        # class 1 is absent on rank 0: zero row and flag 0
        assert not sent[0, c: 2 * c].any() and list(sent[0, c * c:]) == [1, 0]
        np.testing.assert_array_equal(serial[c * c:], [ranks, ranks - 1])
        for rank, x in enumerate(dumps):
            np.testing.assert_allclose(x[f"received_{r}"], serial, rtol=1e-5, atol=1e-6)
            summed, count = serial[: c * c].reshape(c, c), serial[c * c:]
            if variant == "feddistill_exclude":
                summed = summed - sent[rank, : c * c].reshape(c, c)
                count = count - sent[rank, c * c:]
            logits, has = mean_over_clients(summed, count)
            np.testing.assert_array_equal(x[f"has_{r}"], has)
            np.testing.assert_allclose(x[f"derived_{r}"][has], torch.softmax(torch.from_numpy(logits), 1).numpy()[has],
                                       rtol=1e-5, atol=1e-6)
        if variant == "feddistill_exclude" and ranks == 2:  # rank 1 is the only client with class 1
            assert list(dumps[1][f"has_{r}"]) == [True, False]
        else:
            assert all(x[f"has_{r}"].all() for x in dumps)
