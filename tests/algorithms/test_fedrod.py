"""FedRoD (Chen & Chao, ICLR 2022): the balanced-softmax and personal-head terms worked by hand on a
two-class, two-client case, against PFLlib's clientrod.py on the same inputs (numbers in
tests/algorithms/data/label_skew_reference_part2.json, from tools/label_skew_reference_part2.py), and a
real client's optimizer, checkpoint state and predictions.

By hand (identity features, both heads zero, one sample each, SGD lr 1):
* client A holds counts (1, 3) and trains on x = (1, 0), label 0. Balanced softmax: logits
  (0, 0) + log(1, 3) = (0, ln 3), softmax (1/4, 3/4), loss ln 4, gradient (1/4 - 1, 3/4) = (-3/4, 3/4):
  after the step g's weight is [[3/4, 0], [-3/4, 0]], its bias (3/4, -3/4). Personal head: g + p =
  (0, 0), softmax (1/2, 1/2), loss ln 2, gradient (-1/2, 1/2): p's weight [[1/2, 0], [-1/2, 0]], bias
  (1/2, -1/2); g's step does not see p's term (detached), p's does not see g's.
* client B holds counts (3, 1) and trains on x = (0, 1), label 1: logits (ln 3, 0), softmax (3/4, 1/4),
  loss ln 4, gradient (3/4, -3/4): g's weight [[0, -3/4], [0, 3/4]], bias (-3/4, 3/4).
* both hold 4 images, so FedAvg's average is the plain mean: weight [[3/8, -3/8], [-3/8, 3/8]], bias 0.
  At (1, 0) A's personal head gives p = (1/2 + 1/2, -1/2 - 1/2) = (1, -1), so its personal prediction
  is g + p = (3/8 + 1, -3/8 - 1) = (11/8, -11/8); its generic one is g = (3/8, -3/8).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from mpicd.algorithms import REGISTRY, resolve
from mpicd.algorithms.base import Batch, Context
from mpicd.algorithms.fedrod import FedRoD, balanced_softmax_logits, personal_loss
from mpicd.config.loading import load_config
from mpicd.core.schema import ConfigError
from mpicd.models import optim
from mpicd.models.networks import FeatureHeadModel
from mpicd.run.client import Client
from mpicd.run.plan import prepare

from reference_layers import linear

from conftest import QUICKSTART

REF = json.loads((Path(__file__).parent / "data" / "label_skew_reference_part2.json").read_text())["references"][
    "pfllib_fedrod"
]


def number(value) -> float:
    return float(value)  # "inf" / "-inf" / "nan" are strings in the file


def fedrod(model: FeatureHeadModel, labels: list[int]) -> FedRoD:
    """A FedRoD client with these training labels (no MPI: its training needs none)."""
    y = torch.tensor(labels)
    ctx = Context(
        comm=None, model=model, device=torch.device("cpu"), seed=0, num_classes=model.num_classes,
        expertise=np.zeros(2, dtype=np.int64), train_x=torch.zeros(len(y), 1), train_y=y, client=0,
    )  # fmt: skip
    return FedRoD(resolve({"name": "fedrod"})[1], ctx)


def step(algorithm: FedRoD, optimizer, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """One batch as mpicd.run.client.Client.local_epochs takes it: both terms, one backward, one step."""
    model = algorithm.ctx.model
    features = model.features(x)
    batch = Batch(x, y, features, model.head(features))
    ce, extra = algorithm.classification_loss(batch), algorithm.extra_loss(batch)
    optimizer.zero_grad(set_to_none=True)
    (ce + extra).backward()
    optimizer.step()
    return float(ce.detach()), float(extra.detach())


def test_two_clients_two_classes_by_hand():
    models = [FeatureHeadModel(nn.Identity(), linear([[0, 0], [0, 0]], [0, 0]), 2, 2) for _ in range(2)]
    a, b = fedrod(models[0], [0, 1, 1, 1]), fedrod(models[1], [0, 0, 0, 1])
    for client, x, y in ((a, [[1.0, 0.0]], [0]), (b, [[0.0, 1.0]], [1])):
        sgd = optim.SGD([*client.ctx.model.parameters(), *client.trained_parameters()], lr=1.0)
        ce, extra = step(client, sgd, torch.tensor(x, dtype=torch.float64), torch.tensor(y))
        assert ce == pytest.approx(math.log(4), rel=1e-12)
        assert extra == pytest.approx(math.log(2), rel=1e-12)
    q = 0.75
    np.testing.assert_allclose(a.ctx.model.head.weight.detach(), [[q, 0], [-q, 0]], rtol=1e-12)
    np.testing.assert_allclose(a.ctx.model.head.bias.detach(), [q, -q], rtol=1e-12)
    np.testing.assert_allclose(b.ctx.model.head.weight.detach(), [[0, -q], [0, q]], rtol=1e-12)
    np.testing.assert_allclose(b.ctx.model.head.bias.detach(), [-q, q], rtol=1e-12)
    for client in (a, b):  # the personal heads: ln 2's gradient (-1/2, 1/2), each at its own sample
        np.testing.assert_allclose(client.personal.bias.detach(), [0.5, -0.5] if client is a else [-0.5, 0.5])
    np.testing.assert_allclose(a.personal.weight.detach(), [[0.5, 0], [-0.5, 0]], rtol=1e-12)
    # FedAvg's average of body and generic head (both hold 4 images: the plain mean)
    with torch.no_grad():
        for pa, pb in zip(a.ctx.model.parameters(), b.ctx.model.parameters()):
            pa.copy_((pa + pb) / 2)
    np.testing.assert_allclose(a.ctx.model.head.weight.detach(), [[3 / 8, -3 / 8], [-3 / 8, 3 / 8]], rtol=1e-12)
    x = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    with torch.no_grad():
        np.testing.assert_allclose(a.predict(x), [[11 / 8, -11 / 8]], rtol=1e-12)
        np.testing.assert_allclose(a.predict_generic(x), [[3 / 8, -3 / 8]], rtol=1e-12)


def test_balanced_softmax_and_personal_term_equal_pfllib():
    for case in REF["cases"] + REF["direct_cases"]:
        counts = torch.tensor(case["counts"], dtype=torch.float64)
        g = torch.tensor(case["g"], dtype=torch.float64, requires_grad=True)
        y = torch.tensor(case["labels"])
        loss_g = torch.nn.functional.cross_entropy(balanced_softmax_logits(g, counts), y)
        expected = number(case["loss_g"])
        if math.isinf(expected):  # a label the counts say the client lacks (PFLlib's drop_last counts)
            assert math.isinf(float(loss_g.detach())), case["case"]
            continue
        loss_g.backward()
        assert float(loss_g.detach()) == pytest.approx(expected, rel=1e-12, abs=1e-15), case["case"]
        np.testing.assert_allclose(g.grad.numpy(), case["grad_g"], rtol=1e-10, atol=1e-15, err_msg=case["case"])
        if "p" not in case:
            continue
        # The harness's fixed-output module returns its parameter itself, so PFLlib's out_g.detach() there
        # aliases the tensor its generic step (lr 1) has just moved: their loss_p saw g - grad_g. With a
        # real head out_g is a new tensor and the step leaves it alone (the rounds below check that).
        moved = (g - g.grad).detach().requires_grad_(True)
        p = torch.tensor(case["p"], dtype=torch.float64, requires_grad=True)
        loss_p = personal_loss(moved, p, y)
        loss_p.backward()
        assert float(loss_p.detach()) == pytest.approx(case["loss_p"], rel=1e-12), case["case"]
        np.testing.assert_allclose(p.grad.numpy(), case["grad_p"], rtol=1e-10, atol=1e-15, err_msg=case["case"])
        assert moved.grad is None  # the personal term moves nothing but the personal head


@pytest.mark.parametrize("case", REF["rounds"], ids=[r["case"] for r in REF["rounds"]])
def test_one_round_equals_pfllib(case):
    """Two clients from the same model, each one local epoch of fixed batches of 4 (SGD lr 0.1), then the
    sample-weighted average: every batch loss, both heads, the evaluation logits and the global model."""
    inputs = case["inputs"]
    clients = []
    for k, labels in enumerate(inputs["labels"]):
        model = FeatureHeadModel(
            linear(inputs["base_W0"], inputs["base_b0"]), linear(inputs["head_W0"], inputs["head_b0"]), 4, 3
        )
        client = fedrod(model, labels)
        sgd = optim.SGD([*model.parameters(), *client.trained_parameters()], lr=case["lr"])
        x, y = torch.tensor(inputs["x"][k], dtype=torch.float64), torch.tensor(labels)
        losses = [step(client, sgd, x[s : s + 4], y[s : s + 4]) for s in range(0, len(y), 4)]
        theirs = case["clients"][k]
        np.testing.assert_allclose([g for g, _ in losses], theirs["batch_losses_g"], rtol=1e-12)
        np.testing.assert_allclose([p for _, p in losses], theirs["batch_losses_p"], rtol=1e-12)
        np.testing.assert_allclose(client.counts.numpy(), theirs["sample_per_class"])
        after = theirs["model_after"]
        for mine, key in ((model.features, "base"), (model.head, "head")):
            np.testing.assert_allclose(mine.weight.detach(), after[f"{key}.weight"], rtol=1e-10, atol=1e-14)
            np.testing.assert_allclose(mine.bias.detach(), after[f"{key}.bias"], rtol=1e-10, atol=1e-14)
        personal = theirs["personal_head_after"]
        np.testing.assert_allclose(client.personal.weight.detach(), personal["weight"], rtol=1e-10, atol=1e-14)
        np.testing.assert_allclose(client.personal.bias.detach(), personal["bias"], rtol=1e-10, atol=1e-14)
        with torch.no_grad():
            logits = client.predict(torch.tensor(inputs["test_x"], dtype=torch.float64))
        np.testing.assert_allclose(logits, theirs["eval_logits_test_x"], rtol=1e-10, atol=1e-14)
        clients.append((len(labels), model))
    total = sum(n for n, _ in clients)
    for key in clients[0][1].state_dict():
        name = key.replace("features.", "base.")
        mean = sum(n * m.state_dict()[key].numpy() for n, m in clients) / total
        np.testing.assert_allclose(mean, case["global_after"][name], rtol=1e-10, atol=1e-14)


def test_a_real_client_trains_and_checkpoints_the_personal_head_with_its_optimizer():
    plan = prepare(load_config(QUICKSTART, ["clients=4", "device=cpu", "algorithm=fedrod"]))
    c = Client(plan, SimpleNamespace(rank=1, size=4), "cpu")
    personal = [p.detach().clone() for p in c.algorithm.personal.parameters()]
    head = [p.detach().clone() for p in c.model.head.parameters()]
    assert all(torch.equal(p, h) for p, h in zip(personal, head))  # starts as the common head
    assert len(c.optimizer.params) == len(list(c.model.parameters())) + 2
    loss = c.local_epochs(0)
    assert loss.extra > 0 and math.isfinite(loss.ce)
    moved = [p.detach() for p in c.algorithm.personal.parameters()]
    assert not any(torch.equal(p, q) for p, q in zip(personal, moved))
    state = c.algorithm.state_dict()
    other = Client(plan, SimpleNamespace(rank=1, size=4), "cpu")
    other.algorithm.load_state_dict(state)
    assert all(torch.equal(p, q) for p, q in zip(other.algorithm.personal.parameters(), moved))
    assert type(c.algorithm).shared_at_evaluation is False and type(c.algorithm).scores_generic


def test_fedrod_sends_fedavgs_bytes_and_refuses_privacy():
    assert REGISTRY["fedrod"].payloads == REGISTRY["fedavg"].payloads
    with pytest.raises(ConfigError) as err:
        prepare(load_config(QUICKSTART, ["algorithm={name: fedrod}", "privacy={epsilon: 4, noise_multiplier: 1}"]))
    assert err.value.key == "privacy" and "class sizes" in str(err.value)


def test_on_nonfinite_skip_sees_and_restores_the_personal_head():
    """A NaN in the personal head alone is a non-finite model; skip takes the head back to the round's
    start with the model and the optimizer state (which holds the head's moments)."""
    from mpicd.run.nonfinite import NonFiniteGuard

    plan = prepare(load_config(QUICKSTART, ["clients=4", "device=cpu", "algorithm=fedrod", "on_nonfinite=skip"]))
    c = Client(plan, SimpleNamespace(rank=1, size=4), "cpu")
    c.local_epochs(0)
    guard = NonFiniteGuard("skip", c, SimpleNamespace(where=lambda: "rank 1", round_index=1))
    guard.begin_round()
    start = [p.detach().clone() for p in c.algorithm.personal.parameters()]
    c.local_epochs(1)
    assert not all(torch.equal(p, q) for p, q in zip(start, c.algorithm.personal.parameters()))
    with torch.no_grad():
        c.algorithm.personal.weight[0, 0] = float("nan")
    guard.check_model("after the local epoch")
    assert guard.dropped
    assert all(torch.equal(p, q) for p, q in zip(start, c.algorithm.personal.parameters()))
