"""Two training options, for every method: ``train.optimizer_state: keep | reset`` (a
fresh optimizer at the start of every round's local training) and ``train.loss: ce | balanced``
(cross-entropy weighted by the inverse class frequency of the client's own training split).

Expected values come from elsewhere than the code under test: torch.optim.Adam / SGD built fresh
(an independent implementation of mpicd/models/optim.py's arithmetic), Adam's first-step formula, and the
weighted cross-entropy written out by hand (numbers in the comments; float64 numpy on real clients).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mpicd.config.loading import load_config
from mpicd.config.sections import ADDED_LATER, Config, config_difference, ConfigError, to_mapping, TrainConfig
from mpicd.results.reader import Results
from mpicd.run.client import balanced_weights, batch_bounds, Client, make_optimizer
from mpicd.run.plan import prepare

from conftest import QUICKSTART, is_timing, mpicd_cli, mpicd_run, mpiexec


def client(*overrides: str, rank: int = 0, clients: int = 4) -> Client:
    """Client ``rank`` of the quick start without MPI: local or centralized training sends nothing,
    so a stand-in communicator with a rank and a size is all the code under test touches."""
    plan = prepare(load_config(QUICKSTART, [f"clients={clients}", "device=cpu", *overrides]))
    assert plan.algorithm_cls.name in ("local", "centralized")
    return Client(plan, SimpleNamespace(rank=rank, size=clients), "cpu")


# ------------------------------------------------------------------ the config keys


def test_defaults_validation_and_older_files():
    train = TrainConfig()
    assert (train.optimizer_state, train.loss) == ("keep", "ce")
    for key, bad in (("train.optimizer_state", "fresh"), ("train.loss", "focal"), ("train.loss", 1)):
        with pytest.raises(ConfigError) as err:
            load_config(QUICKSTART, [f"{key}={bad}"])
        assert err.value.key == key, err.value
    # a results file or checkpoint written before these keys existed counts as keep and ce
    assert ADDED_LATER["train.optimizer_state"] == (None, "keep") and ADDED_LATER["train.loss"] == (None, "ce")
    current = {**to_mapping(Config()), "algorithm": {"name": "local"}}
    older = {**current, "train": {k: v for k, v in current["train"].items() if k not in ("optimizer_state", "loss")}}
    assert config_difference(older, current, "the file", "this run") is None
    reset = {**current, "train": {**current["train"], "optimizer_state": "reset"}}
    assert config_difference(older, reset, "the file", "this run") == (
        "train.optimizer_state: the file has 'keep', this run 'reset'"
    )


def test_config_describes_and_check_prints_the_keys():
    described = mpicd_cli("config", "--algorithm", "fedavg")
    assert described.returncode == 0, described.stderr
    lines = {line.split(":")[0].strip(): line for line in described.stdout.splitlines()}
    assert "keep | reset" in lines["optimizer_state"] and "fresh optimizer" in lines["optimizer_state"]
    assert "ce | balanced" in lines["loss"] and "inverse class frequency" in lines["loss"]
    result = mpicd_cli("check", str(QUICKSTART), "train.optimizer_state=reset", "train.loss=balanced")
    assert result.returncode == 0, result.stderr
    assert "  optimizer_state: reset\n" in result.stdout and "  loss: balanced\n" in result.stdout
    wrong = mpicd_cli("check", str(QUICKSTART), "train.optimizer_state=sometimes")
    assert wrong.returncode == 2 and "train.optimizer_state" in wrong.stderr, wrong.stderr


# ------------------------------------------------------------------ train.loss: balanced


def test_balanced_weights_by_hand():
    # 3 of class 0, 1 of class 1, none of class 2: w_c = n / (C n_c) = 4 / (3 * 3), 4 / (3 * 1), 0
    w = balanced_weights(torch.tensor([0, 1, 0, 0]), 3)
    assert w.dtype == torch.float32
    np.testing.assert_allclose(w.numpy(), [4 / 9, 4 / 3, 0.0], rtol=1e-7)


def test_weighted_cross_entropy_of_a_hand_built_batch():
    # training split: 3 of class 0, 1 of class 1 -> w = [4/6, 4/2] = [2/3, 2]
    # batch: logits [2, 0] label 0; [2, -1] label 1; [1, 1] label 0
    #   CE_i = log(1 + e^-2), log(1 + e^3), log 2  (0.1269, 3.0486, 0.6931)
    #   weighted mean = (2/3 CE_1 + 2 CE_2 + 2/3 CE_3) / (2/3 + 2 + 2/3) = 1.9932
    ce = [math.log(1 + math.exp(-2)), math.log(1 + math.exp(3)), math.log(2)]
    weighted_sum = 2 / 3 * ce[0] + 2 * ce[1] + 2 / 3 * ce[2]
    expected = weighted_sum / (2 / 3 + 2 + 2 / 3)
    assert expected == pytest.approx(1.9932, abs=1e-4)
    logits = torch.tensor([[2.0, 0.0], [2.0, -1.0], [1.0, 1.0]])
    y = torch.tensor([0, 1, 0])
    got = float(F.cross_entropy(logits, y, weight=balanced_weights(torch.tensor([0, 0, 0, 1]), 2)))
    assert got == pytest.approx(expected, rel=1e-6)
    # neither the plain mean (1.2895) nor the weighted sum over the batch size (2.2146)
    assert abs(got - sum(ce) / 3) > 0.5 and abs(got - weighted_sum / 3) > 0.1


def hand_weighted_ce(logits: np.ndarray, y: np.ndarray, split_labels: np.ndarray, classes: int) -> float:
    """sum_i w_{y_i} CE_i / sum_i w_{y_i}, w_c = n / (C n_c) over ``split_labels``, in float64."""
    counts = np.bincount(split_labels, minlength=classes).astype(np.float64)
    w = len(split_labels) / (classes * counts)
    z = logits.astype(np.float64)
    top = z.max(axis=1, keepdims=True)
    ce = (top[:, 0] + np.log(np.exp(z - top).sum(axis=1))) - z[np.arange(len(y)), y]
    return float((w[y] * ce).sum() / w[y].sum())


@pytest.mark.parametrize(
    "name, clients, rank",
    [("local", 4, 0), ("local", 4, 1), ("centralized", 3, 1)],  # 3 clients: an imbalanced union
)
def test_a_client_trains_on_the_weighted_cross_entropy_of_its_own_split(name, clients, rank):
    """One batch holding the client's whole split (order does not change a sum): the epoch's
    recorded cross-entropy is the loss of its one step, computed before that step."""
    results = {}
    for loss in ("ce", "balanced"):
        c = client(f"algorithm={name}", f"train.loss={loss}", "train.batch_size=100000", rank=rank, clients=clients)
        plan = c.plan
        train_y = plan.dataset.train.y
        own = (
            np.concatenate(plan.partition.train_indices)
            if name == "centralized"
            else plan.partition.train_indices[rank]
        )
        split_labels = train_y[own]
        assert len(set(np.bincount(split_labels).tolist())) > 1, "the split must be imbalanced"
        c.model.train()
        with torch.no_grad():
            logits = c.model(torch.from_numpy(plan.dataset.train.x[own])).numpy()
        results[loss] = (c.local_epochs(0).ce, logits, split_labels)
    got, logits, labels = results["balanced"]
    assert got == pytest.approx(hand_weighted_ce(logits, labels, labels, 2), rel=1e-5)
    plain, logits, labels = results["ce"]
    uniform = hand_weighted_ce(logits, labels, np.arange(2), 2)  # equal weights: plain cross-entropy
    assert plain == pytest.approx(uniform, rel=1e-5)
    assert abs(got - plain) > 1e-3


# ------------------------------------------------------------------ train.optimizer_state: reset


def record_steps(c: Client) -> list[dict]:
    """Wrap the client's optimizer step: every step's parameters before and after, and gradients."""
    steps, step = [], c.optimizer.step

    def recorded():
        before = [p.detach().clone() for p in c.optimizer.params]
        grads = [None if p.grad is None else p.grad.detach().clone() for p in c.optimizer.params]
        step()
        steps.append({"before": before, "grads": grads, "after": [p.detach().clone() for p in c.optimizer.params]})

    c.optimizer.step = recorded
    return steps


def fresh_torch_step(kind: str, record: dict, **hyper) -> list[torch.Tensor]:
    """What a fresh torch.optim optimizer does from ``record``'s parameters and gradients."""
    params = [torch.nn.Parameter(p.clone()) for p in record["before"]]
    for p, g in zip(params, record["grads"]):
        p.grad = None if g is None else g.clone()
    (torch.optim.Adam if kind == "adam" else torch.optim.SGD)(params, **hyper).step()
    return [p.detach() for p in params]


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.allclose(x, y, rtol=1e-6, atol=1e-9) for x, y in zip(a, b))


