"""Many runs of a sweep in one allocation: ``mpirun -n M mpicd pack SWEEP.yaml``.

The world is split into groups of the runs' client count (``MPI.Comm.Split``; of fewer ranks, up
to the job's, where every run packs its clients with ``clients_per_rank: balanced``); each group's
leader takes the next pending run from a counter on world rank 0 (one-sided ``Fetch_and_op``,
so no rank has to serve requests) and broadcasts it to its group, which runs it exactly as
``mpicd run --resume`` would, on the group's own communicator: its own ledger, its own
collective results file. Finished runs are skipped and interrupted ones resume from their
checkpoints, so a packed job that dies resumes too. Each leader prints a line when its run starts
and ends, with the job's progress: runs finished and failed over all groups (counted beside the
run counter), time elapsed and an estimate of the time left.

Placement is decided once on the whole world: the GPU by the rank's local rank on its node, CPU
threads = the node's cores divided by all of the job's ranks on that node (or
SLURM_CPUS_PER_TASK). A packed run therefore equals a run launched alone with the same number
of threads per rank, bit for bit on CPU.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

import numpy as np
from mpi4py import MPI

from mpicd.config.loading import load_config
from mpicd.config.sections import ConfigError
from mpicd.core.durations import duration
from mpicd.mpi import launch
from mpicd.mpi.comm import Comm
from mpicd.mpi.placement import abort_on_exception, place
from mpicd.run import runner, signals
from mpicd.run.loop import run_rounds
from mpicd.run.plan import prepare
from mpicd.run.runner import agreed
from mpicd.sweep.grid import is_done, load_sweep, progress


def _wait(request: MPI.Request, pause: float = 0.05) -> None:
    """Complete a non-blocking collective without busy-waiting (idle ranks leave the cores to the others)."""
    while not request.Test():
        time.sleep(pause)


class Counter:
    """Shared integers on world rank 0: the next run to take, and for progress lines the runs
    finished, failed and their milliseconds; ``add`` adds to some and returns them, atomically."""

    NEXT, FINISHED, FAILED, MILLISECONDS = range(4)

    def __init__(self, comm: Comm):
        self.ledger = comm.ledger
        try:
            self.win = MPI.Win.Allocate(8 * 4 if comm.rank == 0 else 0, 8, comm=comm.mpi)
        except MPI.Exception as err:
            raise RuntimeError(
                f"mpicd pack: MPI could not create the one-sided window of the shared run counter "
                f"({err.Get_error_string()}). Across nodes over TCP, Open MPI 4.1 has no one-sided "
                f"component by default (osc/rdma needs an RDMA network, osc/pt2pt refuses these "
                f"windows): export OMPI_MCA_osc=sm,ucx before launching, or run pack within one node"
            ) from err
        if comm.rank == 0:
            np.frombuffer(self.win.tomemory(), dtype=np.int64)[:] = 0
        comm.mpi.Barrier()  # the counter is zeroed before anyone fetches (a barrier moves no payload)

    def add(self, **amounts: int) -> dict[str, int]:
        """Add to the named slots (0: only read) under one lock; their values after the addition."""
        names = list(amounts)
        add = np.array([amounts[n] for n in names], dtype=np.int64)
        before = np.zeros(len(names), dtype=np.int64)
        start = time.perf_counter()
        self.win.Lock(0, MPI.LOCK_EXCLUSIVE)
        for i, name in enumerate(names):
            self.win.Fetch_and_op(
                [add[i : i + 1], MPI.INT64_T], [before[i : i + 1], MPI.INT64_T], 0, getattr(self, name.upper()), MPI.SUM
            )
        self.win.Unlock(0)  # the fetched values are valid from here on
        # one-sided to rank 0, counted like point-to-point (outside any run's rounds)
        self.ledger.record("p2p", add.nbytes, before.nbytes, time.perf_counter() - start)
        self.ledger.record_channel("sweep", add.nbytes, before.nbytes)
        return {name: int(before[i] + add[i]) for i, name in enumerate(names)}

    def next(self) -> int:
        return self.add(next=1)["next"] - 1

    def free(self) -> None:
        self.win.Free()


def pack(sweep_path: str, log: Callable[[str], None] = print, stop_requested=lambda: False, again: str = "") -> int:
    """Run every pending run of the sweep; returns the exit status (0, 1: a run failed, 75: stopped).
    ``again``: the command that resumes the sweep (this pack command itself: it resumes by itself)."""
    world = Comm()
    try:
        runs = agreed(world, lambda: _check_sweep(load_sweep(sweep_path), world.size))
        device = agreed(world, lambda: load_config(runs[0].config, runs[0].overrides)).device
        placement = agreed(world, lambda: place(world.mpi, device))
    except ConfigError:
        return 2
    size = group_size(runs, world.size)
    groups = world.size // size
    try:  # rank 0 reads the files; a stale one (is_done raises) fails every rank with one message
        pending = agreed(
            world,
            lambda: np.array([r.index for r in runs if not is_done(r)] if world.rank == 0 else [], dtype=np.int64),
        )
    except ConfigError:
        return 2
    count = world.bcast(np.array([len(pending)], dtype=np.int64), channel="sweep")[0]
    pending = world.bcast(pending if world.rank == 0 else np.empty(count, dtype=np.int64), channel="sweep")
    if world.rank == 0:
        log(
            f"mpicd pack: {len(runs)} runs in {sweep_path}, {count} pending; {world.size} ranks = "
            f"{groups} groups of {size}" + (f" ({world.size - groups * size} idle)" if world.size % size else "")
        )
    color = world.rank // size if world.rank < groups * size else MPI.UNDEFINED
    group_mpi = world.mpi.Split(color, key=world.rank)
    counter = Counter(world)
    failed, stopped, interrupted, started = [], False, False, time.perf_counter()

    def tally(**ended: int) -> str:  # ended: finished=1 or failed=1 with the run's milliseconds, or nothing
        n = counter.add(**{"finished": 0, "failed": 0, "milliseconds": 0, **ended})
        return progress(
            n["finished"], n["failed"], count, time.perf_counter() - started, n["milliseconds"] / 1000, groups
        )

    if group_mpi != MPI.COMM_NULL:
        scheduler = Comm(group_mpi)  # the group's scheduling traffic, apart from every run's ledger
        leader = scheduler.rank == 0
        while not stopped:
            slot = scheduler.bcast(np.array([counter.next() if leader else 0], dtype=np.int64), channel="sweep")
            if slot[0] >= count:
                break
            run = runs[int(pending[slot[0]])]
            say = (
                (lambda line, g=color, i=run.index: log(f"[group {g} run {i}] {line}"))
                if leader
                else (lambda line: None)
            )
            if leader:
                say(f"start ({slot[0] + 1} of {count} pending; {tally()}): {' '.join(run.overrides)} -> {run.output}")
            comm, began = Comm(group_mpi), time.perf_counter()  # a fresh ledger per run
            try:
                plan = agreed(comm, lambda run=run, comm=comm: prepare(load_config(run.config, run.overrides), comm))
                outcome = run_rounds(
                    plan, comm, placement, run.output, log=say, resume=True, stop_requested=stop_requested, again=again
                )
                plan.release()  # the node's shared copy of this run's data (a refused resume: at exit)
            except ConfigError as err:
                failed.append(run.index)
                if leader:
                    took = time.perf_counter() - began
                    say(f"failed after {duration(took)}: {err} ({tally(failed=1, milliseconds=round(1000 * took))})")
                continue
            stopped, interrupted = outcome.stopped, outcome.interrupted
            if not stopped and leader:  # a stopped run's leader has said so, naming ``again``
                took = time.perf_counter() - began
                say(f"done in {duration(took)} ({tally(finished=1, milliseconds=round(1000 * took))})")
        group_mpi.Free()
    _wait(world.mpi.Ibarrier())  # finished groups and idle ranks sleep until the last run ends
    counter.free()
    summary = world.allreduce_sum(
        np.array([len(failed), int(stopped), int(interrupted)], dtype=np.int64), channel="sweep"
    )
    if world.rank == 0:
        ending = (
            ("stopped early" + (f"; resume with: {again}" if again else "")) if summary[1] else "all pending runs done"
        )
        log(f"mpicd pack: finished in {time.perf_counter() - started:.1f} s; {int(summary[0])} failed, {ending}")
    if summary[1]:
        return signals.EXIT_INTERRUPTED if summary[2] else signals.EXIT_STOPPED
    return 1 if summary[0] else 0


def packs_clients(runs: list) -> bool:
    """Whether every run puts its clients on however many ranks it gets (clients_per_rank balanced)."""
    return all(r.resolved.get("clients_per_rank") == "balanced" for r in runs)


def group_size(runs: list, world_size: int) -> int:
    """Ranks per run: its clients, one per rank; where every run packs its clients (clients_per_rank
    balanced), the job's ranks up to the clients, so that 4-client runs on a 2-core machine run on 2
    ranks, two clients each (a layout changes no result: tests/mpi)."""
    clients = runs[0].ranks
    return min(clients, world_size) if packs_clients(runs) else clients


def _check_sweep(runs: list, world_size: int) -> list:
    sizes = sorted({r.ranks for r in runs})
    if len(sizes) != 1:
        raise ConfigError(
            "grid.clients",
            f"mpicd pack needs one client count per sweep, this one has "
            f"{sizes}: split it into one sweep file per count",
        )
    if world_size < sizes[0] and not packs_clients(runs):
        raise ConfigError(
            "clients",
            f"each run needs {sizes[0]} ranks but the job has {world_size}: "
            f"launch at least {sizes[0]} (a multiple of it), or pack clients on ranks (clients_per_rank: balanced)",
        )
    return runs


def main(sweep_path: str) -> int:
    # launch.again, runner.say: by module, as pack's parameter ``again`` and its ``say`` are other things
    stop = signals.install()
    stop.again = launch.again(MPI.COMM_WORLD.Get_size(), ["pack", sweep_path])  # pack resumes by itself: no flag
    with abort_on_exception(MPI.COMM_WORLD):
        status = pack(sweep_path, log=runner.say, stop_requested=stop, again=stop.again)
    sys.stdout.flush()
    return status
