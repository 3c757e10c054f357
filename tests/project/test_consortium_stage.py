"""The consortium stage's choices (study/consortium.py) on tuning ledgers whose scores the test sets:
each row's parameter is the argmax of its mean validation score over the two tuning seeds, the moonshot
is the best candidate of at most 1 KB, a choice at a grid's edge is said, the study's sweep files run
what was chosen (and only the moonshot that consortium-sampler lacks gets a file of its own), and an
unfinished tuning is refused. The expected values are written out here, not computed by the script."""

from __future__ import annotations

import json
import shutil
import sys

import pytest
import yaml

from conftest import ROOT

sys.path.insert(0, str(ROOT / "study"))
import consortium  # noqa: E402

from mpicd.sweep.grid import load_sweep  # noqa: E402

DATASET = "retinamnist"  # chosen.yaml: features lambda 3.0, logits lambda 0.3


def score(overrides: dict, seed: int, table: dict) -> float:
    """The validation score the test gives a run: table[(sweep option, algorithm entry)] +- 0.01 by seed."""
    entry = yaml.safe_load(overrides["algorithm"])
    option = overrides.get("train.sampler") and "sampler" or overrides.get("train.loss") and "loss" or "-"
    key = (
        option,
        entry["name"] + ("-logits" if entry.get("share") == "logits" else ""),
        entry.get("tau", 0) or entry.get("alpha", 0) or entry.get("calibration_lr", 0),
    )
    return table[key] + (0.01 if seed == 100 else -0.01)


TABLE = {  # (option, method, parameter) -> mean validation score
    ("-", "fedlc", 0.3): 0.60,
    ("-", "fedlc", 1.0): 0.64,
    ("-", "fedlc", 3.0): 0.62,
    ("-", "fedlc", 10.0): 0.61,
    ("-", "fedrs", 0.1): 0.70,
    ("-", "fedrs", 0.5): 0.65,
    ("-", "fedrs", 0.9): 0.66,
    ("-", "fedlc", 30.0): 0.59,  # the values appended at the first pass's edges
    ("-", "fedrs", 0.0): 0.72,
    ("-", "ccvr", 0.01): 0.50,
    ("-", "ccvr", 0.1): 0.55,
    ("-", "ccvr", 1.0): 0.52,
    ("sampler", "fedlc", 0.3): 0.61,
    ("sampler", "fedlc", 1.0): 0.60,
    ("sampler", "fedlc", 3.0): 0.63,
    ("sampler", "fedlc", 10.0): 0.62,
    ("sampler", "fedlc", 30.0): 0.625,
    ("sampler", "codistill-logits", 0): 0.68,
    ("sampler", "local", 0): 0.67,
    ("loss", "codistill-logits", 0): 0.69,
    ("loss", "codistill", 0): 0.71,
    ("loss", "local", 0): 0.70,
}


@pytest.fixture
def stage(tmp_path, monkeypatch):
    """A copy of the dataset's base and chosen configs; consortium.py writes its tuning files there."""
    (tmp_path / DATASET).mkdir()
    for name in ("base.yaml", "chosen.yaml"):
        shutil.copy(ROOT / "study" / DATASET / name, tmp_path / DATASET / name)
    monkeypatch.setattr(consortium, "HERE", tmp_path)
    monkeypatch.chdir(ROOT)
    consortium.write_tuning(DATASET)
    return tmp_path


def ledgers(folder, table: dict, skip: str | None = None) -> None:
    template = json.loads((ROOT / "study" / DATASET / "main-high.runs.jsonl").read_text().splitlines()[0])
    for name in consortium.tuning_files(DATASET):
        runs = load_sweep(folder / DATASET / name)
        lines = []
        for run in runs:
            if run.output.stem == skip:
                continue
            overrides = dict(o.split("=", 1) for o in run.overrides)
            value = score(overrides, int(overrides["seed"]), table)
            lines.append(
                json.dumps({**template, "name": run.output.stem, "last10": {"metrics/val_balanced_acc": value}})
            )
        runs[0].ledger.write_text("\n".join(lines) + "\n")


