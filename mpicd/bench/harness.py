"""The bench's settings and how it launches its MPI jobs: srun inside Slurm, else mpirun/mpiexec with
the flags this machine needs; a job that fails or overruns its timeout is killed, never left hanging.
"""

from __future__ import annotations

import math
import os
import platform
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from mpicd.bench.net import SIZES
from mpicd.mpi import launch


ROOT = Path(__file__).resolve().parents[2]

ALGORITHMS = ("codistill", "fedavg", "fedproto", "feddistill", "fedamp", "local")


class BenchError(RuntimeError):
    """A launched job failed or a setting is unusable; the message says which."""


@dataclass
class Settings:
    ranks: int = 4
    repeats: int = 3
    rounds: int = 6
    resnet_rounds: int = 2  # ResNet-18's compute for the projection: 1 + warm-up
    config: str = ""
    overrides: list = field(default_factory=list)  # applied to every run (data size, data path)
    sizes: tuple = ()
    net_budget: float = 2.0**28  # bytes moved per size and repeat in the sweep
    net_most: int = 1000
    timeout: float = 3600.0
    threads: int | None = None  # single-process parts; None: what mpicd gives one rank
    quick: bool = False
    write_ranks: tuple = ()  # the results write vs ranks (mpicd.bench.write); empty: not measured
    write_rounds: int = 17
    clients_sweep: tuple = ()  # clients per rank (mpicd.bench.clients): these N on 2 and N ranks; empty: not measured
    clients_rounds: int = 4


def stats(values) -> dict:
    """min / median / max of the finite values (and the values themselves)."""
    v = [float(x) for x in values if x is not None and math.isfinite(float(x))]
    if not v:
        return {"min": None, "median": None, "max": None, "values": []}
    return {"min": min(v), "median": float(np.median(v)), "max": max(v), "values": v}


def settings_for(args) -> Settings:
    """The command line's options with --quick's defaults; BenchError names a bad option."""
    quick = bool(args.quick)
    s = Settings(
        ranks=2 if quick else 4,
        repeats=1 if quick else 3,
        rounds=2 if quick else 6,
        sizes=(8, 2**20) if quick else SIZES,
        net_budget=2.0**24 if quick else 2.0**28,
        net_most=100 if quick else 1000,
        quick=quick,
        overrides=["data.images_per_class=40"] if quick else [],
        write_ranks=(2, 5) if quick else (),
        write_rounds=5 if quick else 17,
    )
    if getattr(args, "write_ranks", None):
        try:
            s.write_ranks = tuple(int(n) for n in args.write_ranks.split(","))
        except ValueError:
            raise BenchError(
                f"--write-ranks must be a comma-separated list of rank counts, got {args.write_ranks!r}"
            ) from None
        if any(n < 1 for n in s.write_ranks):
            raise BenchError(f"--write-ranks must be at least 1 each, got {args.write_ranks!r}")
    if getattr(args, "clients_per_rank", None):
        try:
            s.clients_sweep = tuple(int(n) for n in args.clients_per_rank.split(","))
        except ValueError:
            raise BenchError(f"--clients-per-rank must be a comma-separated list of client counts, got "
                             f"{args.clients_per_rank!r}") from None  # fmt: skip
        if any(n < 2 for n in s.clients_sweep):
            raise BenchError(f"--clients-per-rank must be at least 2 each, got {args.clients_per_rank!r}")
    for name in ("ranks", "repeats", "rounds"):
        value = getattr(args, name)
        if value is not None:
            setattr(s, name, value)
    if s.ranks < 2:
        raise BenchError(f"--ranks must be at least 2, got {s.ranks}")
    if s.repeats < 1:
        raise BenchError(f"--repeats must be at least 1, got {s.repeats}")
    if s.rounds < 2:
        raise BenchError(f"--rounds must be at least 2 (the first is a warm-up), got {s.rounds}")
    if args.timeout is not None:
        s.timeout = float(args.timeout)
    if args.threads is not None:
        if args.threads < 1:
            raise BenchError(f"--threads must be at least 1, got {args.threads}")
        s.threads = args.threads
    config = Path(args.config) if args.config else ROOT / "configs" / "pneumoniamnist.yaml"
    if not config.is_file():
        raise BenchError(f"--config: {config} does not exist")
    s.config = str(config.resolve())
    if args.data:
        data = Path(args.data)
        if not data.is_file():
            raise BenchError(f"--data: {data} does not exist")
        s.overrides.append(f"data.path={data.resolve()}")
    return s


def launcher(n: int, unbound: bool = False) -> list[str]:
    """The command prefix that starts ``n`` ranks here (:func:`mpicd.mpi.launch.command`: srun inside
    Slurm, else mpirun); ``unbound``: no binding of ranks to cores, for the job whose rank 0 also
    trains alone with all the cores."""
    try:
        return launch.command(n, unbound=unbound)
    except launch.LaunchError as err:
        raise BenchError(str(err)) from None


def run_job(
    n: int, argv: list[str], timeout: float, stamp: bool = False, unbound: bool = False
) -> tuple[float, list[tuple[float, str]]]:
    """Launch ``n`` ranks of ``python ARGV``; returns (launch time, [(time, line)] of its output).

    ``stamp``: pass the launch time to the job (MPICD_LAUNCHED_AT) for its start-up phases. The
    whole process group is killed after ``timeout`` seconds or on an interrupt: never a hang.
    """
    command = [*launcher(n, unbound), sys.executable, *argv]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("MPICD_LAUNCHED_AT", None)
    lines: list[tuple[float, str]] = []
    launched = time.time()
    if stamp:
        env["MPICD_LAUNCHED_AT"] = repr(launched)
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True
    )
    expired = threading.Event()

    def kill() -> None:
        expired.set()
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    timer = threading.Timer(timeout, kill)
    timer.start()
    try:
        for line in proc.stdout:
            lines.append((time.time(), line.rstrip("\n")))
        code = proc.wait()
    except BaseException:
        kill()
        proc.wait()
        raise
    finally:
        timer.cancel()
    if code != 0:
        tail = "\n".join(text for _, text in lines[-40:])
        why = f"killed after {timeout:.0f} s" if expired.is_set() else f"exit status {code}"
        raise BenchError(f"{' '.join(command)}: {why}\n{tail}")
    return launched, lines


def machine() -> dict:
    info = {
        "host": platform.node(),
        "system": platform.platform(),
        "python": platform.python_version(),
        "cores": os.cpu_count(),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }
    try:
        cpu = Path("/proc/cpuinfo").read_text()
        info["cpu"] = re.search(r"model name\s*:\s*(.*)", cpu).group(1).strip()
        mem = Path("/proc/meminfo").read_text()
        info["memory_gib"] = round(int(re.search(r"MemTotal:\s*(\d+)", mem).group(1)) / 2**20, 1)
    except (OSError, AttributeError):
        info["cpu"] = platform.processor()
    prefix = launcher(2)
    info["launcher"] = " ".join(prefix[:1] + prefix[3:])
    try:
        version = subprocess.run([prefix[0], "--version"], capture_output=True, text=True, timeout=60)
        info["mpi"] = (version.stdout or version.stderr).strip().splitlines()[0]
    except (OSError, IndexError, subprocess.SubprocessError):
        info["mpi"] = None
    return info
