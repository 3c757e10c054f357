"""``eval.diagnostics``: the mechanism measured per round and client (/diag), changing nothing trained.

Unit tests on hand-computed values (linear CKA, r_distance, the gradient share), then under a real
mpiexec the quickstart with the key on and off. Under mpiexec this file is also the driver
(``__main__`` below): ``mpicd run`` in-process, saving each rank's model after every round's training.
"""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from conftest import DRIVERS, QUICKSTART, is_timing, mpiexec

from mpicd.evaluation import diagnostics
from mpicd.evaluation.diagnostics import GradShare, linear_cka, relative_distance

ROUNDS = 3
DIAG = ("diag/term_grad_share", "diag/r_distance", "diag/cka_teacher")


# --- linear CKA --------------------------------------------------------------------------------


def test_cka_of_hand_computed_matrices():
    # 1-D: CKA is the squared correlation. x = (1, 2, 3), y = (1, 0, 2): centred (-1, 0, 1) and
    # (0, -1, 1), y.x = 1, |x|^2 = |y|^2 = 2: 1^2 / (2 * 2) = 1/4 (uncentred it would be 49/70).
    assert linear_cka([[1], [2], [3]], [[1], [0], [2]]) == pytest.approx(0.25, abs=1e-12)
    # X's columns centred and orthogonal: X^T X = 4 I (norm 4 sqrt 2); Y = (1, 1, -1, -1): Y^T Y = 4,
    # Y^T X = (4, 0): 16 / (4 sqrt 2 * 4) = 1 / sqrt 2.
    x = np.array([[1, 1], [1, -1], [-1, 1], [-1, -1]], dtype=float)
    y = np.array([[1], [1], [-1], [-1]], dtype=float)
    assert linear_cka(x, y) == pytest.approx(1 / math.sqrt(2), abs=1e-12)
    assert linear_cka(y, x) == pytest.approx(1 / math.sqrt(2), abs=1e-12)  # symmetric
    assert linear_cka(x + 5.0, 3.0 * y - 2.0) == pytest.approx(1 / math.sqrt(2), abs=1e-12)  # centring, scale
    assert math.isnan(linear_cka(np.ones((4, 2)), y))  # a constant representation: undefined


def test_cka_is_one_under_rotation_and_near_zero_for_independent_noise():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(1000, 8)) + 3.0
    q, _ = np.linalg.qr(rng.normal(size=(8, 8)))
    assert linear_cka(x, x @ q) == pytest.approx(1.0, abs=1e-10)
    assert linear_cka(x, 2.5 * x @ q + 7.0) == pytest.approx(1.0, abs=1e-10)
    # Independent noise: E[CKA] ~ sqrt(p q) / n = 8 / 1000.
    noise = rng.normal(size=(1000, 8))
    assert 0.0 <= linear_cka(x, noise) < 0.03


# --- r_distance ----------------------------------------------------------------------------------


class Tiny(torch.nn.Module):
    """features(x) = dropout(x) W^T with W = diag(1, 2): in eval mode exactly x W^T."""

    num_classes, feature_dim = 2, 2

    def __init__(self):
        super().__init__()
        linear = torch.nn.Linear(2, 2, bias=False)
        with torch.no_grad():
            linear.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 2.0]]))
        self.features = torch.nn.Sequential(torch.nn.Dropout(0.5), linear)
        self.head = torch.nn.Linear(2, 2)

    def forward(self, x):
        return self.head(self.features(x))