@pytest.mark.parametrize("kind", ["adam", "sgd"])
def test_reset_makes_every_rounds_first_step_a_fresh_optimizers(kind):
    lr = 1e-3 if kind == "adam" else 0.05
    hyper = {"lr": lr} if kind == "adam" else {"lr": lr, "momentum": 0.9}
    taken = {}
    for state in ("keep", "reset"):
        c = client(
            "algorithm=local",
            f"train.optimizer={kind}",
            f"train.lr={lr}",
            f"train.optimizer_state={state}",
            "train.batch_size=16",
            "train.local_epochs=2",
        )
        steps = record_steps(c)
        per_epoch = len(batch_bounds(len(c.train_y), 16))
        for r in range(3):
            c.local_epochs(r)
        assert len(steps) == 3 * 2 * per_epoch and per_epoch >= 2
        taken[state] = (steps, per_epoch)
    for state, (steps, per_epoch) in taken.items():
        for r in range(3):
            first = steps[r * 2 * per_epoch]
            fresh = same(first["after"], fresh_torch_step(kind, first, **hyper))
            # round 0 starts fresh either way; later rounds only with reset
            assert fresh == (r == 0 or state == "reset"), (state, r)
            # once per round, not per epoch: the second epoch's first step carries the state on
            second_epoch = steps[r * 2 * per_epoch + per_epoch]
            assert not same(second_epoch["after"], fresh_torch_step(kind, second_epoch, **hyper)), (state, r)
    # by hand: a fresh Adam's first step moves each parameter by lr * g / (|g| + eps), about lr * sign(g);
    # a fresh SGD's (momentum buffer = g) by lr * g
    steps, per_epoch = taken["reset"]
    first = steps[2 * 2 * per_epoch]  # round 2
    for before, grad, after in zip(first["before"], first["grads"], first["after"]):
        want = -lr * grad / (grad.abs() + 1e-8) if kind == "adam" else -lr * grad
        torch.testing.assert_close(after - before, want, rtol=1e-3, atol=2e-7)
        if kind == "adam":
            big = grad.abs() > 1e-4
            assert torch.allclose((after - before)[big].abs(), torch.full_like(grad[big], lr), rtol=1e-2)


