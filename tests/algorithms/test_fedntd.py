"""FedNTD (Lee et al., NeurIPS 2022): the not-true distillation term worked by hand on a three-class
case, against the references' own code (PFLlib's clientntd.py and the authors' NTD_Loss, numbers in
tests/algorithms/data/label_skew_reference_part2.json), and two classes giving FedAvg.

By hand: label 0, student z = (2, 1, 0), teacher g = (0, 0, ln 3). Without the true class the
student's distribution is p = softmax(1, 0) = (e, 1) / (1 + e) and the teacher's q = softmax(0, ln 3)
= (1/4, 3/4), so KL(q || p) = 1/4 ln(q_1 / p_1) + 3/4 ln(q_2 / p_2), and its gradient with respect to
the student's not-true logits is p - q (tau 1); the true class's logit gets none.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mpicd.algorithms.fedntd import not_true, not_true_distillation

from reference_layers import linear

DATA = json.loads((Path(__file__).parent / "data" / "label_skew_reference_part2.json").read_text())
REFS = DATA["references"]


def test_not_true_drops_each_rows_label_column():
    z = torch.tensor([[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]])
    assert not_true(z, torch.tensor([1, 2])).tolist() == [[0.0, 2.0], [3.0, 4.0]]


def test_three_classes_by_hand():
    e = math.e
    p = (e / (1 + e), 1 / (1 + e))
    q = (0.25, 0.75)
    kl = q[0] * math.log(q[0] / p[0]) + q[1] * math.log(q[1] / p[1])  # 0.5010
    z = torch.tensor([[2.0, 1.0, 0.0]], dtype=torch.float64, requires_grad=True)
    g = torch.tensor([[0.0, 0.0, math.log(3)]], dtype=torch.float64)
    term = not_true_distillation(z, g, torch.tensor([0]), tau=1.0)
    term.backward()
    assert float(term.detach()) == pytest.approx(kl, rel=1e-12) and kl == pytest.approx(0.5010, abs=1e-4)
    np.testing.assert_allclose(z.grad.numpy(), [[0.0, p[0] - q[0], p[1] - q[1]]], rtol=1e-12)
    # tau 2: p = softmax(1/2, 0), q = softmax(0, ln 3 / 2); the term is tau^2 KL, its gradient tau (p - q)
    p2 = (1 / (1 + math.exp(-0.5)), 1 / (1 + math.exp(0.5)))
    q2 = (1 / (1 + math.sqrt(3)), math.sqrt(3) / (1 + math.sqrt(3)))
    kl2 = q2[0] * math.log(q2[0] / p2[0]) + q2[1] * math.log(q2[1] / p2[1])
    z = torch.tensor([[2.0, 1.0, 0.0]], dtype=torch.float64, requires_grad=True)
    term = not_true_distillation(z, g, torch.tensor([0]), tau=2.0)
    term.backward()
    assert float(term.detach()) == pytest.approx(4 * kl2, rel=1e-12)
    np.testing.assert_allclose(z.grad.numpy()[0, 1:], [2 * (p2[0] - q2[0]), 2 * (p2[1] - q2[1])], rtol=1e-12)


def test_two_classes_leave_nothing_to_distil():
    z = torch.tensor([[2.0, -1.0], [0.5, 0.3]], dtype=torch.float64, requires_grad=True)
    term = not_true_distillation(
        z, torch.tensor([[9.0, -9.0], [0.0, 4.0]], dtype=torch.float64), torch.tensor([0, 1]), 3.0
    )
    term.backward()
    assert float(term.detach()) == 0.0 and not z.grad.any()


@pytest.mark.parametrize(
    "ref, case",
    [
        pytest.param(r, c, id=f"{r}-{c['case']}-{i}")
        for r in ("pfllib_fedntd", "fedntd_authors")
        for i, c in enumerate(REFS[r]["cases"])
    ],
)
def test_loss_and_gradient_equal_the_references(ref, case):
    """The authors' NTD_Loss was run on PFLlib's inputs of the same case (the file keeps them once)."""
    inputs = REFS["pfllib_fedntd"]["cases"][REFS[ref]["cases"].index(case)]
    assert (inputs["case"], inputs["tau"], inputs["labels"]) == (case["case"], case["tau"], case["labels"])
    z = torch.tensor(inputs["z"], dtype=torch.float64, requires_grad=True)
    g = torch.tensor(inputs["zg"], dtype=torch.float64)
    y = torch.tensor(case["labels"])
    ce = F.cross_entropy(z, y)
    ntd = case["beta"] * not_true_distillation(z, g, y, case["tau"])
    (ce + ntd).backward()
    assert float((ce + ntd).detach()) == pytest.approx(case["loss"], rel=1e-12)
    assert float(ntd.detach()) == pytest.approx(case["ntd"], rel=1e-12, abs=1e-15)
    np.testing.assert_allclose(z.grad.numpy(), case["grad_z"], rtol=1e-10, atol=1e-15)


@pytest.mark.parametrize("case", REFS["pfllib_fedntd"]["rounds"], ids=lambda r: r["case"])
def test_a_clients_round_equals_pfllibs(case):
    """FedNTD's own hooks (the frozen global copy taken in before_epoch, the term of extra_loss on the
    batch's images) on two clients from PFLlib's global model, fixed batches of 4, SGD lr 0.1: every
    batch's cross-entropy and NTD term and each client's model after the round equal PFLlib's."""
    from mpicd.algorithms import resolve
    from mpicd.algorithms.base import Batch, Context
    from mpicd.algorithms.fedntd import FedNTD
    from mpicd.models import optim
    from mpicd.models.networks import FeatureHeadModel

    g = case["global_before"]
    for k, labels in enumerate(case["inputs"]["labels"]):
        model = FeatureHeadModel(
            linear(g["base.weight"], g["base.bias"]), linear(g["head.weight"], g["head.bias"]), 4, 3
        )
        y = torch.tensor(labels)
        x = torch.tensor(case["inputs"]["x"][k], dtype=torch.float64)
        ctx = Context(
            comm=None, model=model, device=torch.device("cpu"), seed=0, num_classes=3,
            expertise=np.zeros(2, dtype=np.int64), train_x=x, train_y=y, client=k,
        )  # fmt: skip
        client = FedNTD(resolve({"name": "fedntd", "tau": case["tau"], "beta": case["beta"]})[1], ctx)
        client.before_epoch(0)
        sgd = optim.SGD(list(model.parameters()), lr=case["lr"])
        ce_seen, ntd_seen = [], []
        for s in range(0, len(y), 4):
            features = model.features(x[s : s + 4])
            batch = Batch(x[s : s + 4], y[s : s + 4], features, model.head(features))
            ce, ntd = client.classification_loss(batch), client.extra_loss(batch)
            sgd.zero_grad(set_to_none=True)
            (ce + ntd).backward()
            sgd.step()
            ce_seen.append(float(ce.detach()))
            ntd_seen.append(float(ntd.detach()))
        theirs = case["clients"][k]
        np.testing.assert_allclose(ce_seen, theirs["batch_ce"], rtol=1e-12)
        np.testing.assert_allclose(ntd_seen, theirs["batch_ntd"], rtol=1e-9, atol=1e-15)
        after = theirs["model_after"]
        for mine, key in ((model.features, "base"), (model.head, "head")):
            np.testing.assert_allclose(mine.weight.detach(), after[f"{key}.weight"], rtol=1e-10, atol=1e-14)
            np.testing.assert_allclose(mine.bias.detach(), after[f"{key}.bias"], rtol=1e-10, atol=1e-14)
        client.before_epoch(1)  # the next round's teacher is the model the client then holds, frozen
        assert all(torch.equal(a, b) for a, b in zip(client.global_model.parameters(), model.parameters()))
        assert not any(p.requires_grad for p in client.global_model.parameters()) and not client.global_model.training