def _codistill_student(classes: str, received: torch.Tensor):
    """Rank 0 of 2 with teacher 1 (expertise 1) that received ``received``, as a client's view."""
    from mpicd.algorithms import Context
    from mpicd.algorithms.codistill import CoDistillation, CoDistillParams

    model = Tiny()
    x = torch.tensor([[1.0, 0.0], [3.0, 0.0], [0.0, 5.0], [2.0, 2.0]])
    y = torch.tensor([1, 1, 0, 0])
    ctx = Context(
        comm=SimpleNamespace(rank=0, size=2),
        model=model,
        device=torch.device("cpu"),
        seed=0,
        num_classes=2,
        expertise=np.array([0, 1]),
        train_x=x,
        train_y=y,
    )
    algorithm = CoDistillation(CoDistillParams(classes=classes), ctx)
    algorithm.teachers = np.array([1, 0])
    algorithm.received = {1: received}
    model.train()
    return SimpleNamespace(algorithm=algorithm, model=model, train_x=x, train_y=y)


def test_r_distance_hand_computed():
    from mpicd.run.client import Client

    # Eval-mode features: (1, 0), (3, 0) for class 1, (0, 10), (2, 4) for class 0. The teacher's
    # class is 1: m = (2, 0); R = (2, 3): ||m - R|| / ||R|| = 3 / sqrt 13.
    student = _codistill_student("expertise", torch.tensor([[2.0, 3.0]]))
    assert Client._distance_to_reference(student) == pytest.approx(3 / math.sqrt(13), abs=1e-6)
    assert student.model.training  # its mode is restored
    # classes: all: M = [[1, 7], [2, 0]] (class 0, class 1) against R = [[1, 7], [2, 3]]: 3 / sqrt 63.
    student = _codistill_student("all", torch.tensor([[1.0, 7.0], [2.0, 3.0]]))
    assert Client._distance_to_reference(student) == pytest.approx(3 / math.sqrt(63), abs=1e-6)
    student.algorithm.received = {}  # nothing received (dropped teacher, one client): NaN
    assert math.isnan(Client._distance_to_reference(student))
    assert relative_distance([0.0, 4.0], [3.0, 0.0]) == pytest.approx(5 / 3)


# --- the gradient share -------------------------------------------------------------------------


def test_grad_share_hand_computed_and_leaves_the_gradient_alone():
    w = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    share = GradShare([w])
    ce, term = 3.0 * w[0], w[1] ** 2  # gradients (3, 0) and (0, 4): 4 / (3 + 4)
    share.add(ce, term)
    assert w.grad is None  # nothing accumulated
    (ce + term).backward()
    assert torch.equal(w.grad, torch.tensor([3.0, 4.0]))
    share.add(2.0 * w.sum(), None)  # a batch without the term counts 0
    assert share.value() == pytest.approx((4 / 7 + 0) / 2, abs=1e-12)
    nothing = GradShare([w])
    nothing.add(w.sum(), None)
    assert math.isnan(nothing.value())  # no batch of the round had the term


def test_grad_share_does_not_change_the_optimizer_step_bit_for_bit():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))
    x, y = torch.randn(16, 5), torch.randint(0, 3, (16,))

    def grads(diagnose: bool):
        model.zero_grad(set_to_none=True)
        features = model[:2](x)
        ce = torch.nn.functional.cross_entropy(model[2](features), y)
        term = 0.3 * features.pow(2).mean()
        if diagnose:
            GradShare(model.parameters()).add(ce, term)
        (ce + term).backward()
        return [p.grad.clone() for p in model.parameters()]

    for a, b in zip(grads(False), grads(True)):
        assert torch.equal(a, b)


# --- under mpiexec: the quickstart with and without diagnostics ---------------------------------


def _driven(folder: Path, name: str, ranks: int, *overrides: str) -> Path:
    out = folder / name
    out.mkdir()
    args = (str(QUICKSTART), f"clients={ranks}", f"rounds={ROUNDS}", "checkpoint.every=0", *overrides)
    result = mpiexec(ranks, str(DRIVERS / "models_per_round.py"), str(out), *args, timeout=300)
    assert result.returncode == 0, f"driver failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("diagnostics")
    return {
        "off": _driven(folder, "off", 4),
        "on": _driven(folder, "on", 4, "eval.diagnostics=true"),
        "fedproto": _driven(folder, "fedproto", 2, "eval.diagnostics=true", "algorithm={name: fedproto}"),
    }


