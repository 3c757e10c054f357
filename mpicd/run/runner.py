"""One ``mpicd run`` on every rank: agree on the config and the rank count, load the data once per
node, place the ranks, check the output location, then the round loop. ``mpicd pack`` and ``mpicd
bench`` reuse its pieces (``agreed``, ``say``, the start-up phases); the command line only calls it.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import TypeVar
from collections.abc import Callable

from mpicd.config.loading import load_config
from mpicd.config.sections import ConfigError
from mpicd.mpi.launch import again
from mpicd.run import signals
from mpicd.run.agreement import raise_agreed

T = TypeVar("T")
EXIT_BAD_INPUT = 2
_LOADED_AT: float | None = time.time()  # start-up origin of a process's first run (`python -m mpicd`)


def run(args: argparse.Namespace) -> int:
    # Imported here, not at the top: mpi4py.MPI initialises MPI when imported (`mpicd --help` must not),
    # and what the rounds need imports torch (about 1.5 s), which waits until the config and the rank count
    # are agreed, so a wrong -n or key fails first.
    from mpicd.mpi.comm import Comm
    from mpicd.mpi.placement import abort_on_exception

    global _LOADED_AT
    marks, _LOADED_AT = [_LOADED_AT or time.time()], None  # a later run in this process starts here
    stop = signals.install()
    comm = Comm()
    stop.again = again(comm.size, run_words(args, resume=True))  # how the interrupt watcher's exit says to resume
    marks.append(time.time())
    with abort_on_exception(comm.mpi, where=comm.where):
        try:  # the config and the rank count first: a wrong -n / --ntasks fails before torch or the data load
            config = agreed(comm, lambda: _config_for(comm, args))
            marks.append(time.time())
            # torch (seconds of start-up) and the data: only once the config and rank count are agreed
            from mpicd.mpi.placement import place
            from mpicd.run.loop import run_rounds
            from mpicd.run.metadata import placement_row
            from mpicd.run.plan import prepare

            marks.append(time.time())
            plan = agreed(comm, lambda: prepare(config, comm))  # read once per node, shared
            marks.append(time.time())
            placement = agreed(comm, lambda: place(comm.mpi, plan.config.device))
            marks.append(time.time())
            out = args.out or plan.config.output
            agreed(comm, lambda: comm.rank == 0 and _check_output(plan, out))
            marks.append(time.time())
        except ConfigError:
            return EXIT_BAD_INPUT
        startup = startup_seconds(comm, marks)
        if comm.rank == 0 and getattr(plan.dataset, "md5", None) is not None:
            from mpicd.data.medmnist import md5_check  # a MedMNIST file only

            official, line = md5_check(plan.dataset.name, plan.dataset.md5)
            if not official:
                say(f"mpicd: warning: {line}", sys.stderr)
        if comm.rank == 0:
            from mpicd.run.check import warnings  # torch, as above

            for line in warnings(plan):
                say(f"mpicd: warning: {line}", sys.stderr)
        if comm.rank == 0:
            say(
                f"mpicd: {plan.algorithm_cls.name} on {plan.dataset.name}, {plan.config.clients} clients"
                f"{'' if plan.config.clients == comm.size else f' on {comm.size} ranks'}, "
                f"{plan.config.rounds} rounds, {placement.device} ({placement.threads} threads/rank) "
                f"-> {out}"
            )
        row = placement_row(placement)
        say(
            f"mpicd: rank {comm.rank} on {row['host']}: local rank {row['local_rank']}, {row['device']}, "
            f"{row['threads']} threads"
        )
        try:  # a refused start or resume raises on every rank at the same point (RunFolder.start)
            outcome = run_rounds(
                plan,
                comm,
                placement,
                out,
                resume=args.resume,
                overwrite=args.overwrite,
                log=say,
                stop_requested=stop,
                startup=startup,
                again=stop.again,
                follow_symlinks=getattr(args, "follow_symlinks", False),
            )
        except ConfigError as err:
            if comm.rank == 0 and not getattr(err, "told", False):  # told: the rank that knew has said it
                say(f"mpicd: {err}", sys.stderr)
            return EXIT_BAD_INPUT
        if outcome.stopped:
            return signals.EXIT_INTERRUPTED if outcome.interrupted else signals.EXIT_STOPPED
        if comm.rank == 0 and not outcome.already_complete:
            say(f"mpicd: results written to {out}")
    return 0


def say(line: str, stream=None) -> None:
    """One write per line (print writes the newline apart): under mpirun another rank's output
    can never land inside it."""
    stream = stream or sys.stdout
    stream.write(line + "\n")
    stream.flush()


# Rank 0's start-up, split at the marks of ``run`` (wall seconds; a collective step includes waiting
# for the slowest rank). ``launch``: from MPICD_LAUNCHED_AT (epoch seconds, set by whoever starts
# mpirun, e.g. ``mpicd bench``) to this module's import; the model build and the results file's
# creation happen in the round loop, after these.
STARTUP_PHASES = ("launch", "mpi_init", "config", "imports", "data", "placement", "output_check")


def startup_seconds(comm, marks: list[float]) -> dict[str, float]:
    """Rank 0's seconds per start-up phase, the same dict on every rank (one Bcast, outside rounds)."""
    import numpy as np

    launched = os.environ.get("MPICD_LAUNCHED_AT", "")
    try:
        launch = marks[0] - float(launched) if launched else -1.0
    except ValueError:
        launch = -1.0
    phases = comm.bcast(np.array([launch, *np.diff(marks)], dtype=np.float64), channel="launch")
    return {name: float(s) for name, s in zip(STARTUP_PHASES, phases) if s >= 0}


