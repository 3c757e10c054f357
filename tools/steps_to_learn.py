"""How many optimizer steps runs take to learn: the measurement behind ``mpicd check``'s warning
(mpicd.run.check.FEW_STEPS). For each results file, the round at which the clients' mean validation
balanced accuracy first reaches a fraction of its final gain over chance (the last 10 rounds' mean),
in optimizer steps per client; percentiles per dataset.

    .venv/bin/python tools/steps_to_learn.py 'results/study/*/consortium-tune*/*.h5'
"""

from __future__ import annotations

import glob
import sys
from collections import defaultdict

import numpy as np

from mpicd.results.reader import Results
from mpicd.run.client import batch_bounds

FRACTIONS = (0.5, 0.8, 0.9)


def steps_to(results: Results, fraction: float) -> int:
    """Steps per client (the largest client's) until the mean val balanced accuracy first reaches
    chance + ``fraction`` x (final - chance)."""
    cfg = results.config
    curve = results.metrics["val_balanced_acc"].mean(axis=1)
    chance = 1.0 / len(results.class_names)
    final = curve[-10:].mean()
    first = int(np.flatnonzero(curve >= chance + fraction * (final - chance))[0]) + 1
    per_round = max(
        len(batch_bounds(int(n), cfg["train"]["batch_size"])) for n in results.partition["train_counts"].sum(1)
    )
    return first * per_round * cfg["train"]["local_epochs"]


def main(pattern: str) -> None:
    found = defaultdict(lambda: defaultdict(list))
    files = sorted(glob.glob(pattern))
    for path in files:
        r = Results(path)
        for fraction in FRACTIONS:
            found[r.attrs["dataset"]][fraction].append(steps_to(r, fraction))
    print(f"{len(files)} runs; steps per client to reach a fraction of the final gain over chance")
    for dataset, by_fraction in found.items():
        for fraction, steps in by_fraction.items():
            p = np.percentile(steps, [10, 50, 90, 100])
            print(
                f"{dataset:16s} {fraction:.0%}: runs {len(steps)}, p10 {p[0]:.0f}, median {p[1]:.0f}, "
                f"p90 {p[2]:.0f}, max {p[3]:.0f}"
            )


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "results/study/*/consortium-tune*/*.h5")