def test_reset_state_is_a_fresh_optimizers_state_dict():
    c = client("algorithm=local", "train.optimizer_state=reset")
    c.local_epochs(0)
    assert c.optimizer.state_dict()["state"]  # Adam's moments after a round
    c.optimizer.reset()
    fresh = make_optimizer(list(c.model.parameters()), c.plan.config.train).state_dict()
    assert c.optimizer.state_dict() == fresh and fresh["state"] == {}


# ------------------------------------------------------------------ under mpiexec


def test_both_options_run_the_quick_start(tmp_path):
    out = tmp_path / "run.h5"
    mpicd_run(4, QUICKSTART, out, "rounds=2", "train.optimizer_state=reset", "train.loss=balanced")
    res = Results(out)
    assert res.completed_rounds == 2 and np.isfinite(res.metrics["train_loss"]).all()
    assert res.config["train"]["optimizer_state"] == "reset" and res.config["train"]["loss"] == "balanced"
    assert (res.metrics["bytes_sent"].sum(axis=1) > 0).all()  # co-distillation still exchanged


@pytest.mark.parametrize("algorithm", ["fedavg", "centralized"])
def test_resume_with_reset_and_balanced_equals_an_uninterrupted_run(tmp_path, algorithm):
    options = [
        "clients=2",
        "rounds=3",
        f"algorithm={algorithm}",
        "train.optimizer_state=reset",
        "train.loss=balanced",
    ]
    whole, cut = tmp_path / "whole.h5", tmp_path / "cut.h5"
    mpicd_run(2, QUICKSTART, whole, *options)
    failed = mpiexec(
        2, "-m", "mpicd", "run", str(QUICKSTART), *options, "debug.fail_rank=0", "debug.fail_round=2", "--out", str(cut)
    )
    assert failed.returncode != 0 and Results(cut).completed_rounds == 2, failed.stderr
    mpicd_run(2, QUICKSTART, cut, *options, "--resume")
    a, b = Results(whole), Results(cut)
    assert a.completed_rounds == b.completed_rounds == 3
    for name in a.metrics:
        if not is_timing(name):
            np.testing.assert_array_equal(a.metrics[name], b.metrics[name], err_msg=name)
    np.testing.assert_array_equal(a.bytes_sent_by_kind, b.bytes_sent_by_kind)


@pytest.mark.parametrize("name", ["fedavg", "fedproto", "feddistill"])
def test_files_older_than_reduction_count_as_the_float32_allreduce(name):
    """Results files written before ``algorithm.reduction`` existed (e.g. the study's tuning runs)
    summed with the float32 Allreduce: they match ``reduction: mpi`` and differ from ``exact``."""
    from mpicd.algorithms import resolve

    cls, params = resolve({"name": name})
    current = {**to_mapping(Config()), "algorithm": {"name": name, **to_mapping(params)}}
    assert current["algorithm"]["reduction"] == "mpi"
    older = {**current, "algorithm": {k: v for k, v in current["algorithm"].items() if k != "reduction"}}
    assert config_difference(older, current, "the file", "this run") is None
    exact = {**current, "algorithm": {**current["algorithm"], "reduction": "exact"}}
    assert config_difference(older, exact, "the file", "this run") == (
        "algorithm.reduction: the file has 'mpi', this run 'exact'"
    )
    codistill = {**current, "algorithm": {"name": "codistill"}}
    assert "algorithm.reduction" not in str(config_difference(older, codistill, "the file", "this run"))
