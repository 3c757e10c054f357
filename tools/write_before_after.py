"""The results write per round against the ranks, two checkouts of mpicd in one run.

    python tools/write_before_after.py BEFORE AFTER OUT.json [--ranks 2,4,8,16,32] [--rounds 17]

For each N, the quick start (``configs/quickstart.yaml``, no checkpoints, eval every round) on N
ranks with the checkout BEFORE, then with AFTER (each as PYTHONPATH), flush ``auto``; then AFTER
flushed every round. Per run, as ``mpicd bench --write-ranks`` measures it (mpicd/bench/write.py):
the least-waiting rank's ``/metrics/write_seconds`` per round (the smallest over the ranks), mean
over the rounds after the first; besides it rank 0's (the rank that writes the rows) and the
slowest rank's. ``growth``: the mean at the largest N over the mean at the smallest, per setting.
Each job runs in its own process group, killed after ``--timeout`` seconds: never a hang.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np

from mpicd.mpi import launch

ROOT = Path(__file__).resolve().parents[1]


def run(tree: Path, n: int, out: Path, flush: str, rounds: int, timeout: float) -> None:
    env = {**os.environ, "PYTHONPATH": str(tree), "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    command = launch.command(n, [sys.executable, "-m", "mpicd", "run"], launcher="mpirun", export=["PYTHONPATH"])
    command += [str(ROOT / "configs" / "quickstart.yaml"), "--out", str(out), f"clients={n}", f"rounds={rounds}"]
    command += ["checkpoint.every=0", f"checkpoint.flush_every={flush}", "eval.every=1"]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise SystemExit(f"{tree}, {n} ranks: no result within {timeout:.0f} s") from None
    if proc.returncode != 0:
        raise SystemExit(f"{tree}, {n} ranks failed:\n{output.decode()[-3000:]}")


def writes(path: Path) -> dict:
    """Mean over rounds 2.. of the least-waiting, rank 0's and the slowest rank's write, in s."""
    with h5py.File(path, "r") as f:
        seconds = f["metrics/write_seconds"][1:]
    return {
        "mean": float(np.mean(np.nanmin(seconds, axis=1))),
        "median": float(np.median(np.nanmin(seconds, axis=1))),
        "rank0_mean": float(np.mean(seconds[:, 0])),
        "max_mean": float(np.mean(np.nanmax(seconds, axis=1))),
        "rounds": len(seconds),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--ranks", default="2,4,8,16,32")
    parser.add_argument("--rounds", type=int, default=17)
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args()
    ranks = [int(n) for n in args.ranks.split(",")]
    settings = {"before_auto": (args.before, "auto"), "auto": (args.after, "auto"), "every_round": (args.after, "1")}
    result: dict = {"ranks": ranks, "rounds": args.rounds, "before": str(args.before), "after": str(args.after)}
    result["load_average_start"] = list(os.getloadavg())
    for name in settings:
        result[name] = []
    with tempfile.TemporaryDirectory() as folder:
        for n in ranks:
            for name, (tree, flush) in settings.items():
                path = Path(folder) / f"{name}.{n}.h5"
                began = time.time()
                run(tree, n, path, flush, args.rounds, args.timeout)
                every = 1 if flush == "1" else max(1, -(-n // 4))
                result[name].append({"ranks": n, "flush_every": every, **writes(path)})
                print(f"{n:>3} ranks {name:<12} least-waiting {1e3 * result[name][-1]['mean']:8.2f} ms  "
                      f"rank 0 {1e3 * result[name][-1]['rank0_mean']:8.2f} ms  ({time.time() - began:.0f} s)",
                      flush=True)  # fmt: skip
    result["load_average_end"] = list(os.getloadavg())
    result["growth"] = {name: result[name][-1]["mean"] / result[name][0]["mean"] for name in settings}
    result["growth_rank0"] = {name: result[name][-1]["rank0_mean"] / result[name][0]["rank0_mean"] for name in settings}
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print("growth", {k: round(v, 2) for k, v in result["growth"].items()})
    print("growth rank 0", {k: round(v, 2) for k, v in result["growth_rank0"].items()})


if __name__ == "__main__":
    main()
