"""mpicd.models.optim against torch.optim itself (the independent reference): same parameters, same state,
bit for bit, step after step; state dicts interchangeable; and a real run never imports torch._dynamo."""

from __future__ import annotations

import copy
import re

import pytest
import torch

from mpicd.config.sections import TrainConfig
from mpicd.models import optim
from mpicd.run.client import make_optimizer

from conftest import DRIVERS, QUICKSTART, mpiexec

CASES = [
    ("adam", {"lr": 1e-3}),
    ("adam", {"lr": 3e-2, "weight_decay": 1e-2}),
    ("adam", {"lr": 1e-3, "betas": (0.8, 0.95), "eps": 1e-6}),
    ("sgd", {"lr": 0.05}),
    ("sgd", {"lr": 0.05, "momentum": 0.9}),
    ("sgd", {"lr": 0.1, "momentum": 0.5, "weight_decay": 5e-4}),
]


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 3)
    )


def _reference(kind: str, params, hyper: dict):
    return (torch.optim.Adam if kind == "adam" else torch.optim.SGD)(params, **hyper)


def _mine(kind: str, params, hyper: dict):
    return (optim.Adam if kind == "adam" else optim.SGD)(params, **hyper)


def _train(model, opt, steps: int, seed: int, skip: int = 0) -> None:
    """``steps`` steps on a random stream from ``seed``, starting at its step ``skip`` (a resume)."""
    gen = torch.Generator().manual_seed(seed)
    for step in range(skip + steps):
        x = torch.randn(5, 1, 8, 8, generator=gen)
        y = torch.randint(0, 3, (5,), generator=gen)
        if step < skip:
            continue
        opt.zero_grad(set_to_none=True)
        model[3].bias.requires_grad_(step % 4 != 3)  # every 4th step one parameter has no gradient
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        model[3].bias.requires_grad_(True)
        opt.step()


def _same(a: torch.nn.Module, b: torch.nn.Module) -> None:
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(p, q), f"{name} differs by {float((p - q).abs().max())}"


@pytest.mark.parametrize("kind,hyper", CASES)
def test_steps_are_bit_identical_to_torch_optim(kind, hyper):
    ref, mine = _model(), _model()
    torch_opt, my_opt = _reference(kind, ref.parameters(), hyper), _mine(kind, mine.parameters(), hyper)
    _train(ref, torch_opt, 25, seed=1)
    _train(mine, my_opt, 25, seed=1)
    _same(ref, mine)
    theirs, ours = torch_opt.state_dict()["state"], my_opt.state_dict()["state"]
    assert theirs.keys() == ours.keys()
    for i in theirs:
        assert theirs[i].keys() == ours[i].keys()
        for key in theirs[i]:
            assert theirs[i][key].dtype == ours[i][key].dtype and torch.equal(theirs[i][key], ours[i][key]), (i, key)


@pytest.mark.parametrize("kind,hyper", [CASES[1], CASES[5]])
def test_state_dicts_cross_over_both_ways(kind, hyper):
    """A checkpoint written by torch.optim resumes in mpicd.models.optim and vice versa, and the run
    continues exactly as one that never stopped."""
    straight = _model()
    opt = _reference(kind, straight.parameters(), hyper)
    _train(straight, opt, 20, seed=2)

    first = _model()
    torch_opt = _reference(kind, first.parameters(), hyper)
    _train(first, torch_opt, 10, seed=2)
    saved = copy.deepcopy((first.state_dict(), torch_opt.state_dict()))
    second = _model(seed=9)
    second.load_state_dict(saved[0])
    my_opt = _mine(kind, second.parameters(), {"lr": 123.0})  # hyper-parameters come from the state
    my_opt.load_state_dict(saved[1])
    _train(second, my_opt, 10, seed=2, skip=10)
    _same(straight, second)

    back = _reference(kind, _model(seed=7).parameters(), hyper)
    back.load_state_dict(copy.deepcopy(my_opt.state_dict()))
    mine_state = my_opt.state_dict()["state"]
    for i, theirs in back.state_dict()["state"].items():
        assert theirs.keys() == mine_state[i].keys()
        for key in theirs:
            assert torch.equal(theirs[key], mine_state[i][key]), (i, key)


def test_loaded_state_is_a_copy():
    """Restoring the last finite state (on_nonfinite: skip) must not let later steps edit the snapshot."""
    model = _model()
    opt = optim.Adam(model.parameters(), lr=1e-2)
    _train(model, opt, 3, seed=3)
    snapshot = copy.deepcopy(opt.state_dict())
    opt.load_state_dict(snapshot)
    kept = copy.deepcopy(snapshot)
    _train(model, opt, 3, seed=4)
    for i in kept["state"]:
        for key in kept["state"][i]:
            assert torch.equal(kept["state"][i][key], snapshot["state"][i][key])


def test_make_optimizer_follows_the_config():
    model = _model()
    adam = make_optimizer(list(model.parameters()), TrainConfig(optimizer="adam", lr=0.01, weight_decay=0.1))
    sgd = make_optimizer(list(model.parameters()), TrainConfig(optimizer="sgd", lr=0.2, momentum=0.3))
    assert isinstance(adam, optim.Adam) and adam.hyper["lr"] == 0.01 and adam.hyper["weight_decay"] == 0.1
    assert isinstance(sgd, optim.SGD) and (sgd.hyper["lr"], sgd.hyper["momentum"]) == (0.2, 0.3)


def test_a_rank_never_imports_dynamo(tmp_path):
    """The start-up saving this module exists for: 2 ranks, 2 rounds of the quick start."""
    result = mpiexec(
        2,
        str(DRIVERS / "modules_after_run.py"),
        "run",
        str(QUICKSTART),
        "clients=2",
        "rounds=2",
        "--out",
        str(tmp_path / "q.h5"),
        timeout=180,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    # searched, not matched per line: mpirun may join one rank's line to the end of another's
    found = re.findall(
        r"modules\[(\d+)\]: (torch\._dynamo=\d torch\._inductor=\d sympy=\d deterministic=\d)", result.stdout
    )
    assert sorted(rank for rank, _ in found) == ["0", "1"], result.stdout
    for rank, flags in found:
        assert flags == "torch._dynamo=0 torch._inductor=0 sympy=0 deterministic=1", (rank, flags)
