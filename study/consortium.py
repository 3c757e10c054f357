"""The consortium stage's sweep files: tuning first, then the study's runs from what validation chose.

    python study/consortium.py tune DATASET     # the tuning sweep files (run.sh, before stage k1 runs)
    python study/consortium.py choose DATASET   # after they ran: consortium-chosen.yaml + the study's files

The consortium's question (which method protects the minority class under label skew, at what cost)
needs the label-skew methods at the main grid's skews where imbalance bites (0.8, 0.9), its seeds
(0-9, paired with the main grid's ledgered runs) and its base config, each free parameter chosen on the
validation split at skew 0.8 with seeds 100-101 (disjoint from the study's), by choose.py's rule:
highest mean over seeds of val_balanced_acc (mean over clients, last 10 rounds); test never read.

What is tuned (each a method row of its own):

* FedLC's tau and FedLC's tau under class-balanced sampling (one calibration, two samplers);
* FedRS's alpha (soft restriction, the authors' code: it acts on imbalance, not only on absence);
* CCVR's calibration_lr (its rounds 1-99 are FedAvg's; only the last round's recalibration differs);
* the moonshot candidates, methods that send at most 1 KB per client per round, one of which the
  rule picks *before any of their test scores in this stage is read*: the logit reading (C floats)
  with the balanced sampler or the balanced loss, the feature reading (800 bytes) with the balanced
  loss, and local training (0 bytes) with either. The readings keep chosen.yaml's lambda.

Not tuned: FedRoD (no free parameter: the balanced softmax and a personal head), FedNTD (not run: with
two classes its not-true distribution has one class, the KL term is 0 and FedNTD is FedAvg bit for bit,
tests/algorithms/test_fedntd.py; both study datasets are binary), balanced sampling for FedAvg, local
and the logit reading (the sampler has no parameter).

Every file packs its four clients two to a rank (clients_per_rank balanced, 2 ranks: 27% less time a
run than 4 ranks on this 2-core machine; a layout changes no result, tests/mpi). A value the rule
picks at a grid's edge is extended by appending to the END of the tuning list (choose.py's practice),
said in the file.
"""

from __future__ import annotations

import os
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[0]
sys.path.insert(0, str(ROOT))

from mpicd.report.ledger import load  # noqa: E402
from mpicd.sweep.grid import load_sweep  # noqa: E402

DATASETS = ("retinamnist", "pneumoniamnist")
TUNING = {"data.skew": [0.8], "seed": [100, 101]}
STUDY = {"data.skew": [0.8, 0.9], "seed": list(range(10))}
MOONSHOT_SKEW = [0.8]  # the question is asked at skew 0.8
PINNED = {"eval.diagnostics": False, "clients_per_rank": "balanced"}
RULE = "highest mean over seeds of val_balanced_acc (mean over clients, last 10 rounds); test never read"
FEDLC = [0.3, 1.0, 3.0, 10.0]  # tau; PFLlib's default 1.0
FEDRS = [0.1, 0.5, 0.9]  # alpha; the authors' sweep
CCVR = [0.01, 0.1, 1.0]  # calibration_lr; FL-bench's 0.01 (a tie goes to the first: the default)
# Appended after the first pass chose a grid's edge (FedLC's tau 10 on both datasets, FedRS's alpha 0.1
# on RetinaMNIST; CCVR's three were within 0.0001, a flat surface, not extended; FedRS's
# alpha 0.9 on PneumoniaMNIST borders alpha 1, which is FedAvg): at the END of each list, so that the
# first pass's runs keep their numbers and files.
FEDLC_APPENDED = [30.0]
FEDRS_APPENDED = [0.0]
BALANCED_SAMPLER = {"train.sampler": ["balanced"]}
BALANCED_LOSS = {"train.loss": ["balanced"]}
TUNED = (  # row, its parameter, the grid
    ("fedlc", "tau", sorted(FEDLC + FEDLC_APPENDED)),
    ("fedlc+sampler-balanced", "tau", sorted(FEDLC + FEDLC_APPENDED)),
    ("fedrs", "alpha", sorted(FEDRS + FEDRS_APPENDED)),
    ("ccvr", "calibration_lr", CCVR),
)
MOONSHOT_BYTES = 1024  # at most 1 KB per client per round


