"""Packed vs one-after-another: the same few runs of a sweep, timed in one go on this machine.

    .venv/bin/python tools/bench_pack.py [--sweep configs/sweep-pneumoniamnist.yaml] [--rounds 10]

Takes 4 runs of the sweep (the first two values of its first and last grid keys; rounds
overridden to ROUNDS), then times
  sequential: one `mpirun -n N mpicd run` per run, one after another (jobs/sweep.sh's way);
  pack xN:    one `mpirun -n N mpicd pack` (one group);
  pack x2N:   one `mpirun -n 2N mpicd pack` (two groups);
checks that every packed file equals its sequential twin (timings aside) and prints wall times and
ratios. Launches its own MPI jobs: run it without mpirun, on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mpicd.mpi import launch  # noqa: E402
from mpicd.results.reader import Results  # noqa: E402
from mpicd.sweep.grid import load_sweep  # noqa: E402


def mpirun(n: int, *args: str) -> float:
    env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    started = time.perf_counter()
    done = subprocess.run(
        launch.command(n, [sys.executable, "-m", "mpicd", *args], launcher="mpirun"),
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"mpirun -n {n} mpicd {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
    return time.perf_counter() - started


def subset(sweep: Path, rounds: int, folder: Path, name: str) -> Path:
    """The sweep restricted to the first two values of its first and last grid keys and the first
    value of every other key (4 runs), ``rounds`` rounds each, writing under ``folder/name``."""
    spec = yaml.safe_load(sweep.read_text())
    keys = list(spec["grid"])
    grid = {k: v[:2] if k in (keys[0], keys[-1]) else v[:1] for k, v in spec["grid"].items()}
    out = folder / f"{name}.yaml"
    out.write_text(
        yaml.safe_dump(
            {
                "config": str((sweep.parent / spec["config"]).resolve()),
                "output_dir": str(folder / name),
                "grid": {**grid, "rounds": [rounds]},
            }
        )
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sweep", default="configs/sweep-pneumoniamnist.yaml")
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        files = {mode: subset(ROOT / args.sweep, args.rounds, tmp, mode) for mode in ("sequential", "pack1", "pack2")}
        runs = load_sweep(files["sequential"])
        n = runs[0].ranks
        seconds = {
            "sequential": sum(mpirun(n, "run", str(r.config), *r.overrides, "--out", str(r.output)) for r in runs)
        }
        seconds["pack1"] = mpirun(n, "pack", str(files["pack1"]))
        seconds["pack2"] = mpirun(2 * n, "pack", str(files["pack2"]))
        for mode in ("pack1", "pack2"):
            for a, b in zip(runs, load_sweep(files[mode])):
                ra, rb = Results(a.output), Results(b.output)
                for key in ra.metrics:
                    if key not in ("comm_seconds", "compute_seconds") and not np.array_equal(
                        ra.metrics[key], rb.metrics[key]
                    ):
                        raise SystemExit(f"{mode}: {b.output.name} differs from the sequential run in {key}")
        cores = len(os.sched_getaffinity(0))
        print(f"{len(runs)} runs of {args.sweep} ({args.rounds} rounds each, {n} ranks per run), {cores} cores")
        print(f"  sequential, {len(runs)} x mpirun -n {n} mpicd run : {seconds['sequential']:7.1f} s   1.00")
        for mode, ranks in (("pack1", n), ("pack2", 2 * n)):
            label = f"mpirun -n {ranks} mpicd pack ({ranks // n} group{'s' if ranks > n else ''})"
            print(f"  {label:<37}: {seconds[mode]:7.1f} s   {seconds['sequential'] / seconds[mode]:.2f}x faster")
        print("  every packed run's metrics and bytes equal its sequential twin's (timings aside)")


if __name__ == "__main__":
    main()
