"""Choose hyper-parameters on the validation split only, then write the study's sweep files.

    python study/archive/pneumoniamnist-unofficial/choose.py            # after tune.yaml and tune-cnn.yaml ran

Score of a setting = mean over its seeds of the validation balanced accuracy (mean over clients,
averaged over the last 10 rounds). Balanced accuracy, not minority accuracy: minority accuracy
alone rewards a model that calls every image the minority class. The test split is never read.
Writes chosen.yaml (every setting's score, the choice) and the sweep files of stages 2-6.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))

from mpicd.results import Results  # noqa: E402
from mpicd.sweep import load_sweep  # noqa: E402

LAST = 10
REFERENCE = [{"name": "local"}, {"name": "fedavg"}, {"name": "centralized"}]


def val_score(path: Path) -> float:
    res = Results(path)
    if res.completed_rounds != res.attrs["rounds"]:
        raise SystemExit(
            f"{path}: only {res.completed_rounds}/{res.attrs['rounds']} rounds; finish the tuning sweep first"
        )
    return float(res.metrics["val_balanced_acc"][-LAST:].mean())


def scores(sweep: str, key) -> dict:
    by_setting = defaultdict(list)
    for run in load_sweep(HERE / sweep):
        by_setting[key(run)].append(val_score(run.output))
    return {setting: (float(np.mean(v)), len(v)) for setting, v in by_setting.items()}


def main() -> None:
    import os

    os.chdir(HERE.parents[2])  # sweep output folders are relative to the project root
    algo = scores(
        "tune.yaml",
        lambda run: yaml.safe_dump(yaml.safe_load(run.overrides[0].split("=", 1)[1]), default_flow_style=True).strip(),
    )
    best = {}
    for setting, (score, _n) in sorted(algo.items()):
        entry = yaml.safe_load(setting)
        name = entry["name"]
        if name not in best or score > best[name][1]:
            best[name] = (entry, score)
    cnn = scores(
        "tune-cnn.yaml",
        lambda run: yaml.safe_dump(yaml.safe_load(run.overrides[1].split("=", 1)[1]), default_flow_style=True).strip(),
    )
    train, _ = max(((yaml.safe_load(s), v[0]) for s, v in cnn.items()), key=lambda kv: kv[1])
    chosen = {
        "rule": f"highest mean over seeds of val_balanced_acc (mean over clients, last {LAST} rounds); test never read",
        "algorithm_scores": {s: round(v[0], 4) for s, v in sorted(algo.items())},
        "algorithm": {name: entry for name, (entry, _) in sorted(best.items())},
        "cnn_train_scores": {s: round(v[0], 4) for s, v in sorted(cnn.items())},
        "cnn_train": train,
    }
    (HERE / "chosen.yaml").write_text(yaml.safe_dump(chosen, sort_keys=False, width=120))
    methods = REFERENCE + [chosen["algorithm"][n] for n in ("codistill", "fedproto", "feddistill", "fedamp")]
    sweeps = {
        "main-low.yaml": ("skew 0, 0.2, 0.4 x 5 seeds", {"data.skew": [0.0, 0.2, 0.4], "seed": [0, 1, 2, 3, 4]}, {}),
        "main-high.yaml": (
            "skew 0.6, 0.8, 0.9 x 10 seeds",
            {"data.skew": [0.6, 0.8, 0.9], "seed": list(range(10))},
            {},
        ),
        "cnn.yaml": (
            "FedAvgCNN + SGD at skew 0.6 x 3 seeds",
            {"data.skew": [0.6], "seed": [0, 1, 2]},
            {"model.name": ["fedavgcnn"], "train": [train]},
        ),
        "six-clients.yaml": (
            "6 clients at skew 0.9 x 3 seeds",
            {"data.skew": [0.9], "seed": [0, 1, 2]},
            {"clients": [6]},
        ),
        "authors-skew.yaml": (
            "the authors' skew (only expertise-0 clients lose minority images) at skew 0.9 x 5 seeds",
            {"data.skew": [0.9], "seed": [0, 1, 2, 3, 4]},
            {"data.skew_mode": ["authors"]},
        ),
    }
    for name, (what, grid, extra) in sweeps.items():
        text = f"# Written by choose.py from chosen.yaml (do not edit by hand): {what}, 7 methods.\n" + yaml.safe_dump(
            {
                "config": "base.yaml",
                "output_dir": f"results/pneumoniamnist-study/{name[:-5]}",
                "grid": {**extra, "algorithm": methods, **grid},
            },
            sort_keys=False,
            width=120,
        )
        (HERE / name).write_text(text)
    print(yaml.safe_dump(chosen, sort_keys=False, width=120))


if __name__ == "__main__":
    main()
