"""eval.every: evaluating every N rounds changes nothing but which rounds hold metrics, and the
report scores evaluated rounds only. The reference is a run that evaluates every round: its
metrics at the rounds both evaluate, and its training at every round, must be the same bits."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from mpicd.report import summarize
from mpicd.results.reader import Results

from conftest import QUICKSTART, is_timing, mpicd_run

ROUNDS, EVERY = 5, 2
EVALUATED = [1, 3, 4]  # 0-based: rounds 2 and 4 (every 2nd) and 5 (the last)
SCORED = (
    "test_acc",
    "balanced_acc",
    "minority_acc",
    "personal_acc",
    "val_acc",
    "val_balanced_acc",
    "val_minority_acc",
    "val_personal_acc",
)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("every")
    common = ("clients=2", f"rounds={ROUNDS}", "data.skew=0.8")
    mpicd_run(2, QUICKSTART, folder / "all.h5", *common)
    sparse = mpicd_run(2, QUICKSTART, folder / "sparse.h5", *common, f"eval.every={EVERY}")
    return Results(folder / "all.h5"), Results(folder / "sparse.h5"), sparse.stdout


def test_skipped_rounds_hold_nan_and_the_rest_is_unchanged(runs):
    every_round, sparse, _ = runs
    skipped = [r for r in range(ROUNDS) if r not in EVALUATED]
    for name, values in sparse.metrics.items():
        if is_timing(name):
            continue
        reference = every_round.metrics[name]
        if name in SCORED or name in ("recall", "val_recall"):
            assert np.isnan(values[skipped]).all(), name
            np.testing.assert_array_equal(values[EVALUATED], reference[EVALUATED], err_msg=name)
        else:  # training, bytes, teachers: evaluation must not have touched them
            np.testing.assert_array_equal(values, reference, err_msg=name)


def test_progress_line_marks_rounds_without_evaluation(runs):
    lines = [line for line in runs[2].splitlines() if line.startswith("round ")]
    assert len(lines) == ROUNDS
    for r, line in enumerate(lines):
        assert ("minority_acc      -" in line) == (r not in EVALUATED), line


def test_report_scores_evaluated_rounds_only(runs):
    every_round, sparse, _ = runs
    reference = {m: every_round.metrics[m].mean(axis=1) for m in ("minority_acc", "val_minority_acc")}
    # --last 2: the last two evaluated rounds are 4 and 5 (indices 3 and 4)
    assert summarize(sparse, last=2).scores["minority_acc"] == pytest.approx(reference["minority_acc"][[3, 4]].mean())
    # --last 3 reaches back over the skipped round 3 to round 2
    expected = reference["minority_acc"][[1, 3, 4]].mean()
    assert summarize(sparse, last=3).scores["minority_acc"] == pytest.approx(expected)
    # best-val: the first maximum of the validation minority accuracy among rounds 2, 4, 5
    val = reference["val_minority_acc"]
    best = max(EVALUATED, key=lambda r: (val[r], -r))
    chosen = summarize(sparse, select="best-val")
    assert chosen.selected_round == best
    assert chosen.scores["minority_acc"] == pytest.approx(reference["minority_acc"][best])


def test_backend_settings_are_recorded(runs):
    backends = yaml.safe_load(runs[1].attrs["backends"])
    assert backends["deterministic_algorithms"] is True
    for key in (
        "cudnn_enabled",
        "cudnn_benchmark",
        "cudnn_deterministic",
        "cudnn_allow_tf32",
        "cuda_matmul_allow_tf32",
    ):
        assert isinstance(backends[key], bool), key
    assert backends["float32_matmul_precision"] in ("highest", "high", "medium")