def readings(dataset: str) -> dict:
    """chosen.yaml's co-distillation readings (the main grid's lambda)."""
    chosen = yaml.safe_load((HERE / dataset / "chosen.yaml").read_text())["algorithm"]
    return {"features": chosen["codistill"], "logits": chosen["codistill-logits"]}


def tuning_files(dataset: str) -> dict[str, tuple[str, dict, dict]]:
    """name -> (what, keys before the algorithm list, algorithm list); the grid ends with TUNING."""
    read = readings(dataset)
    return {
        "consortium-tune.yaml": (
            f"FedLC tau {FEDLC}, FedRS alpha {FEDRS} (soft), CCVR calibration_lr {CCVR}; appended at the grids' "
            f"edges: FedLC tau {FEDLC_APPENDED}, FedRS alpha {FEDRS_APPENDED}",
            {},
            [{"name": "fedlc", "tau": t} for t in FEDLC]
            + [{"name": "fedrs", "alpha": a} for a in FEDRS]
            + [{"name": "ccvr", "calibration_lr": lr} for lr in CCVR]
            + [{"name": "fedlc", "tau": t} for t in FEDLC_APPENDED]
            + [{"name": "fedrs", "alpha": a} for a in FEDRS_APPENDED],
        ),
        "consortium-tune-sampler.yaml": (
            f"train.sampler balanced: FedLC tau {FEDLC} (its own row; {FEDLC_APPENDED} appended at the edge); "
            "moonshot candidates the logit reading "
            "(chosen.yaml's lambda) and local",
            BALANCED_SAMPLER,
            [{"name": "fedlc", "tau": t} for t in FEDLC]
            + [read["logits"], {"name": "local"}]
            + [{"name": "fedlc", "tau": t} for t in FEDLC_APPENDED],
        ),
        "consortium-tune-loss.yaml": (
            "train.loss balanced: moonshot candidates the logit and feature readings (chosen.yaml's lambda) and local",
            BALANCED_LOSS,
            [read["logits"], read["features"], {"name": "local"}],
        ),
    }


def dump(dataset: str, name: str, what: str, before: dict, algorithms: list, after: dict) -> str:
    spec = {
        "config": "base.yaml",
        "output_dir": f"results/study/{dataset}/{name[:-5]}",
        "set": PINNED,
        "grid": {**before, "algorithm": algorithms, **after},
    }
    return f"# Written by consortium.py (do not edit by hand): {what}.\n" + yaml.safe_dump(
        spec, sort_keys=False, width=120
    )


def write_tuning(dataset: str) -> list[str]:
    for name, (what, before, algorithms) in tuning_files(dataset).items():
        text = dump(dataset, name, f"tuning at skew 0.8, seeds 100-101, {what}", before, algorithms, TUNING)
        (HERE / dataset / name).write_text(text)
    return list(tuning_files(dataset))


def row(entry: dict, overrides: dict) -> str:
    """The method row a tuning run belongs to: the algorithm's name (and reading) and its training options."""
    name = entry["name"] + ("-logits" if entry.get("share") == "logits" else "")
    options = [f"{k.split('.')[-1]}-{v}" for k, v in sorted(overrides.items()) if k.startswith("train.")]
    return "+".join([name, *options])


def scores(dataset: str) -> dict[str, dict[str, list[float]]]:
    """row -> setting (the algorithm entry, inline) -> validation scores over the tuning seeds."""
    found: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for name in tuning_files(dataset):
        runs = load_sweep(HERE / dataset / name)
        ledger = load(runs[0].ledger) if runs[0].ledger.exists() else {}
        for run in runs:
            overrides = dict(o.split("=", 1) for o in run.overrides)
            entry = yaml.safe_load(overrides["algorithm"])
            line = ledger.get(run.output.stem)
            value = None if line is None else line.get("last10", {}).get("metrics/val_balanced_acc")
            if value is None:
                raise SystemExit(f"{dataset}/{name}: {run.output.stem} is not in its ledger; finish the tuning first")
            setting = yaml.safe_dump(entry, default_flow_style=True, sort_keys=True).strip()
            found[row(entry, overrides)][setting].append(float(value))
    return found


