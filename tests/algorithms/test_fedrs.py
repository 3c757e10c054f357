"""FedRS (Li & Zhan, KDD 2021): the restricted softmax, worked by hand on a two-class, two-client
case, then through a real client's local epoch, and its refusals.

The loss for a sample (x, y): -log softmax(s * z)_y with s_c = 1 for a class the client holds and
alpha for one it lacks (hard, the paper), or s_c = alpha + (1 - alpha) n_c / max n (soft, the
authors' code). The gradient with respect to z_c is s_c (p_c - [c = y]), p the restricted softmax.
The numbers below come from those closed forms, not from the code under test.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from mpicd.algorithms import REGISTRY, resolve
from mpicd.algorithms.base import Batch, Context
from mpicd.algorithms.fedrs import FedRS
from mpicd.config.loading import load_config
from mpicd.core.schema import ConfigError
from mpicd.models.networks import build_model
from mpicd.run.client import Client
from mpicd.run.plan import prepare

from conftest import QUICKSTART


def fedrs(counts: list[int], alpha: float = 0.5, restriction: str = "hard") -> FedRS:
    y = torch.cat([torch.full((n,), c, dtype=torch.long) for c, n in enumerate(counts)])
    ctx = Context(
        comm=None, model=build_model("mlp", (4,), len(counts), 8, 8), device=torch.device("cpu"), seed=0,
        num_classes=len(counts), expertise=np.zeros(2, dtype=np.int64), train_x=torch.zeros(len(y), 4),
        train_y=y, client=0,
    )  # fmt: skip
    return FedRS(resolve({"name": "fedrs", "alpha": alpha, "restriction": restriction})[1], ctx)


def loss_and_grad(algorithm: FedRS, logits: list[float], label: int) -> tuple[float, np.ndarray]:
    z = torch.tensor([logits], dtype=torch.float64, requires_grad=True)
    loss = algorithm.classification_loss(Batch(None, torch.tensor([label]), None, z))
    loss.backward()
    return float(loss.detach()), z.grad.numpy()[0]


def sigmoid(t: float) -> float:
    return 1 / (1 + math.exp(-t))


@pytest.mark.parametrize("restriction", ["hard", "soft"])
def test_a_client_lacking_a_class_by_hand(restriction):
    # client A: 8 of class 0, none of class 1; alpha 0.5: s = (1, 0.5) either way (soft: 0.5 + 0.5 * 0/8)
    # logits (1, 2), label 0 -> restricted (1, 1): loss log 2, gradient (1 (1/2 - 1), 0.5 * 1/2) = (-0.5, 0.25)
    loss, grad = loss_and_grad(fedrs([8, 0], restriction=restriction), [1.0, 2.0], 0)
    assert loss == pytest.approx(math.log(2), rel=1e-12)
    np.testing.assert_allclose(grad, [-0.5, 0.25], rtol=1e-12)
    # the plain cross-entropy pushes the lacking class down twice as hard: gradient (-0.7311, 0.7311)
    assert abs(loss - math.log(1 + math.e)) > 0.6


def test_a_client_holding_both_classes_hard_is_plain_and_soft_is_damped():
    # client B: 2 of class 0, 6 of class 1; logits (3, 0), label 1
    # hard: s = (1, 1), plain cross-entropy log(1 + e^3)
    loss, grad = loss_and_grad(fedrs([2, 6]), [3.0, 0.0], 1)
    assert loss == pytest.approx(math.log(1 + math.exp(3)), rel=1e-12)
    np.testing.assert_allclose(grad, [sigmoid(3), sigmoid(-3) - 1], rtol=1e-12)
    # soft: s = (0.5 + 0.5 * 2/6, 0.5 + 0.5 * 6/6) = (2/3, 1) -> restricted (2, 0): loss log(1 + e^2),
    # gradient (2/3 sigmoid(2), sigmoid(-2) - 1)
    loss, grad = loss_and_grad(fedrs([2, 6], restriction="soft"), [3.0, 0.0], 1)
    assert loss == pytest.approx(math.log(1 + math.exp(2)), rel=1e-12)
    np.testing.assert_allclose(grad, [2 / 3 * sigmoid(2), sigmoid(-2) - 1], rtol=1e-12)


def test_alpha_one_is_plain_cross_entropy_and_alpha_zero_removes_the_lacking_class():
    loss, _ = loss_and_grad(fedrs([8, 0], alpha=1.0), [1.0, 2.0], 0)
    assert loss == pytest.approx(math.log(1 + math.e), rel=1e-12)
    # alpha 0: the lacking class's logit is 0 whatever z_1: loss log(1 + e^(0 - 1)), no gradient on z_1
    loss, grad = loss_and_grad(fedrs([8, 0], alpha=0.0), [1.0, 7.0], 0)
    assert loss == pytest.approx(math.log(1 + math.exp(-1)), rel=1e-12) and grad[1] == 0.0


def test_a_clients_local_epoch_trains_on_the_restricted_softmax_of_its_own_classes():
    """The real client, lacking a class in its split (a Dirichlet partition at alpha 0.05 gives client 0
    none of class 0): its epoch's one-batch loss is the restricted loss, computed here by hand."""
    overrides = ["clients=4", "device=cpu", "algorithm={name: fedrs, alpha: 0.25}", "train.batch_size=100000",
                 "data.partition=dirichlet", "data.skew=0", "data.dirichlet_alpha=0.05"]  # fmt: skip
    plan = prepare(load_config(QUICKSTART, overrides))
    c = Client(plan, SimpleNamespace(rank=0, size=4), "cpu")
    own = plan.partition.train_indices[0]
    labels = plan.dataset.train.y[own]
    held = np.bincount(labels, minlength=2) > 0
    assert held.sum() == 1, "the partition must leave client 0 one class"
    c.model.train()
    with torch.no_grad():
        z = c.model(torch.from_numpy(plan.dataset.train.x[own])).numpy().astype(np.float64)
    restricted = z * np.where(held, 1.0, 0.25)
    top = restricted.max(axis=1, keepdims=True)
    per_sample = top[:, 0] + np.log(np.exp(restricted - top).sum(axis=1)) - restricted[np.arange(len(labels)), labels]
    assert c.local_epochs(0).ce == pytest.approx(per_sample.mean(), rel=1e-5)


def test_fedrs_sends_fedavgs_bytes_and_refuses_privacy_and_bad_alpha():
    assert REGISTRY["fedrs"].payloads == REGISTRY["fedavg"].payloads
    with pytest.raises(ConfigError) as err:
        prepare(load_config(QUICKSTART, ["algorithm={name: fedrs}", "privacy={epsilon: 4, noise_multiplier: 1}"]))
    assert err.value.key == "privacy" and "classes the client holds" in str(err.value)
    for bad in ({"alpha": 1.5}, {"alpha": -0.1}, {"restriction": "softer"}):
        with pytest.raises(ConfigError) as err:
            resolve({"name": "fedrs", **bad})
        assert err.value.key == f"algorithm.{next(iter(bad))}"
