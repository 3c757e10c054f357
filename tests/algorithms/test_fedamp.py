"""FedAMP: Allgather of the models, xi rows that sum to 1, a proximal term with a real gradient."""

import numpy as np
import pytest
import torch

from mpicd.algorithms.base import Batch, Context
from mpicd.algorithms.fedamp import (
    FedAMP,
    FedAMPParams,
    cloud_model,
    cosine_weights,
    gaussian_weights,
    squared_distances,
)
from mpicd.algorithms.fedavg import flatten
from mpicd.models.networks import build_model, num_parameters
from mpicd.results.reader import Results

from conftest import rank_dumps
from drivers.driver_settings import STATS_ROUNDS


class GatherComm:
    """Rank 0 of a job whose other ranks hold the models ``others``."""

    rank = 0

    def __init__(self, others):
        self.others, self.size = others, 1 + len(others)

    def allgather(self, array, *, channel):
        assert channel == "payload"
        return np.stack([array, *self.others])


def make(params, others_offsets=(0.01, 0.03)):
    torch.manual_seed(0)
    model = build_model("mlp", (5,), 2, 4, 7)
    mine = flatten(list(model.parameters()))
    others = [
        (mine + np.float32(o) * np.sin(np.arange(len(mine)) + i)).astype(np.float32)
        for i, o in enumerate(others_offsets)
    ]
    ctx = Context(
        comm=GatherComm(others),
        model=model,
        device=torch.device("cpu"),
        seed=0,
        num_classes=2,
        expertise=np.array([0, 1, 0]),
        train_x=torch.randn(8, 5),
        train_y=torch.arange(8) % 2,
    )
    return FedAMP(params, ctx), model


def batch(model):
    x, y = torch.randn(4, 5), torch.tensor([0, 1, 0, 1])
    features = model.features(x)
    return Batch(x, y, features, model.head(features))


def test_xi_rows_sum_to_one_and_stay_non_negative():
    rng = np.random.default_rng(0)
    for n in (2, 4, 6, 64):
        models = rng.normal(size=(n, 50)).astype(np.float32) * rng.uniform(0, 0.05)
        sigma = 1e-3 * 50
        for i in (0, n - 1):
            xi = gaussian_weights(squared_distances(models, i), i, sigma / n, sigma)  # alpha auto
            assert abs(xi.sum() - 1) < 1e-12 and (xi >= 0).all() and xi[i] >= 1 / n - 1e-12
            xi = gaussian_weights(squared_distances(models, i), i, sigma / (n - 1), sigma)  # the limit
            assert abs(xi.sum() - 1) < 1e-12 and xi[i] >= -1e-12
            xi = cosine_weights(models, i, 0.3, 10.0)
            assert abs(xi.sum() - 1) < 1e-12 and xi[i] == 0.3 and (xi >= 0).all()
    same = np.ones((4, 10), dtype=np.float32)
    np.testing.assert_allclose(gaussian_weights(squared_distances(same, 2), 2, 0.25, 1.0), 0.25)  # plain mean
    far = np.stack([np.zeros(10), 100 * np.ones(10)]).astype(np.float32)
    np.testing.assert_allclose(gaussian_weights(squared_distances(far, 0), 0, 0.5, 1.0), [1, 0])  # alone


def test_xi_follows_the_formula():
    d = np.array([0.0, 2.0, 5.0])
    xi = gaussian_weights(d, 0, 0.2, 4.0)
    np.testing.assert_allclose(xi[1:], 0.2 * np.exp(-d[1:] / 4.0) / 4.0)
    assert xi[0] == pytest.approx(1 - xi[1:].sum())
    models = np.array([[1, 0], [0, 1], [1, 1]], dtype=np.float32)
    np.testing.assert_allclose(squared_distances(models, 0), [0, 2, 1])
    np.testing.assert_allclose(cloud_model(models, np.array([0.5, 0.25, 0.25])), [0.75, 0.5])