def _check_output(plan, out: str) -> None:
    """The results folder is writable and has room for the file and the checkpoints (rank 0 only)."""
    from mpicd.results.writer import check_output_location, estimated_bytes  # h5py: after the config, as above

    cfg = plan.config
    check_output_location(
        out,
        estimated_bytes(
            cfg.rounds, cfg.clients, plan.dataset.num_classes, plan.num_parameters, cfg.checkpoint.every > 0
        ),
    )


def _config_for(comm, args):
    from mpicd.mpi.assignment import check_ranks  # numpy: not on `mpicd --help`'s path, which imports this module

    config = load_config(args.config, args.overrides)
    check_ranks(config.clients, comm.size, config.clients_per_rank, launch_hint(config.clients, words=run_words(args)))
    return config


def launch_hint(ranks: int, env: dict | None = None, words: list[str] | None = None) -> str:
    """How to start ``ranks`` ranks with the launcher in use: Slurm's task count, else the wrapper the
    user ran (MPICD_COMMAND, with the mpicd ``words``), else mpirun's -n."""
    env = os.environ if env is None else env
    if "SLURM_JOB_ID" in env:
        return f"submit with sbatch --ntasks={ranks} (inside an allocation: srun -n {ranks})"
    if env.get("MPICD_COMMAND") and words:
        return f"run {again(ranks, words, env)}"
    return f"run mpirun -n {ranks}"


def run_words(args: argparse.Namespace, resume: bool = False) -> list[str]:
    """``mpicd run``'s arguments as ``args`` holds them; ``resume``: with --resume for --overwrite."""
    words = ["run", args.config, *args.overrides, *(["--out", args.out] if args.out else [])]
    words += ["--follow-symlinks"] if getattr(args, "follow_symlinks", False) else []
    if resume or args.resume:
        return [*words, "--resume"]
    return [*words, "--overwrite"] if args.overwrite else words


def agreed(comm, step: Callable[[], T]) -> T:
    """Run ``step`` on every rank; if it raises ConfigError anywhere, every rank raises.

    The lowest failing rank prints its message, so the user sees one clear error and no rank
    is left waiting in a collective that the others never reach.
    """
    error: ConfigError | None = None
    result = None
    try:
        result = step()
    except ConfigError as err:
        error = err
    raise_agreed(comm, error)
    return result
