"""The study's verdict arithmetic (study/summary.py, mechanism.py, fairness.py) against hand-worked values:
Holm's step-down adjustment, the paired two-sided t-test's p, the paired t-interval, the audit's
verdict-change count, and the CKA-at-round read from a ledger's diag_curves. The scripts carry the
summary page's verdicts, so their arithmetic is tested like the package's."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from conftest import DRIVERS, ROOT

sys.path.insert(0, str(ROOT / "study"))
sys.path.insert(0, str(ROOT / "tests" / "support"))
import proc_identity  # noqa: E402
import fairness  # noqa: E402
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


def scored(seed, minority, balanced=0.5):
    """A ledger line with only what fairness.paired reads."""
    return {
        "seed": seed,
        "views": {"test": {"last10": {"scores": {"minority_acc": minority, "balanced_acc": balanced}}}},
    }


def test_fairness_pairs_over_the_planned_seeds_with_a_t_interval_by_hand():
    a = {s: scored(s, m) for s, m in enumerate((0.5, 0.6, 0.7))}
    b = {s: scored(s, 0.4) for s in range(3)}
    # diffs 0.1, 0.2, 0.3: mean 0.2, sd 0.1, t(0.975, 2) = 4.30265273 -> half 0.43027 / sqrt 3 = 0.24841
    assert fairness.paired(a, b, "minority_acc", [0, 1, 2]) == "+0.200 [-0.048, +0.448]"
    assert fairness.paired(a, b, "balanced_acc", [0, 1, 2]) == "+0.000 [+0.000, +0.000]"
    del b[2]
    assert fairness.paired(a, b, "minority_acc", [0, 1, 2]) == "pending"  # not a pair over the first seeds
    assert fairness.paired(a, b, "minority_acc", []) == "pending"
    assert (
        fairness.mean_of(a, "minority_acc", [0, 1, 2]) == "0.600"
        and fairness.mean_of(b, "minority_acc", [0, 1, 2]) == "pending"
    )


def test_fairness_labels_a_method_without_the_options_it_varies():
    codistill = {
        "config": {
            "algorithm": {"name": "codistill", "lambda": 3.0, "share": "features", "term_mean": "batch"},
            "train": {"optimizer_state": "keep", "loss": "ce"},
        }
    }
    assert fairness.method(codistill) == "codistill (lambda=3, share=features)"
    assert fairness.setting(codistill) == {"optimizer_state": "keep", "term_mean": "batch", "loss": "ce"}
    fedavg = {"config": {"algorithm": {"name": "fedavg"}, "train": {"optimizer_state": "reset", "loss": "ce"}}}
    assert fairness.method(fedavg) == "fedavg"  # no term_mean: its default, so it matches the main grid's runs
    assert fairness.setting(fedavg) == {"optimizer_state": "reset", "term_mean": "matching", "loss": "ce"}


def test_fairness_plans_the_sweeps_cells_and_takes_the_defaults_from_the_main_grid():
    import json

    plan, seeds = fairness.planned("retinamnist")
    # fairness-reset and fairness-balanced: 8 method rows each; fairness-termmean: codistill's 2 readings;
    # and the 8 methods' default cells, which the main grid holds
    assert seeds == [0, 1, 2, 3, 4] and len(plan) == 8 + 8 + 2 + 8
    assert {m for m, s in plan if s[1] == "batch"} == {
        "codistill (lambda=3, share=features)",
        "codistill (lambda=0.3, share=logits)",
    }
    got, _, _ = fairness.cells("retinamnist")
    here = ROOT / "study" / "retinamnist"

    def minority(stage, pattern):  # read by name from the ledger, independently of fairness.py
        rows = [json.loads(x) for x in (here / f"{stage}.runs.jsonl").read_text().splitlines()]
        found = {
            int(r["seed"]): r["views"]["test"]["last10"]["scores"]["minority_acc"] for r in rows if pattern in r["name"]
        }
        return [found[s] for s in range(5)]

    default = minority("main-high", "_algorithm=local_skew=0.8_seed=")
    balanced = minority("fairness-balanced", "loss=balanced_algorithm=local_skew=0.8_seed=")
    assert [
        got[("local", ("keep", "matching", "ce"))][s]["views"]["test"]["last10"]["scores"]["minority_acc"]
        for s in range(5)
    ] == default
    row = next(r for r in fairness.effects("retinamnist") if r.startswith("| local |"))
    assert row.split(" | ")[-2].startswith(f"{np.mean(balanced) - np.mean(default):+.3f} [")  # balanced loss − ce


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
    done = subprocess.run(["bash", "study/retinamnist/run.sh"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "mechanism-control" in done.stderr and "main-high" in done.stderr, done.stderr
    unknown = subprocess.run(
        ["bash", "study/stages.sh", "nosuch", "tune"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert unknown.returncode == 2 and "no dataset folder study/nosuch" in unknown.stderr, unknown.stderr


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


def _skews(*values):
    return dict(zip(summary.SKEWS, values))


def test_stability_takes_the_sample_sd_over_the_six_skews_and_names_the_steadiest():
    flat, ramp = _skews(*[0.6] * 6), _skews(0.1, 0.2, 0.3, 0.4, 0.5, 0.6)
    means = {}
    for method, row in (
        ("codistill", flat),
        ("fedavg", ramp),
        ("fedproto", ramp),
        ("feddistill", ramp),
        ("fedamp", ramp),
    ):
        means.update({(method, s): (v, 5, 0.0) for s, v in row.items()})
    sds, verdict = summary.stability(means)
    # ramp: mean 0.35, squared deviations 0.0625 + 0.0225 + 0.0025 (twice each) = 0.175; / 5 -> 0.035
    assert sds["codistill"] == pytest.approx(0.0) and sds["fedavg"] == pytest.approx(math.sqrt(0.035))
    assert verdict == "**holds**"
    means.update({("codistill", s): (v, 5, 0.0) for s, v in ramp.items()})
    means.update({("fedamp", s): (v, 5, 0.0) for s, v in _skews(0.2, 0.2, 0.2, 0.2, 0.2, 0.3).items()})
    assert summary.stability(means)[1] == "**does not hold**: fedamp's sd is the lowest"
    del means[("fedproto", 0.9)]  # one skew not measured yet
    sds, verdict = summary.stability(means)
    assert verdict == "pending" and sds["fedproto"] is None


def test_bytes_verdict_gives_the_ratios_and_who_sends_less():
    # PneumoniaMNIST, 4 clients, C = 2, D = 200, float32: codistill sends and receives one D-vector (800 B);
    # its logit reading one C-vector (8 B); FedProto a C x D table plus C counts ((400 + 2) * 4 = 1,608 B);
    # FedDistill C x C logits plus C counts ((4 + 2) * 4 = 24 B)
    sent = {"codistill": {800.0}, "codistill (logits)": {8.0}, "fedavg": {178300.0}, "fedproto": {1608.0},
            "feddistill": {24.0}, "fedamp": {448740.0}}  # fmt: skip
    measured, verdict = summary.byte_counts(sent)
    assert measured.startswith("codistill 800, codistill (logits) 8, fedavg 178,300, fedproto 1,608")
    assert verdict == (
        "**holds**: 223x fewer than fedavg, 2x fewer than fedproto, 561x fewer than fedamp; "
        "codistill (logits) and feddistill send less than the feature reading"
    )
    assert summary.byte_counts({"codistill": {800.0}, "fedavg": {178300.0}}) == (
        "codistill 800, fedavg 178,300",
        "pending",
    )
    assert summary.byte_counts({"codistill": {800.0, 1600.0}})[0] == "codistill 800–1,600"  # not one count: both shown


def test_low_data_verdict_needs_wins_against_every_baseline_and_says_who_collapsed():
    means = {("codistill", 50): (0.193, 10, 800.0), ("fedavg", 50): (0.02, 10, 0.0), ("fedproto", 50): (0.0, 10, 0.0),
             ("feddistill", 50): (0.04, 10, 0.0), ("fedamp", 50): (0.03, 10, 0.0)}  # fmt: skip
    win = (np.array([0.15, 0.2]), (0.1, 0.25), False)
    got = {(ref, 50): win for ref in summary.FEDERATED}
    measured, intervals, verdict = summary.low_data(means, got, 50)
    assert measured == "codistill 0.193; fedavg 0.020; fedproto 0.000; feddistill 0.040; fedamp 0.030"
    assert intervals.startswith("fedavg [+0.100, +0.250]; fedproto [+0.100, +0.250]")
    assert verdict == "**holds**; baselines at or below 5%: fedavg, fedproto, feddistill, fedamp"
    means[("fedamp", 50)] = (0.3, 10, 0.0)
    got[("fedamp", 50)] = (np.array([-0.1, 0.1]), (-1.0, 1.0), False)
    assert summary.low_data(means, got, 50)[2] == (
        "**does not hold**: ties against fedamp; baselines at or below 5%: fedavg, fedproto, feddistill"
    )
    del got[("fedavg", 50)]
    assert summary.low_data(means, got, 50)[1:] == ("pending", "pending")


def _as_main_high(tmp_path, monkeypatch, drop: str = "") -> list[str]:
    """Stage p's privacy-off sweep and ledger (a finished stage: 5 methods at skew 0.8, seeds 0-4)
    standing in as PneumoniaMNIST's main-high, less the ledger line of the run named ``drop``."""
    src = ROOT / "study" / "pneumoniamnist"
    lines = [x for x in (src / "privacy-off.runs.jsonl").read_text().splitlines() if not drop or drop not in x]
    (tmp_path / "pneumoniamnist").mkdir()
    (tmp_path / "pneumoniamnist" / "main-high.runs.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "pneumoniamnist" / "main-high.yaml").write_text((src / "privacy-off.yaml").read_text())
    (tmp_path / "pneumoniamnist" / "base.yaml").write_text((src / "base.yaml").read_text())
    monkeypatch.setattr(summary, "HERE", tmp_path)
    return lines


def test_sent_bytes_and_cell_means_read_the_ledgers(tmp_path, monkeypatch):
    lines = _as_main_high(tmp_path, monkeypatch)
    sent = summary.sent_bytes("pneumoniamnist", ("main-low", "main-high"))
    # FedAvg's Allreduce: the 1-channel LeNet's parameters (conv 1->6 5x5, 6->16 5x5, 16->120 3x3,
    # Linear 120->200, head 200->2) and its sample count, float32
    lenet = (1 * 6 * 25 + 6) + (6 * 16 * 25 + 16) + (16 * 120 * 9 + 120) + (120 * 200 + 200) + (200 * 2 + 2)
    expected = {
        "fedavg": 4.0 * (lenet + 1),
        "codistill": 200 * 4.0,
        "fedproto": (2 * 200 + 2) * 4.0,
        "feddistill": 24.0,
    }
    assert sent == {k: {v} for k, v in expected.items()}
    means = summary.cell_means("pneumoniamnist", ("main-high",))
    import json

    fedavg = [json.loads(x)["views"]["test"]["last10"]["scores"]["minority_acc"] for x in lines if "=fedavg_" in x]
    assert len(fedavg) == 5 and means[("fedavg", 0.8)] == (pytest.approx(sum(fedavg) / 5), 5, expected["fedavg"])
    assert summary.cell_means("pneumoniamnist", ("lowdata",)) == {}


def test_a_cell_missing_one_planned_seed_is_pending_everywhere(tmp_path, monkeypatch):
    import json

    lines = _as_main_high(tmp_path, monkeypatch, drop="_algorithm=fedavg_skew=0.8_seed=3")  # FedAvg at 4 of its 5 seeds
    assert len(lines) == 24
    means = summary.cell_means("pneumoniamnist", ("main-high",))
    assert ("fedavg", 0.8) not in means  # not a mean over the first 4 seeds
    local = [json.loads(x)["views"]["test"]["last10"]["scores"]["minority_acc"] for x in lines if "=local_" in x]
    assert means[("local", 0.8)][:2] == (pytest.approx(sum(local) / 5), 5)
    got = summary.pairs("pneumoniamnist", ("main-high",), "features")
    assert ("fedavg", 0.8) not in got and ("local", 0.8) in got  # the pair with a partial cell is pending
    codistill = [
        json.loads(x)["views"]["test"]["last10"]["scores"]["minority_acc"] for x in lines if "=codistill_" in x
    ]
    assert got[("local", 0.8)][0].mean() == pytest.approx((sum(codistill) - sum(local)) / 5)


def test_as_above_and_the_markers():
    rows = ["| a | claim | 1 |", "| b | claim | 2 |", "| c | other | 3 |"]
    assert summary.as_above(rows) == ["| a | claim | 1 |", "| b | as above | 2 |", "| c | other | 3 |"]
    text = "x\n<!-- t: begin (summary.py) -->\nold\n<!-- t: end -->\ny"
    assert summary.between(text, "t", "new") == "x\n<!-- t: begin (summary.py) -->\nnew\n<!-- t: end -->\ny"
    with pytest.raises(ValueError, match="no u markers"):
        summary.between(text, "u", "new")


def test_progress_counts_only_planned_runs_and_each_cpu_model():
    import progress

    entries = [
        {"name": "0000_seed=0", "cpu": ["AMD EPYC"]},
        {"name": "0001_seed=1", "cpu": ["Intel(R) Xeon(R) Processor"]},
        {"name": "0002_seed=2", "cpu": ["AMD EPYC", "Intel(R) Xeon(R) Processor"]},  # resumed on the other
        {"name": "0009_seed=9", "cpu": ["AMD EPYC"]},  # not this sweep's run
        {"name": "0003_seed=3"},  # an entry from before the ledgers carried the CPU
    ]
    held, cpus = progress.tally(["0000_seed=0", "0001_seed=1", "0002_seed=2", "0003_seed=3", "0004_seed=4"], entries)
    assert held == 4
    assert cpus == {
        "AMD EPYC": 1,
        "Intel(R) Xeon(R) Processor": 1,
        "AMD EPYC + Intel(R) Xeon(R) Processor": 1,
        "unknown": 1,
    }


def test_progress_table_covers_every_stage_of_run_sh():
    import progress

    stages = {letter for letter, *_ in progress.STAGES}
    run_sh = (ROOT / "study" / "run.sh").read_text()
    assert stages == {"a1", "p", "a2", "m", "c", "d", "b", "f", "e", "k1", "k2", "k3"}
    assert "a1 p a2 m c d b f e k1 k2 k3" in run_sh
    for _, dataset, sweeps in progress.STAGES:  # every sweep named exists (or k1 writes it), and run.sh runs it
        for sweep in sweeps:
            assert (ROOT / "study" / dataset / f"{sweep}.yaml").is_file() or sweep in progress.LATER, (dataset, sweep)
            assert sweep in run_sh, sweep


def test_progress_table_reads_the_committed_sweeps_and_ledgers(monkeypatch):
    import progress

    monkeypatch.chdir(ROOT)  # as report.sh runs it; the data files themselves are not read
    rows = [r for r in progress.table() if r.startswith("| ") and not r.startswith("| stage")]
    assert len(rows) == sum(len(sweeps) for *_, sweeps in progress.STAGES)
    ledger = ROOT / "study" / "retinamnist" / "mechanism.runs.jsonl"  # a finished stage: 20 runs
    assert len(ledger.read_text().splitlines()) == 20
    assert any(r.startswith("| m | retinamnist | mechanism | 20 / 20 | ") for r in rows), rows
    assert "| a1 | pneumoniamnist | tune | – / 52 | done before the ledgers existed" in "\n".join(rows)


def test_each_dataset_page_gets_its_own_sweeps_with_their_state():
    import progress
    from summary import between

    every = [
        dict(stage="a1", dataset="x", sweep="tune", held=0, planned=52, cpus={}, lost="decided before the ledgers"),
        dict(stage="c", dataset="x", sweep="main-low", held=120, planned=120, cpus={}, lost=None),
        dict(stage="c", dataset="y", sweep="main-low", held=3, planned=120, cpus={}, lost=None),  # another dataset's
        dict(stage="d", dataset="x", sweep="main-high", held=7, planned=240, cpus={}, lost=None),
        dict(stage="b", dataset="x", sweep="lowdata", held=0, planned=240, cpus={}, lost=None),
    ]
    assert progress.dataset_status("x", every)[2:] == [
        "| a1 | tune | – / 52 | decided before the ledgers |",
        "| c | main-low | 120 / 120 | done |",
        "| d | main-high | 7 / 240 | under way |",
        "| b | lowdata | 0 / 240 | not started |",
    ]
    for dataset in {d for _, d, _ in progress.STAGES}:  # every dataset page has the block progress.py rewrites
        page = (ROOT / "study" / dataset / "README.md").read_text()
        between(page, "status", "", "progress.py")


def _next_start() -> dict:
    lines = (ROOT / "study" / "next-start").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))


