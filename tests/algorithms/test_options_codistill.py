"""Co-distillation's two readings: ``algorithm.share: features | logits`` (what the
teacher sends and what the student's term compares) and ``algorithm.term_mean: matching | batch``
(the term's sum over the matching samples divided by their number or by the batch size).

The terms and the teacher's means are checked on a tiny hand-built model and batch (every expected
number worked out by hand below, never by the code under test); the bytes under a real mpiexec of
the quick start, against the numbers C = 2 floats of 4 bytes give, and resume with the new options.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from mpicd.algorithms import Batch, Context, resolve
from mpicd.algorithms.codistill import CoDistillation, teacher_assignment
from mpicd.config.sections import ADDED_LATER, Config, config_difference, ConfigError, to_mapping
from mpicd.models.networks import FeatureHeadModel
from mpicd.results.reader import Results

from conftest import QUICKSTART, is_timing, mpicd_cli, mpicd_run, mpiexec

# The tiny model: f(x) = [x1, x2, x1 - x2] (D = 3, no tanh), logits = W_h f + b_h (C = 2) with
# W_h = [[1, 2, 0], [0, -1, 0]], b_h = [0.5, 0]. On the batch X below, by hand:
#   f:      [1, 0, 1]   [0, 1, -1]   [1, 1, 0]   [2, -1, 3]
#   logits: [1.5, 0]    [2.5, -1]    [3.5, -1]   [0.5, 1]
X = [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [2.0, -1.0]]
Y = [0, 1, 1, 0]
FEATURES = [[1, 0, 1], [0, 1, -1], [1, 1, 0], [2, -1, 3]]
LOGITS = [[1.5, 0], [2.5, -1], [3.5, -1], [0.5, 1]]
LAMBDA = 0.5


def tiny_model() -> FeatureHeadModel:
    features = nn.Linear(2, 3, bias=False)
    head = nn.Linear(3, 2)
    with torch.no_grad():
        features.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, -1.0]]))
        head.weight.copy_(torch.tensor([[1.0, 2.0, 0.0], [0.0, -1.0, 0.0]]))
        head.bias.copy_(torch.tensor([0.5, 0.0]))
    return FeatureHeadModel(features, head, feature_dim=3, num_classes=2)


def algorithm(rank: int, **options) -> CoDistillation:
    """Client ``rank`` of 2 (expertise 0, 1) holding the batch X, Y as its training data."""
    _, params = resolve({"name": "codistill", "lambda": LAMBDA, **options})
    model = tiny_model()
    ctx = Context(
        comm=SimpleNamespace(rank=rank, size=2),  # no message is sent by the code under test here
        model=model,
        device=torch.device("cpu"),
        seed=0,
        num_classes=2,
        expertise=np.array([0, 1]),
        train_x=torch.tensor(X),
        train_y=torch.tensor(Y),
    )
    return CoDistillation(params, ctx)


def the_batch(model: FeatureHeadModel) -> Batch:
    x, y = torch.tensor(X), torch.tensor(Y)
    features = model.features(x)
    return Batch(x, y, features, model.head(features))


def test_the_tiny_model_is_what_the_hand_computation_assumes():
    batch = the_batch(tiny_model())
    np.testing.assert_array_equal(batch.features.detach().numpy(), np.array(FEATURES, dtype=np.float32))
    np.testing.assert_array_equal(batch.logits.detach().numpy(), np.array(LOGITS, dtype=np.float32))


# Student rank 0, teacher rank 1 (expertise 1): the matching samples are the 2nd and 3rd (label 1).
#   features, R = [1, 0, 0]:   (0-1)^2 + 1^2 + (-1)^2 = 3  and  0 + 1 + 0 = 1   -> sum 4
#       matching: 0.5 * 4 / (2 samples * 3) = 1/3;   batch: 0.5 * 4 / (4 samples * 3) = 1/6
#   logits, R = [0.5, -0.5]:   (2.5-0.5)^2 + (-0.5)^2 = 4.25  and  3^2 + 0.25 = 9.25  -> sum 13.5
#       matching: 0.5 * 13.5 / (2 * 2) = 1.6875;      batch: 0.5 * 13.5 / (4 * 2) = 0.84375
@pytest.mark.parametrize(
    "share, term_mean, received, expected",
    [
        ("features", "matching", [[1.0, 0.0, 0.0]], 1 / 3),
        ("features", "batch", [[1.0, 0.0, 0.0]], 1 / 6),
        ("logits", "matching", [[0.5, -0.5]], 1.6875),
        ("logits", "batch", [[0.5, -0.5]], 0.84375),
    ],
)
def test_the_term_by_hand(share, term_mean, received, expected):
    alg = algorithm(0, share=share, term_mean=term_mean)
    alg.teachers = np.array([1, 0])
    alg.received = {1: torch.tensor(received)}
    batch = the_batch(alg.ctx.model)
    term = alg.extra_loss(batch)
    assert float(term.detach()) == pytest.approx(expected, rel=1e-6)
    # the term is on the student's own logits (or features): it trains the head only when on logits
    term.backward()
    head_grad = alg.ctx.model.head.weight.grad
    assert (head_grad is not None and bool(head_grad.abs().sum() > 0)) == (share == "logits")


def test_no_matching_sample_no_term_whatever_the_mean():
    for share, width in (("features", 3), ("logits", 2)):
        for term_mean in ("matching", "batch"):
            alg = algorithm(1, share=share, term_mean=term_mean)  # student 1, teacher 0 (expertise 0)
            alg.teachers = np.array([1, 0])
            alg.received = {0: torch.zeros(1, width)}
            batch = the_batch(alg.ctx.model)
            keep = batch.y != 0
            batch = Batch(batch.x[keep], batch.y[keep], batch.features[keep], batch.logits[keep])
            assert alg.extra_loss(batch) is None


def test_classes_all_on_logits_by_hand_and_every_sample_matches():
    # table = [[1, 0], [2, -1]] (the teacher's mean logits of class 0 and 1); per sample:
    #   [1.5, 0]-[1, 0]: 0.25;  [2.5, -1]-[2, -1]: 0.25;  [3.5, -1]-[2, -1]: 2.25;  [0.5, 1]-[1, 0]: 1.25
    # sum 4 over 4 samples x 2 logits: 0.5 * 4 / 8 = 0.25, by either mean (every sample matches)
    for term_mean in ("matching", "batch"):
        alg = algorithm(0, share="logits", classes="all", term_mean=term_mean)
        alg.teachers = np.array([1, 0])
        alg.received = {1: torch.tensor([[1.0, 0.0], [2.0, -1.0]])}
        assert float(alg.extra_loss(the_batch(alg.ctx.model)).detach()) == pytest.approx(0.25, rel=1e-6)


@pytest.mark.parametrize(
    "share, classes, expected",
    [
        # teacher rank 1, expertise 1: its samples 2 and 3
        ("features", "expertise", [[0.5, 1.0, -0.5]]),  # ([0, 1, -1] + [1, 1, 0]) / 2
        ("logits", "expertise", [[3.0, -1.0]]),  # ([2.5, -1] + [3.5, -1]) / 2
        ("logits", "all", [[1.0, 0.5], [3.0, -1.0]]),  # class 0: ([1.5, 0] + [0.5, 1]) / 2
    ],
)
def test_what_the_teacher_shares_by_hand(share, classes, expected):
    alg = algorithm(1, share=share, classes=classes)
    means = alg.class_means(0)
    assert means.dtype == np.float32 and means.shape == np.array(expected).shape
    np.testing.assert_allclose(means, expected, rtol=1e-6)
    assert alg.width == (2 if share == "logits" else 3)


def test_the_options_are_validated_named_and_described():
    for key, bad in (("share", "probabilities"), ("term_mean", "sum")):
        with pytest.raises(ConfigError) as err:
            resolve({"name": "codistill", key: bad})
        assert err.value.key == f"algorithm.{key}", err.value
    _, default = resolve({"name": "codistill"})
    assert (default.share, default.term_mean) == ("features", "matching")
    described = mpicd_cli("config", "--algorithm", "codistill")
    assert described.returncode == 0, described.stderr
    lines = {line.split(":")[0].strip(): line for line in described.stdout.splitlines()}
    assert "features | logits" in lines["share"] and "mean logits" in lines["share"], lines["share"]
    assert "matching | batch" in lines["term_mean"] and "batch size" in lines["term_mean"]
    wrong = mpicd_cli("check", str(QUICKSTART), "algorithm.share=probs")
    assert wrong.returncode == 2 and "algorithm.share" in wrong.stderr, wrong.stderr


def test_older_files_count_as_the_features_and_the_matching_mean():
    assert ADDED_LATER["algorithm.share"] == ("codistill", "features")
    assert ADDED_LATER["algorithm.term_mean"] == ("codistill", "matching")
    current = {**to_mapping(Config()), "algorithm": {"name": "codistill", **to_mapping(CoDistillation.Params())}}
    older = {**current, "algorithm": {k: v for k, v in current["algorithm"].items() if k not in ("share", "term_mean")}}
    assert config_difference(older, current, "the file", "this run") is None
    logits = {**current, "algorithm": {**current["algorithm"], "share": "logits"}}
    assert config_difference(older, logits, "the file", "this run") == (
        "algorithm.share: the file has 'features', this run 'logits'"
    )


def test_check_prints_the_options():
    result = mpicd_cli("check", str(QUICKSTART), "algorithm.share=logits", "algorithm.term_mean=batch")
    assert result.returncode == 0, result.stderr
    assert "  share: logits\n" in result.stdout and "  term_mean: batch\n" in result.stdout


# ------------------------------------------------------------------ under mpiexec

C, N = 2, 4  # the quick start: two classes, four clients


@pytest.mark.parametrize(
    "options, kind, sent_per, recv",
    [
        # per message 4 C = 8 bytes, to each student served; 8 from its teacher
        ("share: logits", "p2p", None, 4 * C),
        ("share: logits, term_mean: batch", "p2p", None, 4 * C),
        ("share: logits, teacher_per: batch", "allgather", 4 * C, 4 * N * C),  # 8 sent, 32 received
        ("share: logits, classes: all", "allgather", 4 * C * C, 4 * N * C * C),  # 16, 64
    ],
)
def test_bytes_per_round_under_mpiexec(tmp_path, options, kind, sent_per, recv):
    out = tmp_path / "run.h5"
    mpicd_run(N, QUICKSTART, out, "rounds=2", f"algorithm={{name: codistill, {options}}}")
    res = Results(out)
    assert res.completed_rounds == 2 and np.isfinite(res.metrics["train_loss"]).all()
    assert res.attrs["feature_dim"] == 200 and res.attrs["num_classes"] == C
    for key_value in options.split(", "):
        key, value = key_value.split(": ")
        assert res.config["algorithm"][key] == value
    k = res.kinds.index(kind)
    for r in range(2):
        if sent_per is None:  # point to point: 8 bytes per student this rank served
            teachers = teacher_assignment(0, r, N)
            np.testing.assert_array_equal(res.teacher[r], teachers)
            want_sent = 4 * C * np.bincount(teachers, minlength=N)
        else:
            want_sent = np.full(N, sent_per)
        np.testing.assert_array_equal(res.metrics["bytes_sent"][r], want_sent)
        np.testing.assert_array_equal(res.metrics["bytes_recv"][r], np.full(N, recv))
        np.testing.assert_array_equal(res.bytes_sent_by_kind[r, :, k], want_sent)
    # the declaration agrees (what the payload table and tests/algorithms/test_payloads.py read)
    cls, params = resolve(res.config["algorithm"])
    from mpicd.algorithms import Sizes

    sizes = Sizes(N=N, C=C, D=200, P=int(res.attrs["num_parameters"]))
    for r in range(2):
        for rank in range(N):
            students = int((res.teacher[r] == rank).sum())
            assert cls.bytes_per_round(sizes, params, students)[kind] == (
                int(res.metrics["bytes_sent"][r, rank]),
                int(res.metrics["bytes_recv"][r, rank]),
            )


def test_term_mean_batch_runs_and_sends_what_features_send(tmp_path):
    out = tmp_path / "run.h5"
    mpicd_run(N, QUICKSTART, out, "rounds=2", "algorithm.term_mean=batch")
    res = Results(out)
    assert res.completed_rounds == 2 and res.config["algorithm"]["term_mean"] == "batch"
    assert (res.metrics["train_extra"] > 0).all()
    for r in range(2):
        want = 4 * 200 * np.bincount(teacher_assignment(0, r, N), minlength=N)
        np.testing.assert_array_equal(res.metrics["bytes_sent"][r], want)


def test_resume_with_the_logits_equals_an_uninterrupted_run(tmp_path):
    options = ["clients=2", "rounds=3", "algorithm={name: codistill, share: logits, term_mean: batch}"]
    whole, cut = tmp_path / "whole.h5", tmp_path / "cut.h5"
    mpicd_run(2, QUICKSTART, whole, *options)
    failed = mpiexec(
        2,
        "-m",
        "mpicd",
        "run",
        str(QUICKSTART),
        *options,
        "debug.fail_rank=1",
        "debug.fail_round=2",
        "--out",
        str(cut),
    )
    assert failed.returncode != 0 and Results(cut).completed_rounds == 2, failed.stderr
    mpicd_run(2, QUICKSTART, cut, *options, "--resume")
    a, b = Results(whole), Results(cut)
    assert a.completed_rounds == b.completed_rounds == 3
    for name in a.metrics:
        if not is_timing(name):
            np.testing.assert_array_equal(a.metrics[name], b.metrics[name], err_msg=name)
    np.testing.assert_array_equal(a.bytes_sent_by_kind, b.bytes_sent_by_kind)
    assert int(a.metrics["bytes_recv"].sum()) == 3 * 2 * 4 * C  # C floats per round per rank
