"""Choose each method's hyper-parameter on the validation split only, then write a dataset's sweep files.

    python study/choose.py pneumoniamnist     # after pneumoniamnist/tune.yaml ran (run.sh does it)
    python study/choose.py retinamnist        # after retinamnist/tune.yaml ran
    python study/choose.py breastmnist        # no tuning of its own: PneumoniaMNIST's choice
    python study/choose.py DATASET --placeholder   # sweep files from the earlier study's choice,
                                                          # only to validate them before tuning ran

Adapted from archive/pneumoniamnist-unofficial/choose.py. Score of a setting = mean over its seeds
of the validation balanced accuracy (mean over clients, averaged over the last 10 rounds).
Balanced accuracy, not minority accuracy: minority accuracy alone rewards a model that calls every
image the minority class. The test split is never read. Co-distillation's two readings (share:
features, the mean feature vector; share: logits, the paper's text) are two method rows, each
with its own choice. BreastMNIST (147 malignant training images; a val split of 78) is not tuned:
it reuses PneumoniaMNIST's choice (grey 28x28 binary images, the same model), said in chosen.yaml.
Writes DATASET/chosen.yaml (every setting's score, the choice) and DATASET's study sweep files:
every stage after tuning turns eval.diagnostics off (`set:`; it costs ~25% of a round and changes
nothing trained) except mechanism.yaml, co-distillation's two readings with the diagnostics on;
PneumoniaMNIST also gets the privacy-utility stage (privacy-off/-shared/-dpsgd.yaml).
A sweep file that would change after its stage has results files is a problem `mpicd pack` catches
(it names the file and the differing key); choose.py runs before any of the stages it writes.
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

LAST = 10
REFERENCE = [{"name": "local"}, {"name": "fedavg"}, {"name": "centralized"}]
TUNED = ("codistill", "codistill-logits", "fedproto", "feddistill", "fedamp")
# the earlier study's choice (archive/pneumoniamnist-unofficial/chosen.yaml); the logit reading was
# not tuned there: lambda 1 (the default). Used only by --placeholder, to validate the sweep files.
PLACEHOLDER = {
    "codistill": {"name": "codistill", "lambda": 0.3},
    "codistill-logits": {"name": "codistill", "share": "logits", "lambda": 1.0},
    "fedproto": {"name": "fedproto", "lambda": 1.0},
    "feddistill": {"name": "feddistill", "lambda": 0.1},
    "fedamp": {"name": "fedamp", "lambda": 0.03},
}
LOW, HIGH = [0.0, 0.2, 0.4], [0.6, 0.8, 0.9]
FIVE, TEN = list(range(5)), list(range(10))
NO_DIAGNOSTICS = {"eval.diagnostics": False}
EPSILONS = [1, 4, 16]  # the privacy-utility grid; infinity = privacy-off.yaml
DELTA = 1e-5


def row(entry: dict) -> str:
    """The method row a tuning entry belongs to."""
    return entry["name"] + ("-logits" if entry.get("share") == "logits" else "")


def val_score(ledger: dict, run) -> float:
    """The run's validation balanced accuracy (mean over clients and the last 10 rounds), read from
    the tuning sweep's runs ledger (tune.runs.jsonl; ``mpicd ledger`` writes it after the sweep)."""
    entry = ledger.get(run.output.stem)
    if entry is None:
        raise SystemExit(f"{run.output.stem}: not in the tuning ledger (unfinished?); finish the tuning first")
    value = entry.get("last10", {}).get("metrics/val_balanced_acc")
    if value is None:
        raise SystemExit(f"{run.output.stem}: the ledger holds no validation score (a ledger older than last10?)")
    return float(value)


def tune(dataset: str) -> dict:
    by_setting = defaultdict(list)
    runs = load_sweep(HERE / dataset / "tune.yaml")
    ledger = load(runs[0].ledger) if runs[0].ledger.exists() else {}
    for run in runs:
        entry = yaml.safe_load(run.overrides[0].split("=", 1)[1])
        by_setting[yaml.safe_dump(entry, default_flow_style=True).strip()].append(val_score(ledger, run))
    best: dict[str, tuple[dict, float]] = {}
    for setting, values in sorted(by_setting.items()):
        entry, score = yaml.safe_load(setting), float(np.mean(values))
        if row(entry) not in best or score > best[row(entry)][1]:
            best[row(entry)] = (entry, score)
    return {
        "rule": f"highest mean over seeds of val_balanced_acc (mean over clients, last {LAST} rounds); test never read",
        "algorithm_scores": {s: round(float(np.mean(v)), 4) for s, v in sorted(by_setting.items())},
        "algorithm": {name: best[name][0] for name in TUNED},
    }