def test_resume_dry_run_names_the_next_start_and_does_nothing(tmp_path):
    start = _next_start()
    worktree = tmp_path / "study"
    env = {**os.environ, "STUDY_WORKTREE": str(worktree)}
    done = subprocess.run(
        ["bash", "study/resume.sh", "--dry-run"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert f"would run: git worktree add --detach {worktree} {start['commit']}" in done.stdout
    at_commit = subprocess.run(["git", "cat-file", "-e", f"{start['commit']}:study/run.sh"], cwd=ROOT)
    there = "study" if at_commit.returncode == 0 else "docs/results"  # the scripts' folder before the tree moved
    launch = f"export STAGES={start['stages']} && exec nohup setsid nice -n 19 bash {there}/run.sh)"
    assert f"{launch} >> {worktree}/study.log 2>&1 < /dev/null &" in done.stdout
    assert not worktree.exists()
    shallow = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=ROOT, capture_output=True, text=True)
    if shallow.stdout.strip() == "false":  # the commit named is one of this repository's
        subprocess.run(["git", "rev-parse", "--verify", "-q", start["commit"] + "^{commit}"], cwd=ROOT, check=True)


def test_resume_refuses_a_worktree_at_another_commit(tmp_path):
    other = tmp_path / "study"
    other.mkdir()
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(other)]
    subprocess.run([*git, "init", "-q"], check=True, timeout=60)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "other"], check=True, timeout=60)
    env = {**os.environ, "STUDY_WORKTREE": str(other)}
    done = subprocess.run(
        ["bash", "study/resume.sh", "--dry-run"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2 and "but study/next-start names" in done.stderr, done.stderr


def test_tables_sh_regenerates_the_committed_tables_from_the_ledgers(tmp_path):
    """README "Reproduce it elsewhere": from the committed ledgers alone, tables.sh writes back every
    committed table and CSV of a dataset unchanged (run twice: nothing depends on a temporary path or
    on the run). In a copy, so the checkout's files are never touched; no results files there."""
    import filecmp
    import shutil

    here = ROOT / "study"
    copy = tmp_path / "study"
    copy.mkdir(parents=True)
    for name in ("tables.sh", "diagnostics.py"):
        shutil.copy(here / name, copy / name)
    shutil.copytree(here / "retinamnist", copy / "retinamnist")
    (tmp_path / "mpicd").symlink_to(ROOT / "mpicd")
    (tmp_path / ".venv").symlink_to(ROOT / ".venv")
    written = sorted(
        p.name for p in (here / "retinamnist").iterdir() if p.suffix in (".md", ".csv") and p.name != "README.md"
    )  # README.md's status block is progress.py's
    assert "fairness.md" in written and "main-last10.csv" in written
    for attempt in (1, 2):
        for name in written:
            (copy / "retinamnist" / name).write_text("stale\n")  # so an unwritten file shows
        done = subprocess.run(
            ["bash", str(copy / "tables.sh"), "retinamnist"], capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, done.stderr[-2000:]
        changed = [
            n for n in written if not filecmp.cmp(copy / "retinamnist" / n, here / "retinamnist" / n, shallow=False)
        ]
        assert changed == [], (attempt, changed)


def test_run_sh_leads_a_session_of_its_own_and_records_the_proof(tmp_path):
    """run.sh, started from another folder inside a caller's session, makes itself a session leader
    and records pid, start time and session beside the pgid (what pause.sh checks). In a copy of
    the tree, with no stage to run, so the real results/study is never written."""
    (tmp_path / "study").mkdir(parents=True)
    shutil.copy(ROOT / "study" / "run.sh", tmp_path / "study" / "run.sh")
    proc = subprocess.Popen(
        ["bash", "run.sh"],  # relative to study/, not to the root run.sh moves to
        cwd=tmp_path / "study",
        env={**os.environ, "STAGES": "none"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "every requested stage finished" in out, err
    state = tmp_path / "results" / "study"
    leader, start, session = map(int, (state / "study.proof").read_text().split())
    assert int((state / "study.pgid").read_text()) == leader == session == proc.pid  # setsid, no fork
    assert session != os.getsid(0)  # not the caller's session
    assert proc_identity.start_time(os.getpid()) <= start  # field 22: it started after this test


@pytest.mark.skipif(
    os.getuid() != 0 or shutil.which("unshare") is None, reason="the PID-namespace sandbox needs root and unshare"
)
def test_pause_sh_refuses_every_record_it_cannot_prove(tmp_path):
    """study/pause.sh in a PID-namespace sandbox (tests/drivers/pause_forged.py): a record
    whose leader started at another time, is gone, is in another session or is not run.sh, and one
    naming the caller's own group or session, signal nothing (exit 1, the reason said); the genuine
    study is stopped (state T) and continued, and the canary outside it never stops."""
    command = ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, str(DRIVERS / "pause_forged.py")]
    done = subprocess.run([*command, str(tmp_path), "study/run.sh"], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, f"the sandbox failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    reasons = {
        "stale": "started at",
        "own": "own group or session",
        "own_session": "own group or session",
        "gone": "is gone",
        "other_session": "not in the study's session",
        "not_run_sh": "is not run.sh",
    }
    for case, reason in reasons.items():
        got = facts[case]
        assert got["rc"] == 1 and reason in got["err"] and "nothing signalled" in got["err"], (case, got)
        assert not got.get("stopped") and not got.get("canary_stopped"), (case, got)
    assert facts["genuine_stop"]["rc"] == 0 and facts["genuine_stop"]["stopped"], facts["genuine_stop"]
    assert facts["genuine_cont"]["rc"] == 0 and not facts["genuine_cont"]["stopped"], facts["genuine_cont"]
    assert facts["canary_alive"], facts


def _ledger(dataset: str, *stages: str) -> list[dict]:
    here = ROOT / "study" / dataset
    return [json.loads(x) for s in stages for x in (here / f"{s}.runs.jsonl").read_text().splitlines() if x.strip()]


def _minority(rows: list[dict], view: str = "last10", metric: str = "minority_acc") -> dict:
    """(method, skew, seed) -> the test score, read by hand from the ledger lines (codistill by its share)."""
    out = {}
    for r in rows:
        a = r["config"]["algorithm"]
        method = f"codistill-{a.get('share', 'features')}" if a["name"] == "codistill" else a["name"]
        out[(method, r["config"]["data"]["skew"], r["seed"])] = r["views"]["test"][view]["scores"][metric]
    return out


def _paired(scores: dict, ref: str, skew: float):
    """codistill (features) − ref by seed: mean, p (scipy's paired t-test) and the 95% interval."""
    from scipy import stats

    seeds = sorted(s for (m, k, s) in scores if m == ref and k == skew)
    a = [scores[("codistill-features", skew, s)] for s in seeds]
    b = [scores[(ref, skew, s)] for s in seeds]
    test = stats.ttest_rel(a, b)
    ci = test.confidence_interval(0.95)
    return float(np.mean(np.subtract(a, b))), float(test.pvalue), (float(ci.low), float(ci.high))


def _typed(x: float, digits: int = 3) -> str:
    return f"{x:+.{digits}f}".replace("-", "−")


@pytest.fixture(scope="module")
def headline_text():
    import headlines

    return headlines.headline()


def test_headlines_say_what_scipy_computes_from_the_ledger_lines(headline_text):
    """The generated sentences against the primary family recomputed here from the ledgers' JSON with
    scipy and a Holm written out below, not through summary.py: the verdict counts per reference,
    the comparisons won before Holm, the FedAvg gaps, the best-validation reversal, and stage m's
    bit-for-bit count (its runs against the main grid's, compared as stored)."""
    refs = ("fedavg", "fedproto", "feddistill", "fedamp", "local")
    skews = (0.0, 0.2, 0.4, 0.6, 0.8, 0.9)
    family = []
    for dataset in ("retinamnist", "pneumoniamnist"):
        scores = _minority(_ledger(dataset, "main-low", "main-high"))
        family += [(dataset, skew, ref, *_paired(scores, ref, skew)) for skew in skews for ref in refs]
    assert len(family) == 60
    order = sorted(range(60), key=lambda i: family[i][4])
    adjusted, running = {}, 0.0
    for rank, i in enumerate(order):  # Holm's step-down: (m - rank) p, monotone, capped at 1
        running = max(running, min(1.0, (60 - rank) * family[i][4]))
        adjusted[i] = running
    verdict = ["ties" if adjusted[i] >= 0.05 else "wins" if f[3] > 0 else "loses" for i, f in enumerate(family)]
    lost = {}
    for f, v in zip(family, verdict):
        if v == "loses":
            lost.setdefault((f[0], f[2]), []).append(f[1])
    assert lost[("retinamnist", "fedamp")] == [0.0, 0.2, 0.6, 0.8, 0.9]  # the 5 Holm losses to FedAMP
    assert verdict.count("wins") == 0 and verdict.count("loses") == 15
    assert "wins 0, ties 45, loses 15." in headline_text
    assert "FedAMP ties 1, loses 5 (skew 0, 0.2, 0.6, 0.8 and 0.9)" in headline_text
    assert "RetinaMNIST: against FedAvg loses 6; FedProto ties 5, loses 1 (skew 0.9);" in headline_text
    assert "PneumoniaMNIST: against FedAvg ties 3, loses 3 (skew 0.6, 0.8 and 0.9);" in headline_text

    def pair(mean, ci):
        ends = [_typed(x, 4 if round(x, 3) == 0 else 3) for x in ci]
        return f"{_typed(mean)} [{ends[0]}, {ends[1]}]"

    won = [f for f in family if f[5][0] > 0]  # unadjusted: the interval above 0
    assert [(f[0], f[1], f[2]) for f in won] == [
        ("retinamnist", 0.0, "fedproto"),
        ("retinamnist", 0.2, "feddistill"),
        ("retinamnist", 0.4, "feddistill"),
        ("pneumoniamnist", 0.0, "fedamp"),
        ("pneumoniamnist", 0.9, "fedproto"),
        ("pneumoniamnist", 0.9, "feddistill"),
    ]
    assert f"Before Holm co-distillation wins {len(won)} of the 60" in headline_text
    names = {"fedproto": "FedProto", "feddistill": "FedDistill", "fedamp": "FedAMP"}
    for f in won:
        assert f"{names[f[2]]} at {f[1]:g} {pair(f[3], f[5])}" in headline_text, f
    gaps = {(f[0], f[1]): pair(f[3], f[5]) for f in family if f[2] == "fedavg"}
    assert (
        f"RetinaMNIST {gaps[('retinamnist', 0.0)]} at skew 0 and {gaps[('retinamnist', 0.9)]} at 0.9" in headline_text
    )
    assert gaps[("retinamnist", 0.9)] == "−0.578 [−0.605, −0.552]"

    rows = _ledger("pneumoniamnist", "main-low", "main-high")
    low = (0.0, 0.2, 0.4)
    best, last = _minority(rows, "best-val"), _minority(rows)
    reversed_ = [pair(m, ci) for m, _, ci in (_paired(best, "fedavg", s) for s in low)]
    assert reversed_[0].startswith("+0.058 [")
    assert f"on PneumoniaMNIST at skew 0, 0.2 and 0.4 it becomes {', '.join(reversed_)}" in headline_text
    balanced = _minority(rows, "best-val", "balanced_acc")
    at_chosen = [pair(m, ci) for m, _, ci in (_paired(balanced, "fedavg", s) for s in low)]
    assert f"co-distillation − FedAvg at the chosen rounds is {', '.join(at_chosen)}." in headline_text
    gains = [
        _typed(np.mean([best[k] - last[k] for k in best if k[:2] == ("codistill-features", s)])) for s in low
    ]  # what the chosen round adds to co-distillation's own minority accuracy
    chosen = [
        np.median([r["views"]["test"]["best-val"]["selected_round"] + 1 for r in rows
                   if r["config"]["algorithm"]["name"] == "fedavg" and r["config"]["data"]["skew"] == s])
        for s in low
    ]  # fmt: skip
    assert (
        f"FedAvg {', '.join(f'{m:g}' for m in chosen)}) co-distillation's minority accuracy is {', '.join(gains)} "
        in headline_text
    )

    equal = total = 0
    for dataset in ("retinamnist", "pneumoniamnist"):
        main = {
            (r["config"]["algorithm"]["name"], r["config"]["algorithm"].get("lambda"), r["config"]["algorithm"].get("share"),
             r["config"]["data"]["skew"], r["seed"]): r
            for r in _ledger(dataset, "main-low", "main-high")
        }  # fmt: skip
        for r in _ledger(dataset, "mechanism", "mechanism-control"):
            a = r["config"]["algorithm"]
            key = ("local", None, None) if a["lambda"] == 0 else ("codistill", a["lambda"], a.get("share"))
            twin = main[(*key, r["config"]["data"]["skew"], r["seed"])]
            total += 1
            equal += r["views"] == twin["views"] and r["curves"] == twin["curves"]
    assert (equal, total) == (7, 60)
    assert f"{equal} of its {total} runs equal their main-grid twin bit for bit" in headline_text


def test_the_committed_headline_blocks_are_a_fresh_generation(headline_text):
    """Every page holding the headline block holds what headlines.py writes from the committed ledgers
    now: a ledger or an arithmetic change that moves a headline number fails here until report.sh ran."""
    import re

    import headlines

    assert len(headlines.PAGES) == 2
    for page in headlines.PAGES:
        found = re.findall(
            r"<!-- headline: begin \(headlines\.py\) -->\n(.*?)\n<!-- headline: end -->", page.read_text(), flags=re.S
        )
        assert found == [headline_text], page
