"""A node's peak memory against the rank count, the dataset private per rank (before) or shared per node (after).

    .venv/bin/python tools/bench_memory.py [--ranks 1,2,4,6] [--rounds 2] [--image-size S] [--data PATH.npz]

For each rank count N and each mode it launches ``mpirun -n N mpicd run`` on PneumoniaMNIST with
every image (``data.images_per_class=null``) and samples every rank from this process, no code in
mpicd needed: ``/proc/<pid>/smaps_rollup`` (PSS, proportional set size: a page mapped by k processes
counts 1/k in each, so the sum over a node's ranks is the node's real memory) and
``/proc/<pid>/status`` (VmHWM, the kernel's exact peak RSS). It prints per N and mode, in MiB: the
peak over time of the ranks' summed anonymous + shared-memory PSS (``Pss_Anon + Pss_Shmem``: heap,
tensors, the data, the shared window; the node's peak), the same for the whole PSS (which adds the
file-backed pages of python, torch and MPI's libraries: shared with every other process on the
machine that maps them, so it moves with whatever else runs there), the sum of each rank's peak RSS
(which counts a shared page once per rank that touches it), and a least-squares slope: how much the
node's peak grows per added rank.

Modes: ``shared`` is ``mpicd run`` as it is (one rank per node loads the data into an MPI
shared-memory window, mpicd/data/node_shared.py); ``private`` is the same run with every rank loading its
own copy (``prepare`` called without the communicator, as before the dataset was read once per node), for comparison.
PSS is sampled (every --interval s), so a short spike between samples can be missed; VmHWM cannot.
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

from mpicd.mpi import launch

ROOT = Path(__file__).resolve().parents[1]
REAL_DATA = ROOT.parent / "shared" / "data" / "pneumoniamnist.npz"
CONFIG = ROOT / "configs" / "pneumoniamnist.yaml"
MODES = ("private", "shared")
MIB = 1024 * 1024


def private_run(argv: list[str]) -> int:
    """Under mpirun: ``mpicd run`` with every rank loading its own copy of the data (the "before")."""
    sys.path.insert(0, str(ROOT))
    import mpicd.run.plan

    shared_prepare = mpicd.run.plan.prepare
    mpicd.run.plan.prepare = lambda config, comm=None: shared_prepare(config)  # runner.run imports it at call time
    from mpicd.cli import main

    return main(["run", *argv])


def is_python(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().split(b"\0")[0] == sys.executable.encode()
    except OSError:
        return False


def ranks_below(root: int) -> list[int]:
    """The rank processes below ``root``: the topmost python processes (from the parent pids in
    /proc/*/stat); a rank's own children (a fork about to exec a helper) are not ranks."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parent = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            (found if is_python(child) else todo).append(child)
    return found


def sample(pid: int) -> tuple[int, int, int] | None:
    """(anonymous + shmem PSS, PSS, peak RSS) of a rank in bytes, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            kib = {p[0]: int(p[1]) for p in (line.split() for line in f) if len(p) == 3 and p[2] == "kB"}
        with open(f"/proc/{pid}/status") as f:
            hwm = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return None
    return 1024 * (kib["Pss_Anon:"] + kib["Pss_Shmem:"]), 1024 * kib["Pss:"], 1024 * hwm


def measure(
    ranks: int, mode: str, data: str, rounds: int, image_size: int | None, interval: float, timeout: float
) -> dict:
    """One run: the node's peak summed anon + shmem PSS and whole PSS, the sum of peak RSS, the seconds."""
    program = ["-m", "mpicd", "run"] if mode == "shared" else [str(Path(__file__).resolve()), "--private-run"]
    with tempfile.TemporaryDirectory() as tmp:
        overrides = [
            f"clients={ranks}",
            f"data.path={data}",
            "data.images_per_class=null",
            f"rounds={rounds}",
            "device=cpu",
            "checkpoint.every=0",
            *([f"data.image_size={image_size}"] if image_size else []),
        ]
        command = [
            *launch.command(ranks, launcher="mpirun"),
            sys.executable,
            *program,
            str(CONFIG),
            *overrides,
            "--out",
            str(Path(tmp) / "run.h5"),
        ]
        env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        start = time.monotonic()
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        peak_rss, node_peak = {}, [0, 0]
        while proc.poll() is None:
            if time.monotonic() - start > timeout:
                proc.kill()
                raise SystemExit(f"bench_memory: {' '.join(command)} ran past {timeout} s")
            now = [0, 0]
            for pid in ranks_below(proc.pid):
                got = sample(pid)
                if got is not None:
                    now = [now[0] + got[0], now[1] + got[1]]
                    peak_rss[pid] = max(peak_rss.get(pid, 0), got[2])
            node_peak = [max(a, b) for a, b in zip(node_peak, now)]
            time.sleep(interval)
        output = proc.stdout.read()
        if proc.returncode != 0 or len(peak_rss) != ranks:
            raise SystemExit(
                f"bench_memory: {' '.join(command)} exited {proc.returncode}, {len(peak_rss)} of "
                f"{ranks} ranks sampled:\n{output}"
            )
    return {
        "node_peak_anon_shmem": node_peak[0],
        "node_peak_pss": node_peak[1],
        "sum_peak_rss": sum(peak_rss.values()),
        "seconds": time.monotonic() - start,
    }


def dataset_bytes(data: str, image_size: int | None) -> int:
    """float32 bytes of all three splits as mpicd holds them (1 channel, image_size^2 or the file's size)."""
    with np.load(data, allow_pickle=False) as npz:
        shapes = [npz[f"{split}_images"].shape for split in ("train", "val", "test")]
    return sum(4 * s[0] * (image_size**2 if image_size else s[1] * s[2]) for s in shapes)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", default="1,2,4,6", help="comma-separated rank counts (default 1,2,4,6)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--image-size", type=int, help="resize to S x S (data.image_size; default: the file's 28)")
    parser.add_argument("--data", default=str(REAL_DATA), help="pneumoniamnist.npz")
    parser.add_argument("--interval", type=float, default=0.05, help="seconds between samples")
    parser.add_argument("--timeout", type=float, default=900, help="seconds before a run is killed")
    args = parser.parse_args()
    if not Path(args.data).is_file():
        print(f"bench_memory: no data file {args.data} (--data)", file=sys.stderr)
        return 2
    size = dataset_bytes(args.data, args.image_size)
    print(
        f"PneumoniaMNIST, every image, {args.image_size or 28}x{args.image_size or 28}: the dataset is "
        f"{size / MIB:.1f} MiB as float32; {args.rounds} rounds of codistill, LeNet, CPU; MiB per node"
    )
    header = (
        f"{'ranks':>5}  {'mode':<8}{'anon+shm PSS':>13}{'per rank':>9}{'whole PSS':>11}{'sum peak RSS':>14}"
        f"{'seconds':>9}"
    )
    print(header)
    counts, peaks = [int(r) for r in args.ranks.split(",")], {mode: [] for mode in MODES}
    for ranks in counts:
        for mode in MODES:
            m = measure(ranks, mode, args.data, args.rounds, args.image_size, args.interval, args.timeout)
            peaks[mode].append(m["node_peak_anon_shmem"])
            print(
                f"{ranks:>5}  {mode:<8}{m['node_peak_anon_shmem'] / MIB:>13.0f}"
                f"{m['node_peak_anon_shmem'] / MIB / ranks:>9.0f}{m['node_peak_pss'] / MIB:>11.0f}"
                f"{m['sum_peak_rss'] / MIB:>14.0f}{m['seconds']:>9.1f}",
                flush=True,
            )
    if len(counts) > 1:  # least-squares slope of the node's peak against N
        for mode in MODES:
            slope = np.polyfit(counts, np.array(peaks[mode]) / MIB, 1)[0]
            print(f"{mode}: the node's peak anon+shm PSS grows by {slope:.0f} MiB per added rank")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--private-run"]:
        sys.exit(private_run(sys.argv[2:]))
    sys.exit(main())