def sweeps(dataset: str) -> dict:
    """name -> (description, clients, grid without the algorithm list, keys before the algorithm list)."""
    main = {
        "main-low.yaml": ("4 clients, skew 0, 0.2, 0.4 x 5 seeds", {}, {"data.skew": LOW, "seed": FIVE}),
        "main-high.yaml": ("4 clients, skew 0.6, 0.8, 0.9 x 10 seeds", {}, {"data.skew": HIGH, "seed": TEN}),
    }
    lowdata = {
        "lowdata.yaml": (
            "low data: 25, 50, 100 images per class per client at skew 0.6 x 10 seeds",
            {"data.images_per_class": [25, 50, 100]},
            {"data.skew": [0.6], "seed": TEN},
        )
    }
    fairness = {
        "fairness-reset.yaml": (
            "fairness option, train.optimizer_state reset (keep: main-high) at skew 0.8 x 5 seeds",
            {"train.optimizer_state": ["reset"]},
            {"data.skew": [0.8], "seed": FIVE},
        ),
        "fairness-balanced.yaml": (
            "fairness option, train.loss balanced (ce: main-high) at skew 0.8 x 5 seeds",
            {"train.loss": ["balanced"]},
            {"data.skew": [0.8], "seed": FIVE},
        ),
    }
    if dataset == "breastmnist":
        return {
            "lowdata.yaml": (
                "low data at its maximum: 36 images per class per client (4 clients) at skew 0.6 x 10 seeds",
                {},
                {"data.skew": [0.6], "seed": TEN},
            )
        }
    if dataset == "retinamnist":
        six = {
            "six-low.yaml": (
                "6 clients (81 images per class each), skew 0, 0.2, 0.4 x 5 seeds",
                {"clients": [6]},
                {"data.skew": LOW, "seed": FIVE},
            ),
            "six-high.yaml": (
                "6 clients (81 images per class each), skew 0.6, 0.8, 0.9 x 10 seeds",
                {"clients": [6]},
                {"data.skew": HIGH, "seed": TEN},
            ),
        }
    else:
        six = {
            "six-clients.yaml": (
                "6 clients (150 images per class each), skew 0.9 x 10 seeds",
                {"clients": [6]},
                {"data.skew": [0.9], "seed": TEN},
            ),
        }
    return {**lowdata, **main, **six, **fairness}


def write(dataset: str, chosen: dict, note: str) -> list[str]:
    methods = REFERENCE + [chosen["algorithm"][n] for n in TUNED]
    written = []
    for name, (what, before, after) in sweeps(dataset).items():
        grid = {**before, "algorithm": methods, **after}
        text = f"# Written by choose.py ({note}; do not edit by hand): {what}, 8 method rows.\n" + dump(
            dataset, name, grid, NO_DIAGNOSTICS
        )
        (HERE / dataset / name).write_text(text)
        written.append(name)
    if dataset != "breastmnist":
        term = [{**chosen["algorithm"][n], "term_mean": "batch"} for n in ("codistill", "codistill-logits")]
        text = (
            f"# Written by choose.py ({note}; do not edit by hand): fairness option, algorithm.term_mean batch "
            "(matching: main-high) for co-distillation's two readings at skew 0.8 x 5 seeds.\n"
            + dump(
                dataset, "fairness-termmean.yaml", {"algorithm": term, "data.skew": [0.8], "seed": FIVE}, NO_DIAGNOSTICS
            )
        )
        (HERE / dataset / "fairness-termmean.yaml").write_text(text)
        readings = [chosen["algorithm"][n] for n in ("codistill", "codistill-logits")]
        text = (
            f"# Written by choose.py ({note}; do not edit by hand): the mechanism, co-distillation's "
            "two readings with eval.diagnostics on (base.yaml) at skew 0 and 0.8 x 5 seeds (the main grid's configs "
            "and seeds plus /diag; bit for bit the main grid's runs only on the same CPU model and threads per rank).\n"
            + dump(dataset, "mechanism.yaml", {"algorithm": readings, "data.skew": [0.0, 0.8], "seed": FIVE}, {})
        )
        (HERE / dataset / "mechanism.yaml").write_text(text)
        written += ["fairness-termmean.yaml", "mechanism.yaml"]
    if dataset == "pneumoniamnist":
        written += privacy_sweeps(dataset, chosen, note)
    return written


def dump(dataset: str, name: str, grid: dict, pinned: dict) -> str:
    spec = {"config": "base.yaml", "output_dir": f"results/study/{dataset}/{name[:-5]}"}
    return yaml.safe_dump({**spec, **({"set": pinned} if pinned else {}), "grid": grid}, sort_keys=False, width=120)