def test_the_tuning_files_plan_every_setting_twice_at_skew_08(stage):
    planned = {name: load_sweep(stage / DATASET / name) for name in consortium.tuning_files(DATASET)}
    assert {name: len(runs) for name, runs in planned.items()} == {
        "consortium-tune.yaml": 24,  # 4 tau + 3 alpha + 3 lr + tau 30 + alpha 0, 2 seeds
        "consortium-tune-sampler.yaml": 14,  # 4 tau + logits + local + tau 30
        "consortium-tune-loss.yaml": 6,  # logits + features + local
    }
    for runs in planned.values():
        for run in runs:
            overrides = dict(o.split("=", 1) for o in run.overrides)
            assert overrides["data.skew"] == "0.8" and overrides["seed"] in ("100", "101")
            assert overrides["clients_per_rank"] == "balanced" and overrides["eval.diagnostics"] == "false"


def test_choices_are_the_best_mean_validation_scores_and_the_moonshot_the_best_candidate(stage):
    ledgers(stage, TABLE)
    chosen = consortium.choose(DATASET)
    assert chosen["algorithm"]["fedlc"] == {"name": "fedlc", "tau": 1.0}
    assert chosen["algorithm"]["fedlc+sampler-balanced"] == {"name": "fedlc", "tau": 3.0}
    assert chosen["algorithm"]["fedrs"] == {"name": "fedrs", "alpha": 0.0}
    assert chosen["algorithm"]["ccvr"] == {"name": "ccvr", "calibration_lr": 0.1}
    assert chosen["scores"]["fedlc"]["{name: fedlc, tau: 1.0}"] == 0.64  # the mean of 0.65 and 0.63
    assert chosen["moonshot"]["pick"] == "codistill+loss-balanced"  # 0.71, the feature reading at lambda 3
    assert chosen["at_grid_edge"] == {"fedrs": {"alpha": 0.0}}  # the appended value, at the new edge
    files = consortium.study_files(DATASET, chosen)
    assert set(files) == {
        "consortium.yaml",
        "consortium-sampler.yaml",
        "consortium-references.yaml",
        "consortium-moonshot.yaml",
    }
    for name, text in files.items():
        (stage / DATASET / name).write_text(text)
    runs = {name: load_sweep(stage / DATASET / name) for name in files}
    assert {n: len(r) for n, r in runs.items()} == {
        "consortium.yaml": 80,
        "consortium-sampler.yaml": 80,
        "consortium-references.yaml": 40,
        "consortium-moonshot.yaml": 10,
    }
    algorithms = {dict(o.split("=", 1) for o in r.overrides)["algorithm"] for r in runs["consortium.yaml"]}
    assert algorithms == {
        "{name: fedlc, tau: 1.0}",
        "{alpha: 0.0, name: fedrs}",
        "{name: fedrod}",
        "{calibration_lr: 0.1, name: ccvr}",
    }
    moonshot = [dict(o.split("=", 1) for o in r.overrides) for r in runs["consortium-moonshot.yaml"]]
    assert {(m["train.loss"], m["algorithm"], m["data.skew"]) for m in moonshot} == {
        ("balanced", "{lambda: 3.0, name: codistill}", "0.8")
    }
    sampler = [dict(o.split("=", 1) for o in r.overrides) for r in runs["consortium-sampler.yaml"]]
    assert {m["algorithm"] for m in sampler} == {
        "{name: fedavg}",
        "{name: local}",
        "{lambda: 0.3, name: codistill, share: logits}",
        "{name: fedlc, tau: 3.0}",
    }
    assert {m["data.skew"] for m in sampler} == {"0.8", "0.9"} and {m["seed"] for m in sampler} == set(
        map(str, range(10))
    )


def test_a_moonshot_the_sampler_sweep_runs_gets_no_file_of_its_own(stage):
    ledgers(stage, {**TABLE, ("sampler", "local", 0): 0.80})
    chosen = consortium.choose(DATASET)
    assert chosen["moonshot"]["pick"] == "local+sampler-balanced"
    assert "consortium-moonshot.yaml" not in consortium.study_files(DATASET, chosen)


def test_an_unfinished_tuning_is_refused_naming_the_run(stage):
    missing = load_sweep(stage / DATASET / "consortium-tune.yaml")[3].output.stem
    ledgers(stage, TABLE, skip=missing)
    with pytest.raises(SystemExit, match=missing):
        consortium.choose(DATASET)
