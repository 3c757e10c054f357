"""FedLC (Zhang et al., ICML 2022): the calibrated cross-entropy, worked by hand on a two-class,
two-client case, then through a real client's local epoch, and its refusals.

The paper's loss for a sample (x, y) on client i: -log softmax(z - tau n_i^(-1/4))_y, n_ic the client's
images of class c. The expected numbers below are computed from that formula in closed form (counts
chosen as fourth powers: 16^(-1/4) = 1/2, 81^(-1/4) = 1/3), not by calling the code under test.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from mpicd.algorithms import REGISTRY, resolve
from mpicd.algorithms.base import Batch, Context
from mpicd.algorithms.fedlc import calibrated_logits, FedLC
from mpicd.config.loading import load_config
from mpicd.core.schema import ConfigError
from mpicd.models.networks import build_model
from mpicd.run.client import Client
from mpicd.run.plan import prepare

from conftest import QUICKSTART


def fedlc(counts: list[int], tau: float = 1.0) -> FedLC:
    """A FedLC client whose training labels have the given counts (no MPI: the loss needs none)."""
    y = torch.cat([torch.full((n,), c, dtype=torch.long) for c, n in enumerate(counts)])
    model = build_model("mlp", (4,), len(counts), 8, 8)
    ctx = Context(
        comm=None, model=model, device=torch.device("cpu"), seed=0, num_classes=len(counts),
        expertise=np.zeros(2, dtype=np.int64), train_x=torch.zeros(len(y), 4), train_y=y, client=0,
    )  # fmt: skip
    return FedLC(resolve({"name": "fedlc", "tau": tau})[1], ctx)


def loss_and_grad(algorithm: FedLC, logits: list[list[float]], labels: list[int]) -> tuple[float, np.ndarray]:
    z = torch.tensor(logits, dtype=torch.float64, requires_grad=True)
    loss = algorithm.classification_loss(Batch(None, torch.tensor(labels), None, z))
    loss.backward()
    return float(loss.detach()), z.grad.numpy()


def sigmoid(t: float) -> float:
    return 1 / (1 + math.exp(-t))


def test_two_clients_two_classes_by_hand():
    # client A: 16 images of class 0, 1 of class 1: shifts tau (1/2, 1)
    #   logits (2, 0.5), label 1 -> calibrated (1.5, -0.5): loss log(1 + e^2) = 2.1269,
    #   gradient softmax - onehot = (sigmoid(2), sigmoid(-2) - 1) = (0.8808, -0.8808)
    a = fedlc([16, 1])
    loss, grad = loss_and_grad(a, [[2.0, 0.5]], [1])
    assert loss == pytest.approx(math.log(1 + math.exp(2)), rel=1e-12)
    np.testing.assert_allclose(grad, [[sigmoid(2), sigmoid(-2) - 1]], rtol=1e-12)
    # plain cross-entropy would be log(1 + e^1.5) = 1.7014: the rare class's loss is larger
    assert abs(loss - math.log(1 + math.exp(1.5))) > 0.4
    # client B: 1 image of class 0, 81 of class 1: shifts (1, 1/3)
    #   logits (0, 1), label 0 -> calibrated (-1, 2/3): loss log(1 + e^(5/3)) = 1.8397
    b = fedlc([1, 81])
    loss, grad = loss_and_grad(b, [[0.0, 1.0]], [0])
    assert loss == pytest.approx(math.log(1 + math.exp(5 / 3)), rel=1e-12)
    np.testing.assert_allclose(grad, [[sigmoid(-5 / 3) - 1, sigmoid(5 / 3)]], rtol=1e-12)
    # a batch of both rows on client A: the mean of the two per-sample losses
    loss, _ = loss_and_grad(a, [[2.0, 0.5], [0.0, 1.0]], [1, 0])
    # row 2 on A: calibrated (-1/2, 0), label 0: log(1 + e^(1/2))
    assert loss == pytest.approx((math.log(1 + math.exp(2)) + math.log(1 + math.exp(0.5))) / 2, rel=1e-12)


def test_tau_scales_the_shift_and_zero_is_plain_cross_entropy():
    # tau = 2 on A: shifts (1, 2); logits (2, 0.5), label 1 -> calibrated (1, -1.5): log(1 + e^2.5)
    loss, _ = loss_and_grad(fedlc([16, 1], tau=2.0), [[2.0, 0.5]], [1])
    assert loss == pytest.approx(math.log(1 + math.exp(2.5)), rel=1e-12)
    loss, _ = loss_and_grad(fedlc([16, 1], tau=0.0), [[2.0, 0.5]], [1])
    assert loss == pytest.approx(math.log(1 + math.exp(1.5)), rel=1e-12)


def test_a_class_the_client_lacks_has_no_probability_and_no_gradient():
    # 81 of class 0, none of class 1, 16 of class 2 (three classes): class 1's logit is -inf
    c = fedlc([81, 0, 16])
    calibrated = calibrated_logits(torch.tensor([[0.0, 5.0, 0.0]]), c.counts, 1.0)
    assert calibrated[0, 1] == -math.inf
    np.testing.assert_allclose(calibrated[0, [0, 2]].numpy(), [-1 / 3, -1 / 2], rtol=1e-6)
    # label 0: softmax over (-1/3, -1/2) only: loss log(1 + e^(-1/6))
    loss, grad = loss_and_grad(c, [[0.0, 5.0, 0.0]], [0])
    assert loss == pytest.approx(math.log(1 + math.exp(-1 / 6)), rel=1e-12)
    assert grad[0, 1] == 0.0 and np.isfinite(grad).all()
    np.testing.assert_allclose(grad[0, [0, 2]], [sigmoid(1 / 6) - 1, sigmoid(-1 / 6)], rtol=1e-12)


def test_a_clients_local_epoch_trains_on_the_calibrated_loss_of_its_own_counts():
    """The real client: one batch holding its whole split, so the epoch's recorded loss is the loss
    of its one step, computed here by hand in float64 from the model's logits before that step."""
    plan = prepare(load_config(QUICKSTART, ["clients=4", "device=cpu", "algorithm={name: fedlc, tau: 1.5}",
                                            "train.batch_size=100000"]))  # fmt: skip
    c = Client(plan, SimpleNamespace(rank=1, size=4), "cpu")
    own = plan.partition.train_indices[1]
    labels = plan.dataset.train.y[own]
    counts = np.bincount(labels, minlength=2)
    assert counts[0] != counts[1]
    c.model.train()
    with torch.no_grad():
        z = c.model(torch.from_numpy(plan.dataset.train.x[own])).numpy().astype(np.float64)
    calibrated = z - 1.5 * counts.astype(np.float64) ** -0.25
    top = calibrated.max(axis=1, keepdims=True)
    per_sample = top[:, 0] + np.log(np.exp(calibrated - top).sum(axis=1)) - calibrated[np.arange(len(labels)), labels]
    assert c.local_epochs(0).ce == pytest.approx(per_sample.mean(), rel=1e-5)


def test_fedlc_sends_fedavgs_bytes_and_refuses_privacy():
    assert REGISTRY["fedlc"].payloads == REGISTRY["fedavg"].payloads
    with pytest.raises(ConfigError) as err:
        prepare(load_config(QUICKSTART, ["algorithm={name: fedlc}", "privacy={epsilon: 4, noise_multiplier: 1}"]))
    assert err.value.key == "privacy" and "class sizes" in str(err.value)
    with pytest.raises(ConfigError) as err:
        resolve({"name": "fedlc", "tau": -1})
    assert err.value.key == "algorithm.tau"