def choose(dataset: str) -> dict:
    """consortium-chosen.yaml: every setting's score, each row's choice, the moonshot's pick."""
    found = scores(dataset)
    means = {r: {s: float(np.mean(v)) for s, v in settings.items()} for r, settings in found.items()}
    best = {r: max(settings, key=settings.get) for r, settings in means.items()}
    moonshot = [r for r in means if r.startswith(("codistill", "local"))]
    pick = max(moonshot, key=lambda r: means[r][best[r]])
    edges = {}
    for r, key, grid in TUNED:
        value = yaml.safe_load(best[r])[key]
        if value in (grid[0], grid[-1]):
            edges[r] = {key: value}
    return {
        "rule": RULE,
        "scores": {r: {s: round(v, 4) for s, v in sorted(settings.items())} for r, settings in sorted(means.items())},
        "algorithm": {r: yaml.safe_load(best[r]) for r in sorted(best)},
        "moonshot": {
            "candidates": sorted(moonshot),
            "rule": f"of the candidates (at most {MOONSHOT_BYTES} bytes per client per round), the highest "
            "validation score by the same rule, chosen before any test score of this stage is read",
            "pick": pick,
        },
        "at_grid_edge": edges,
    }


def study_files(dataset: str, chosen: dict) -> dict[str, str]:
    """The study's sweep files from consortium-chosen.yaml."""
    pick = chosen["algorithm"]
    read = readings(dataset)
    files = {
        "consortium.yaml": (
            "the label-skew methods as validation chose them (FedNTD not run: FedAvg on two classes)",
            {},
            [pick["fedlc"], pick["fedrs"], {"name": "fedrod"}, pick["ccvr"]],
            STUDY,
        ),
        "consortium-sampler.yaml": (
            "train.sampler balanced: FedAvg, local, the logit reading (chosen.yaml's lambda), FedLC (its own tau)",
            BALANCED_SAMPLER,
            [{"name": "fedavg"}, {"name": "local"}, read["logits"], pick["fedlc+sampler-balanced"]],
            STUDY,
        ),
        # the personalised score (personal_acc) of the two references: the main grid's ledgers predate it
        "consortium-references.yaml": (
            "FedAvg and local re-run as the main grid ran them (its ledgers predate personal_acc)",
            {},
            [{"name": "fedavg"}, {"name": "local"}],
            STUDY,
        ),
    }
    moonshot = chosen["moonshot"]["pick"]
    if moonshot not in ("codistill-logits+sampler-balanced", "local+sampler-balanced"):  # else in consortium-sampler
        before = BALANCED_LOSS if "loss-balanced" in moonshot else BALANCED_SAMPLER
        files["consortium-moonshot.yaml"] = (
            f"the moonshot, {moonshot} (validation's pick among the candidates), skew 0.8",
            before,
            [pick[moonshot]],
            {"data.skew": MOONSHOT_SKEW, "seed": STUDY["seed"]},
        )
    return {
        name: dump(dataset, name, what, before, algos, after) for name, (what, before, algos, after) in files.items()
    }


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("tune", "choose") or argv[1] not in DATASETS:
        print(__doc__, file=sys.stderr)
        return 2
    command, dataset = argv
    os.chdir(ROOT)  # sweep output folders are relative to the project root
    if command == "tune":
        written = write_tuning(dataset)
    else:
        chosen = choose(dataset)
        (HERE / dataset / "consortium-chosen.yaml").write_text(yaml.safe_dump(chosen, sort_keys=False, width=120))
        written = ["consortium-chosen.yaml"]
        for name, text in study_files(dataset, chosen).items():
            (HERE / dataset / name).write_text(text)
            written.append(name)
        print(yaml.safe_dump(chosen, sort_keys=False, width=120))
    print(f"written: {', '.join(f'{dataset}/{w}' for w in written)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
