"""Many runs of a sweep in one allocation: ``mpirun -n M mpicd pack SWEEP.yaml``.

The world is split into groups of the runs' client count (``MPI.Comm.Split``); each group's
leader takes the next pending run from a counter on world rank 0 (one-sided ``Fetch_and_op``,
so no rank has to serve requests) and broadcasts it to its group, which runs it exactly as
``mpicd run --resume`` would, on the group's own communicator: its own ledger, its own
collective results file. Finished runs are skipped and interrupted ones resume from their
checkpoints, so a packed job that dies resumes too.

Placement is decided once on the whole world: the GPU by the rank's local rank on its node, CPU
threads = the node's cores divided by all of the job's ranks on that node (or
SLURM_CPUS_PER_TASK). A packed run therefore equals a run launched alone with the same number
of threads per rank, bit for bit on CPU.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np
from mpi4py import MPI

from .comm import Comm
from .config import ConfigError, load_config
from .sweep import is_done, load_sweep


def _wait(request: MPI.Request, pause: float = 0.05) -> None:
    """Complete a non-blocking collective without busy-waiting (idle ranks leave the cores to the others)."""
    while not request.Test():
        time.sleep(pause)


class Counter:
    """A shared integer on world rank 0; ``next()`` returns it and adds one, atomically."""

    def __init__(self, comm: MPI.Comm):
        self.win = MPI.Win.Allocate(8 if comm.Get_rank() == 0 else 0, 8, comm=comm)
        if comm.Get_rank() == 0:
            np.frombuffer(self.win.tomemory(), dtype=np.int64)[0] = 0
        comm.Barrier()  # the counter is zeroed before anyone fetches

    def next(self) -> int:
        one, value = np.ones(1, dtype=np.int64), np.zeros(1, dtype=np.int64)
        self.win.Lock(0, MPI.LOCK_EXCLUSIVE)
        self.win.Fetch_and_op([one, MPI.INT64_T], [value, MPI.INT64_T], 0, 0, MPI.SUM)
        self.win.Unlock(0)
        return int(value[0])

    def free(self) -> None:
        self.win.Free()


def pack(sweep_path: str, log: Callable[[str], None] = print, stop_requested=lambda: False) -> int:
    """Run every pending run of the sweep; returns the exit status (0, 1: a run failed, 75: stopped)."""
    from . import signals
    from .cli import agreed
    from .loop import run as run_rounds
    from .plan import prepare
    from .runtime import place

    world = Comm()
    try:
        runs = agreed(world, lambda: _check_sweep(load_sweep(sweep_path), world.size))
        device = agreed(world, lambda: load_config(runs[0].config, runs[0].overrides)).device
        placement = agreed(world, lambda: place(world.mpi, device))
    except ConfigError:
        return 2
    size = runs[0].ranks
    groups = world.size // size
    pending = np.array([r.index for r in runs if not is_done(r)] if world.rank == 0 else [], dtype=np.int64)
    count = world.bcast(np.array([len(pending)], dtype=np.int64))[0]
    pending = world.bcast(pending if world.rank == 0 else np.empty(count, dtype=np.int64))
    if world.rank == 0:
        log(f"mpicd pack: {len(runs)} runs in {sweep_path}, {count} pending; {world.size} ranks = "
            f"{groups} groups of {size}" + (f" ({world.size - groups * size} idle)" if world.size % size else ""))
    color = world.rank // size if world.rank < groups * size else MPI.UNDEFINED
    group_mpi = world.mpi.Split(color, key=world.rank)
    counter = Counter(world.mpi)
    failed, stopped, started = [], False, time.perf_counter()
    if group_mpi != MPI.COMM_NULL:
        leader = group_mpi.Get_rank() == 0
        while not stopped:
            slot = np.array([counter.next() if leader else 0], dtype=np.int64)
            group_mpi.Bcast(slot, root=0)
            if slot[0] >= count:
                break
            run = runs[int(pending[slot[0]])]
            say = (lambda line, g=color, i=run.index: log(f"[group {g} run {i}] {line}")) if leader else (lambda line: None)
            say(f"start ({slot[0] + 1} of {count} pending, {time.perf_counter() - started:.0f} s into the job): "
                f"{' '.join(run.overrides)} -> {run.output}")
            comm = Comm(group_mpi)  # a fresh ledger per run
            try:
                plan = agreed(comm, lambda: prepare(load_config(run.config, run.overrides)))
                outcome = run_rounds(plan, comm, placement, run.output, log=say, resume=True,
                                     stop_requested=stop_requested)
            except ConfigError as err:
                say(f"failed: {err}")
                failed.append(run.index)
                continue
            stopped = outcome.stopped
            say("stopped on request; resubmit to resume" if stopped else "done")
        group_mpi.Free()
    _wait(world.mpi.Ibarrier())  # finished groups and idle ranks sleep until the last run ends
    counter.free()
    summary = world.allreduce_sum(np.array([len(failed), int(stopped)], dtype=np.int64))
    if world.rank == 0:
        log(f"mpicd pack: finished in {time.perf_counter() - started:.1f} s; "
            f"{int(summary[0])} failed, {'stopped early' if summary[1] else 'all pending runs done'}")
    if summary[1]:
        return signals.EXIT_STOPPED
    return 1 if summary[0] else 0


def _check_sweep(runs: list, world_size: int) -> list:
    sizes = sorted({r.ranks for r in runs})
    if len(sizes) != 1:
        raise ConfigError("grid.clients", f"mpicd pack needs one client count per sweep, this one has "
                                          f"{sizes}: split it into one sweep file per count")
    if world_size < sizes[0]:
        raise ConfigError("clients", f"each run needs {sizes[0]} ranks but the job has {world_size}: "
                                     f"launch at least {sizes[0]} (a multiple of it)")
    return runs


def main(sweep_path: str) -> int:
    from . import signals
    from .runtime import abort_on_exception

    stop = signals.install()
    with abort_on_exception(MPI.COMM_WORLD):
        status = pack(sweep_path, log=lambda line: print(line, flush=True), stop_requested=stop)
    sys.stdout.flush()
    return status
