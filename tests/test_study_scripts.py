"""The study's verdict arithmetic (docs/results/summary.py, mechanism.py) against hand-worked values:
Holm's step-down adjustment, the paired two-sided t-test's p, the paired t-interval, the audit's
verdict-change count, and the CKA-at-round read from a ledger's diag_curves. The scripts carry the
summary page's verdicts, so their arithmetic is tested like the package's."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "docs" / "results"))
import mechanism  # noqa: E402
import summary  # noqa: E402


def test_holm_step_down_by_hand():
    # sorted: 0.005 x4 = 0.02; 0.01 x3 = 0.03; 0.03 x2 = 0.06; 0.04 x1 = 0.04 -> raised to 0.06 (monotone)
    assert summary.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert summary.holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])  # capped at 1
    assert summary.holm([0.2]) == pytest.approx([0.2])


def test_paired_p_value_by_hand_with_two_degrees_of_freedom():
    # diffs 1, 2, 3: mean 2, sd 1, t = 2 / (1 / sqrt 3) = sqrt 12; for df = 2 the CDF is
    # 1/2 + t / (2 sqrt(t^2 + 2)), so p = 1 - t / sqrt(t^2 + 2) = 1 - sqrt(12 / 14)
    assert summary.pvalue(np.array([1.0, 2.0, 3.0])) == pytest.approx(1 - math.sqrt(12 / 14), rel=1e-9)
    assert summary.pvalue(np.array([0.0, 0.0])) == 1.0  # no difference at all
    assert summary.pvalue(np.array([0.1, 0.1, 0.1])) == 0.0  # a constant nonzero difference


def entry(seed, skew, lam, share, test, train=None, cka=None):
    """A ledger line as mpicd ledger writes it, with only what mechanism.py reads."""
    views = {"test": {"last10": {"scores": {"minority_acc": test}}}}
    if train is not None:
        views["train"] = {"last10": {"scores": {"minority_acc": train}}}
    e = {
        "seed": seed,
        "config": {"data": {"skew": skew}, "algorithm": {"name": "codistill", "lambda": lam, "share": share}},
        "views": views,
        "last10": {"diag/cka_teacher": None if cka is None else cka[-1]},
    }
    if cka is not None:
        e["diag_curves"] = {"cka_teacher": cka}
    return e


def test_mechanism_pairs_by_seed_with_a_t_interval_by_hand():
    runs = {0: entry(0, 0.8, 0.03, "features", 0.5), 1: entry(1, 0.8, 0.03, "features", 0.7)}
    control = {
        0: entry(0, 0.8, 0.0, "features", 0.4),
        1: entry(1, 0.8, 0.0, "features", 0.4),
        2: entry(2, 0.8, 0, "f", 0),
    }
    # diffs 0.1, 0.3 (seed 2 has no partner): mean 0.2, sd 0.1 sqrt 2, t(0.975, 1) = 12.7062047
    half = 12.7062047 * (0.1 * math.sqrt(2)) / math.sqrt(2)
    assert mechanism.paired(runs, control) == f"{0.2:+.3f} [{0.2 - half:+.3f}, {0.2 + half:+.3f}]"
    assert mechanism.paired({0: runs[0]}, control) == "–"  # one pair: no interval
    assert mechanism.paired(runs, control, "train") == "–"  # no training-split audit in these runs


def test_mechanism_reads_cka_at_a_round_and_names_the_control():
    e = entry(0, 0.0, 0.0, "features", 0.5, cka=[0.9, None, 0.5])
    assert mechanism.reading(e) == "control" and mechanism.reading(entry(0, 0, 0.1, "logits", 0.5)) == "logits"
    assert mechanism.at_round(e, 1) == 0.9 and mechanism.at_round(e, 2) is None and mechanism.at_round(e, 10) is None
    assert mechanism.at_round(entry(0, 0, 0.1, "logits", 0.5), 1) is None  # no curves in the entry
    assert mechanism.mean_of([0.2, None, 0.4]) == f"0.30 ± {math.sqrt(0.02):.2f}"


def test_the_audit_counts_the_comparisons_whose_verdict_changes(monkeypatch):
    def fake_pairs(dataset, stages, share, split="test", **_):
        if dataset != "pneumoniamnist" or share != "features":
            return {}
        if split == "test":  # loses to fedavg, ties local
            return {("fedavg", 0.8): (np.array([-0.2, -0.1]), (-0.5, -0.01), False),
                    ("local", 0.8): (np.array([0.0, 0.01]), (-0.05, 0.06), False)}  # fmt: skip
        return {("fedavg", 0.8): (np.array([0.05, 0.06]), (0.01, 0.1), False),
                ("local", 0.8): (np.array([0.0, 0.0]), (-0.01, 0.01), False)}  # fmt: skip

    monkeypatch.setattr(summary, "pairs", fake_pairs)
    text = "\n".join(summary.audit())
    assert (
        "| PneumoniaMNIST (~COVID) | features | 0.8 | fedavg | loses -0.150 (n=2) | wins +0.055 (n=2) | **changes** |"
        in text
    )
    assert "| PneumoniaMNIST (~COVID) | features | 0.8 | local | ties +0.005 (n=2) | ties +0.000 (n=2) | same |" in text
    assert text.endswith("1 of 2 comparisons change their unadjusted verdict when scored on the training images.")


def test_stages_sh_names_the_stages_a_dataset_has():
    done = subprocess.run(
        ["bash", "docs/results/retinamnist/run.sh"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2 and "mechanism-control" in done.stderr and "main-high" in done.stderr, done.stderr
    unknown = subprocess.run(
        ["bash", "docs/results/stages.sh", "nosuch", "tune"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert unknown.returncode == 2 and "no dataset folder docs/results/nosuch" in unknown.stderr, unknown.stderr


def test_diagnostics_labels_say_the_skew_where_cells_differ_in_it():
    import diagnostics

    from mpicd.report.runs import Cell, distinguishing

    cells = [
        Cell.of({"algorithm": {"name": "codistill", "lambda": lam}, "data": {"skew": skew}})
        for lam, skew in ((0.0, 0.0), (0.0, 0.8), (3.0, 0.8))
    ]
    keys = distinguishing(cells)
    assert [diagnostics.label(c, keys) for c in cells] == [
        "codistill (lambda=0), skew=0",
        "codistill (lambda=0), skew=0.8",
        "codistill (lambda=3), skew=0.8",
    ]
