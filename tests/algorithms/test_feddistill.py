"""FedDistill: per-class mean logits, one Allreduce of [C x C means ; C flags], soft-target CE.

Default teacher (Jeong et al.): the mean over the *other* clients; option: all clients' mean.
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mpicd.algorithms.base import Batch, Context
from mpicd.algorithms.feddistill import FedDistill, FedDistillParams, teacher_logits
from mpicd.models.networks import build_model
from mpicd.results.reader import Results

from conftest import rank_dumps
from drivers.driver_settings import STATS_ROUNDS


class PlusComm:
    """One other rank, whose payload is ``other``."""

    rank, size = 0, 2

    def __init__(self, other):
        self.other = other

    def allreduce_sum(self, array, *, channel):
        assert channel == "payload"
        return array + self.other


def make(params, other):
    torch.manual_seed(0)
    model = build_model("mlp", (5,), 3, 4, 7)
    ctx = Context(
        comm=PlusComm(other),
        model=model,
        device=torch.device("cpu"),
        seed=0,
        num_classes=3,
        expertise=np.array([0, 1]),
        train_x=torch.randn(12, 5),
        train_y=torch.arange(12) % 3,
    )
    return FedDistill(params, ctx), model


def batch(model, x, y):
    features = model.features(x)
    return Batch(x, y, features, model.head(features))


def test_teacher_with_and_without_the_own_contribution():
    c = 2
    own = np.array([1, 2, 0, 0, 1, 0], dtype=np.float32)  # has class 0 only
    total = own + np.array([3, 4, 5, 6, 1, 1], dtype=np.float32)  # another client has both
    logits, has = teacher_logits(total, own, c, exclude_self=False)
    np.testing.assert_allclose(logits, [[2, 3], [5, 6]])
    np.testing.assert_array_equal(has, [True, True])
    logits, has = teacher_logits(total, own, c, exclude_self=True)
    np.testing.assert_allclose(logits, [[3, 4], [5, 6]])
    only_mine = np.array([1, 2, 0, 0, 1, 0], dtype=np.float32)
    _, has = teacher_logits(only_mine, only_mine, c, exclude_self=True)
    np.testing.assert_array_equal(has, [False, False])  # nobody else: no teacher, no term


def test_default_teacher_leaves_this_client_out():
    """Another client's mean logits of class 0 are [3, 4]; this client's own are [1, 2]: by default
    the teacher is [3, 4] (the others' mean), with ``exclude_self: false`` it is [2, 3]."""
    assert FedDistillParams().exclude_self is True
    other = np.array([3, 4, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0], dtype=np.float32)  # 3 classes, class 0 only
    for params, expected in (
        (FedDistillParams(), [3.0, 4.0, 0.0]),
        (FedDistillParams(exclude_self=False), [2.0, 3.0, 0.0]),
    ):
        algorithm, _ = make(params, other)
        algorithm.before_epoch(0)
        algorithm.local.add(torch.tensor([[1.0, 2.0, 0.0]]), torch.tensor([0]))
        algorithm.after_epoch(0)
        torch.testing.assert_close(algorithm.targets[0], torch.softmax(torch.tensor(expected), dim=0))
        np.testing.assert_array_equal(algorithm.has_teacher.numpy(), [True, False, False])


def test_regulariser_is_lambda_soft_target_cross_entropy_where_a_teacher_exists():
    other = np.zeros(3 * 3 + 3, dtype=np.float32)
    other[[0, 1, 2, 3, 4, 5]] = [2.0, -1.0, 0.5, 0.0, 3.0, 1.0]  # teachers for classes 0 and 1
    other[9:] = [1, 1, 0]
    algorithm, model = make(FedDistillParams(lambda_=0.5, exclude_self=True), other)
    x, y = torch.randn(6, 5), torch.tensor([0, 1, 2, 0, 1, 2])
    algorithm.before_epoch(0)
    algorithm.observe_batch(first := batch(model, x, y))
    assert algorithm.extra_loss(first) is None  # round 0: no teacher yet
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
    algorithm.observe_batch(b)
    algorithm.extra_loss(b)
    algorithm.after_epoch(0)
    means, flags = algorithm.local.split(algorithm.sent)
    np.testing.assert_allclose(means[0], b.logits[y == 0].mean(dim=0).detach().numpy(), rtol=1e-6)
    assert not means[1].any() and list(flags) == [1, 0, 1]


def naive_teacher(sums: np.ndarray, seen: np.ndarray, rank: int, exclude_self: bool) -> tuple[np.ndarray, np.ndarray]:
    """Rank ``rank``'s soft targets, recomputed serially from every rank's per-class logit sums
    (ranks, C, C) and counts (ranks, C): the mean of the clients' mean logits (the other clients'
    only when ``exclude_self``), then softmax."""
    ranks, classes, _ = sums.shape
    teacher, has = np.zeros((classes, classes)), np.zeros(classes, dtype=bool)
    for c in range(classes):
        holders = [j for j in range(ranks) if seen[j, c] > 0 and not (exclude_self and j == rank)]
        if holders:
            has[c] = True
            teacher[c] = np.mean([sums[j, c] / seen[j, c] for j in holders], axis=0)
    exp = np.exp(teacher - teacher.max(axis=1, keepdims=True))
    return exp / exp.sum(axis=1, keepdims=True), has


@pytest.mark.parametrize("variant", ["feddistill", "feddistill_include"])
def test_teachers_are_the_serial_recomputation_over_the_other_ranks(baselines, variant):
    ranks, out = baselines
    exclude_self = variant == "feddistill"  # the default
    dumps = rank_dumps(out, variant, ranks)
    c = 2
    for r in range(STATS_ROUNDS):
        # the driver's own sums of the logits of every batch each rank trained on, and their counts
        sums = np.stack([x[f"sums_{r}"] for x in dumps])
        seen = np.stack([x[f"seen_{r}"] for x in dumps])
        np.testing.assert_array_equal(seen, [x["counts"] for x in dumps])  # one epoch: every sample once
        sent = np.stack([x[f"sent_{r}"] for x in dumps])
        assert sent.shape == (ranks, c * (c + 1)) and sent.dtype == np.float32  # 4 C (C + 1) bytes
        means = np.where(seen[:, :, None] > 0, sums / np.maximum(seen, 1)[:, :, None], 0.0)
        np.testing.assert_allclose(sent[:, : c * c], means.reshape(ranks, -1), rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(sent[:, c * c :], seen > 0)
        assert list(sent[0, c * c :]) == [1, 0]  # class 1 absent on rank 0
        for rank, x in enumerate(dumps):
            np.testing.assert_allclose(x[f"received_{r}"], sent.astype(np.float64).sum(axis=0), rtol=1e-5, atol=1e-5)
            targets, has = naive_teacher(sums, seen, rank, exclude_self)
            np.testing.assert_array_equal(x[f"has_{r}"], has)
            np.testing.assert_allclose(x[f"derived_{r}"][has], targets[has], rtol=1e-5, atol=1e-6)
            # the option matters: leaving this rank in (or out) gives measurably different targets
            other, other_has = naive_teacher(sums, seen, rank, not exclude_self)
            both = has & other_has
            assert both.any() and np.abs(other[both] - targets[both]).max() > 1e-4
        if exclude_self and ranks == 2:  # rank 1 is the only client with class 1: no term there
            assert list(dumps[1][f"has_{r}"]) == [True, False]
        else:
            assert all(x[f"has_{r}"].all() for x in dumps)


def test_the_results_file_says_which_teacher_ran(baselines):
    _, out = baselines
    excluded, included = Results(out / "feddistill_quick.h5"), Results(out / "feddistill_include_quick.h5")
    assert excluded.config["algorithm"]["exclude_self"] is True  # the default, written out
    assert included.config["algorithm"]["exclude_self"] is False
    # round 0 trains without a teacher, so both runs agree bit for bit; then the teachers differ
    np.testing.assert_array_equal(excluded.metrics["train_loss"][0], included.metrics["train_loss"][0])
    assert not np.array_equal(excluded.metrics["train_loss"][1:], included.metrics["train_loss"][1:])
