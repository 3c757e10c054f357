"""A run on every rank: where it starts, its clients, its observers, then the rounds.

:func:`run_rounds` is what ``mpicd run``, ``mpicd pack`` and ``mpicd bench`` call. The rounds themselves
are :mod:`mpicd.run.engine`'s; each other concern is an observer in its own module: the results file
and checkpoints (:mod:`mpicd.run.recording`), the watchdog and fault injection
(:mod:`mpicd.run.supervision`), the non-finite guard (:mod:`mpicd.run.nonfinite`), progress and the stop
agreement (:mod:`mpicd.run.progress`), privacy bookkeeping (:mod:`mpicd.run.privacy_records`).
Everything at ``--out`` belongs to :class:`mpicd.run.folder.RunFolder`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable

from mpicd.config.sections import ConfigError
from mpicd.mpi.assignment import Assignment
from mpicd.mpi.channels import CHANNELS, payload_channel
from mpicd.run.client import Client
from mpicd.run.engine import RoundEngine
from mpicd.run.folder import RunFolder
from mpicd.run.nonfinite import NonFiniteGuards
from mpicd.run.plan import Plan
from mpicd.run.privacy_records import PrivacyRecords
from mpicd.run.progress import Progress
from mpicd.run.recording import Recorder
from mpicd.run.supervision import Supervisor


@dataclass(frozen=True)
class Outcome:
    completed_rounds: int
    stopped: bool  # True: stopped early on request, checkpointed, resumable
    interrupted: bool = False  # stopped by SIGINT / SIGTERM (Ctrl-C, scancel) rather than SIGUSR1
    already_complete: bool = False  # --resume found every round in the file: nothing was run


def make_assignment(plan: Plan, comm) -> Assignment:
    """The run's assignment of clients to ranks (mpicd.mpi.assignment), by training-set size."""
    sizes = plan.partition.train_counts.sum(axis=1)
    if plan.config.clients_per_rank == "one":
        return Assignment.one_per_rank(plan.config.clients, comm.rank)
    return Assignment.of(sizes, comm.size, comm.rank)


def refuse_with_several_per_rank(plan: Plan, ranks: int) -> None:
    """What runs only with one client per rank (every rank raises the same ConfigError)."""
    cfg = plan.config
    params = plan.algorithm_params
    if cfg.participation < 1:
        partial = {
            "algorithm.name": plan.algorithm_cls.name == "fedamp",
            "algorithm.teacher_per": getattr(params, "teacher_per", "round") == "batch",
            "algorithm.classes": getattr(params, "classes", "expertise") == "all",
            "eval.diagnostics": cfg.eval.diagnostics,
            "on_nonfinite": cfg.on_nonfinite == "skip",
        }
        for key, used in partial.items():
            if used:
                raise ConfigError(key, f"does not support participation < 1 yet (participation is {cfg.participation})")
    if cfg.clients == ranks:
        return
    refused = {
        "eval.diagnostics": cfg.eval.diagnostics,
        "on_nonfinite": cfg.on_nonfinite == "skip",
        # a spent teacher's R would be missing from a message of several teachers' rows
        "privacy.epsilon": plan.algorithm_cls.name == "codistill"
        and cfg.privacy is not None
        and cfg.privacy.epsilon is not None
        and cfg.privacy.noise_multiplier is not None,
        "algorithm.exchange": getattr(plan.algorithm_params, "exchange", None) == "ring",
    }
    for key, used in refused.items():
        if used:
            raise ConfigError(
                key,
                f"runs only with one client per rank for now, but the job has {ranks} ranks for "
                f"{cfg.clients} clients (clients_per_rank: balanced)",
            )


def run_rounds(
    plan: Plan,
    comm,
    placement,
    out: str | Path,
    log: Callable[[str], None] = print,
    parallel_io: bool | None = None,
    resume: bool = False,
    stop_requested: Callable[[], int] = lambda: 0,
    startup: dict | None = None,
    overwrite: bool = False,
    again: str = "",
    follow_symlinks: bool = False,
) -> Outcome:
    """Train the config's rounds on this rank and write the results file collectively.

    What lies at ``out`` already decides where the run starts (:mod:`mpicd.run.startpoint`): without
    ``resume`` or ``overwrite`` an existing file or checkpoint is refused (ConfigError, every rank).
    ``startup``: rank 0's seconds per start-up phase (recorded as the attr ``startup_seconds``).
    ``again``: the command that resumes a stopped run, as the caller knows it (``mpicd run``'s with
    --resume, ``mpicd pack``'s as it was), for the stop line; only the caller knows what was typed.
    ``follow_symlinks``: ``out`` may be a link (the user's word, ``--follow-symlinks``): its target is
    the results file, and the checkpoints go beside the target; otherwise a link there is refused.
    """
    if resume and overwrite:
        raise ValueError("resume and overwrite exclude each other")
    cfg = plan.config
    refuse_with_several_per_rank(plan, comm.size)
    folder = RunFolder(out, comm, follow_symlinks)
    decision = folder.start(plan, "resume" if resume else "overwrite" if overwrite else "new")
    if comm.rank == 0 and decision.note:
        log(f"mpicd: {decision.note}")
    if comm.rank == 0 and plan.privacy is not None and not plan.privacy.private:
        log("mpicd: warning: privacy.noise is seeded: NOT PRIVATE (any peer can redraw the noise from the seed)")
    if decision.complete:
        if comm.rank == 0:
            log(f"mpicd: {folder.path} already holds all {cfg.rounds} rounds of this config; nothing to do")
        return Outcome(cfg.rounds, False, already_complete=True)
    assignment = make_assignment(plan, comm)
    shared: dict = {}
    clients = [Client(plan, comm, placement.device, c, assignment.owner, shared) for c in assignment.mine]
    privacy = PrivacyRecords(plan, clients, comm, folder)  # before the resume: it reads the journals
    start = folder.resume(plan, clients)
    privacy.starting(start)
    if resume and not decision.fresh and comm.rank == 0:
        log(
            f"mpicd: resuming at round {start + 1} from {folder.checkpoints} (run {decision.run_id})"
            if start
            else f"mpicd: no checkpoint of run {decision.run_id} at or before round {decision.bound}; "
            "starting again at round 1"
        )
    writer = folder.writer(
        plan, clients, assignment, placement, attrs=privacy.attrs(), start=start, startup=startup, parallel=parallel_io
    )
    supervisor = Supervisor(plan, clients, comm, writer)
    guards = NonFiniteGuards(cfg.on_nonfinite, clients, comm)
    observers = [  # every event goes to them in this order, the same on every rank: their collectives line up
        supervisor,  # the round watched from its start
        privacy,
        guards,
        Progress(plan, clients, comm, stop_requested, log, start),  # the stop agreed before the row is written
        Recorder(plan, clients, comm, folder, writer, supervisor.fault, log),
    ]
    comm.declare(payload_channel(plan.algorithm_cls, plan.algorithm_params))
    try:
        stopped = RoundEngine(plan, clients, comm, observers, (supervisor.fault, guards.guards)).run(start)
    finally:
        comm.declare(CHANNELS["payload"])
    if stopped is None:
        return Outcome(cfg.rounds, False)
    if comm.rank == 0:
        resume = f"; resume with: {again}" if again else ""
        log(f"mpicd: stopped on request after round {stopped.index + 1}{resume}")
    return Outcome(stopped.index + 1, True, stopped.interrupted)