def _datasets(f) -> list[str]:
    import h5py

    names: list[str] = []
    f.visititems(lambda n, obj: names.append(n) if isinstance(obj, h5py.Dataset) else None)
    return names


def test_diagnostics_are_finite_where_defined(runs):
    import h5py

    with h5py.File(runs["on"] / "run.h5", "r") as f:
        grad, distance, cka = (f[name][()] for name in DIAG)
    assert grad.shape == distance.shape == cka.shape == (ROUNDS, 4)
    assert np.isfinite(grad).all() and ((grad > 0) & (grad < 1)).all()  # every client has a teacher and an R
    assert np.isfinite(distance).all() and (distance > 0).all()
    assert np.isfinite(cka).all() and ((cka > 0) & (cka <= 1 + 1e-9)).all()
    with h5py.File(runs["off"] / "run.h5", "r") as f:
        for name in DIAG:
            assert np.isnan(f[name][()]).all(), name
    with h5py.File(runs["fedproto"] / "run.h5", "r") as f:
        grad = f["diag/term_grad_share"][()]
        assert np.isnan(grad[0]).all()  # no prototypes yet in round 1: no term
        assert np.isfinite(grad[1:]).all() and ((grad[1:] > 0) & (grad[1:] < 1)).all()
        assert np.isnan(f["diag/r_distance"][()]).all() and np.isnan(f["diag/cka_teacher"][()]).all()
        assert (f["comm/outside_rounds"][()] >= 0).all()


def test_on_changes_nothing_else_bit_for_bit(runs):
    import h5py

    off, on = runs["off"], runs["on"]
    with h5py.File(off / "run.h5", "r") as a, h5py.File(on / "run.h5", "r") as b:
        assert _datasets(b) == _datasets(a)
        compared = 0
        for n in _datasets(a):
            if n in DIAG or is_timing(n) or n in ("comm/outside_rounds", "comm/channel_bytes"):  # the next test
                continue
            np.testing.assert_array_equal(a[n][()], b[n][()], err_msg=n)
            compared += 1
        assert compared > 20
        assert a.attrs["config_hash"] == b.attrs["config_hash"]  # eval is operational: the same run identity
    for r in range(ROUNDS):  # and the models themselves, every round and rank
        for rank in range(4):
            sa, sb = (torch.load(d / f"model_r{r}_rank{rank}.pt") for d in (off, on))
            for key in sa:
                assert torch.equal(sa[key], sb[key]), (r, rank, key)


def test_probe_features_travel_outside_rounds_exactly(runs):
    import h5py

    from mpicd.results.verify import verify

    for name in runs:
        assert verify(runs[name] / "run.h5").ok, verify(runs[name] / "run.h5").text()
    with h5py.File(runs["off"] / "run.h5", "r") as a, h5py.File(runs["on"] / "run.h5", "r") as b:
        grown = b["comm/outside_rounds"][()] - a["comm/outside_rounds"][()]
        diagnostics_channel = [n.decode() for n in b["comm/channel"][()]].index("diagnostics")
        carried = b["comm/channel_bytes"][:, diagnostics_channel], a["comm/channel_bytes"][:, diagnostics_channel]
        teacher = b["comm/teacher"][()]
        feature_dim = int(b.attrs["feature_dim"])
        assert "(57 cases)" in b.attrs["val_split"]  # the quickstart's validation split: fewer than 64
    pair = 57 * 200 * 4  # probe images x D x float32, per teacher-student pair and round
    assert pair == min(diagnostics.PROBE_IMAGES, 57) * feature_dim * 4 == 45600
    for client in range(4):
        students = int((teacher == client).sum())  # over the 3 rounds
        assert grown[client].tolist() == [students * pair, ROUNDS * pair], client
        assert carried[0][client].tolist() == [students * pair, ROUNDS * pair] and carried[1][client].tolist() == [0, 0]