def test_proximal_term_has_the_real_gradient():
    algorithm, model = make(FedAMPParams(lambda_=0.7))
    assert algorithm.extra_loss(batch(model)) is None  # round 0: no cloud model yet
    algorithm.after_epoch(0)
    with torch.no_grad():  # the epoch moves the live parameters away from u_i
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    loss = algorithm.extra_loss(batch(model))
    assert loss.requires_grad and loss.item() > 0
    model.zero_grad()
    loss.backward()
    p_total = num_parameters(model)
    alpha = FedAMPParams().sigma / 3 * p_total  # auto: sigma / N, per parameter
    assert algorithm.alpha == pytest.approx(alpha)
    for p, u in zip(model.parameters(), algorithm.cloud):
        assert not u.requires_grad
        torch.testing.assert_close(p.grad, 0.7 / alpha * (p.detach() - u))  # d/dw (lambda/2alpha)|w-u|^2
        assert p.grad.abs().sum() > 0
    # the widely copied bug (the term built from detached tensors) gives no gradient at all:
    detached = sum(torch.sum((p.detach() - u) ** 2) for p, u in zip(model.parameters(), algorithm.cloud))
    assert not detached.requires_grad


def test_proximal_term_pulls_the_model_to_the_cloud_model():
    algorithm, model = make(FedAMPParams(lambda_=1.0))
    algorithm.after_epoch(0)
    u = flatten(algorithm.cloud)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2 * algorithm.alpha)
    before = np.square(flatten(list(model.parameters())) - u).sum()
    for _ in range(5):
        optimizer.zero_grad()
        algorithm.proximal().backward()
        optimizer.step()
    assert np.square(flatten(list(model.parameters())) - u).sum() < 0.5 * before


def test_lambda_zero_adds_no_term():
    algorithm, model = make(FedAMPParams(lambda_=0.0))
    algorithm.after_epoch(0)
    assert algorithm.cloud is not None and algorithm.extra_loss(batch(model)) is None


@pytest.mark.parametrize("variant", ["fedamp", "fedamp_cosine"])
def test_each_rank_computes_its_row_of_xi_and_its_cloud_model(baselines, variant):
    ranks, out = baselines
    dumps = rank_dumps(out, variant, ranks)
    params = FedAMPParams()
    for r in range(STATS_ROUNDS):
        models = np.stack([x[f"pre_{r}"] for x in dumps])  # mlp: no buffers, the parameters only
        p = models.shape[1]
        for i, x in enumerate(dumps):
            xi = x[f"xi_{r}"]
            assert xi.shape == (ranks,) and abs(xi.sum() - 1) < 1e-9 and (xi >= 0).all()
            np.testing.assert_array_equal(x[f"post_{r}"], x[f"pre_{r}"])  # models are never replaced
            if variant == "fedamp":
                expected = gaussian_weights(squared_distances(models, i), i, params.sigma / ranks * p, params.sigma * p)
                assert 0 < xi[i] < 1  # non-trivial at the distances the models really reach
            else:
                expected = cosine_weights(models, i, params.self_weight, params.cosine_scale)
                assert xi[i] == params.self_weight
            np.testing.assert_allclose(xi, expected, rtol=1e-9, atol=1e-12)
            np.testing.assert_allclose(x[f"cloud_{r}"], cloud_model(models, xi), rtol=1e-6, atol=1e-7)


def test_lambda_zero_equals_local_training(baselines):
    _, out = baselines
    amp0, local = Results(out / "fedamp_lambda0_quick.h5"), Results(out / "local_quick.h5")
    for name in ("train_loss", "test_acc", "recall", "minority_acc"):
        np.testing.assert_array_equal(amp0.metrics[name], local.metrics[name], err_msg=name)
    assert amp0.metrics["bytes_sent"].sum() > 0 and local.metrics["bytes_sent"].sum() == 0
    amp = Results(out / "fedamp_quick.h5")  # and with the default lambda it is not local training
    assert not np.array_equal(amp.metrics["train_loss"][1:], local.metrics["train_loss"][1:])