def privacy_sweeps(dataset: str, chosen: dict, note: str) -> list[str]:
    """The privacy-utility stage: skew 0.8 x 5 seeds, epsilon per client over the whole run.

    Co-distillation, FedProto, FedDistill: privacy.epsilon alone, so the noise is derived to fit
    every planned release (README, Differential privacy). FedAvg (DP-SGD) needs an explicit
    noise multiplier: the smallest sigma (accountant.noise_multiplier, rounded up to 1e-4) that
    keeps its rounds x ceil(n / batch) steps at q = 1 / ceil(n / batch) within (epsilon, delta),
    n = images_per_class + floor((1 - skew) images_per_class), every client's size at skew 0.8
    (mpicd.data.partition: 150 of its expertise class, 30 of the other). local (epsilon 0) and the
    methods without privacy (epsilon infinity) are privacy-off.yaml.
    """
    import math

    from mpicd.config.loading import load_config
    from mpicd.data.partition import kept_after_skew
    from mpicd.privacy import accountant

    base = load_config(HERE / dataset / "base.yaml", [])
    per_class, skew = base.data.images_per_class, 0.8
    size = per_class + kept_after_skew(per_class, skew)  # two classes
    steps_per_round = math.ceil(size / base.train.batch_size)
    q, steps = 1.0 / steps_per_round, base.rounds * steps_per_round
    shared = [chosen["algorithm"][n] for n in ("codistill", "fedproto", "feddistill")]
    cells = {"data.skew": [skew], "seed": FIVE}
    sigma = {e: math.ceil(accountant.noise_multiplier(e, DELTA, q, steps) * 1e4) / 1e4 for e in EPSILONS}
    files = {
        "privacy-off.yaml": (
            "privacy-utility stage, privacy off: local (releases nothing, epsilon 0) and the private "
            "methods at epsilon infinity",
            {"algorithm": [{"name": "local"}, {"name": "fedavg"}, *shared], **cells},
        ),
        "privacy-shared.yaml": (
            f"privacy-utility stage, co-distillation, FedProto, FedDistill at epsilon {EPSILONS} "
            f"(delta {DELTA}, clip 1, q 1, counts noised; sigma derived for every planned release)",
            {"algorithm": shared, "privacy": [{"epsilon": e} for e in EPSILONS], **cells},
        ),
        "privacy-dpsgd.yaml": (
            f"privacy-utility stage, FedAvg with DP-SGD at epsilon {EPSILONS} (delta {DELTA}, clip 1): "
            f"sigma for {steps} steps ({size} images a client, batch {base.train.batch_size}) at q = 1/{steps_per_round}: "
            + ", ".join(f"eps {e}: {sigma[e]}" for e in EPSILONS),
            {
                "algorithm": [{"name": "fedavg"}],
                "privacy": [{"epsilon": e, "noise_multiplier": sigma[e]} for e in EPSILONS],
                **cells,
            },
        ),
    }
    for name, (what, grid) in files.items():
        text = f"# Written by choose.py ({note}; do not edit by hand): {what}.\n" + dump(
            dataset, name, grid, NO_DIAGNOSTICS
        )
        (HERE / dataset / name).write_text(text)
    return list(files)


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("pneumoniamnist", "retinamnist", "breastmnist"):
        print(__doc__, file=sys.stderr)
        return 2
    dataset, placeholder = argv[0], "--placeholder" in argv
    os.chdir(ROOT)  # sweep output folders are relative to the project root
    if placeholder:
        chosen = {"rule": "placeholder: the earlier study's choice, before tuning", "algorithm": PLACEHOLDER}
        note = "PLACEHOLDER values, rewritten after tuning"
    elif dataset == "breastmnist":
        source = HERE / "pneumoniamnist" / "chosen.yaml"
        if not source.is_file():
            raise SystemExit(f"{source} missing: run choose.py pneumoniamnist first (after its tuning)")
        chosen = yaml.safe_load(source.read_text())
        chosen = {"rule": f"not tuned: PneumoniaMNIST's choice ({source.name} there)", "algorithm": chosen["algorithm"]}
        note = "from pneumoniamnist/chosen.yaml"
    else:
        chosen = tune(dataset)
        note = "from chosen.yaml"
    if not placeholder:
        (HERE / dataset / "chosen.yaml").write_text(yaml.safe_dump(chosen, sort_keys=False, width=120))
    written = write(dataset, chosen, note)
    print(yaml.safe_dump(chosen, sort_keys=False, width=120))
    print(f"written: {', '.join(f'{dataset}/{w}' for w in written)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
