"""The round loop: exchange -> local epoch -> exchange -> evaluate -> write a row -> checkpoint.

Nothing algorithm-specific happens here; the algorithm's hooks are called in a fixed order and
every byte they move is counted by the communicator's ledger. A run can start from the newest
checkpoint every rank holds (``resume``) and can stop cleanly at a round boundary when any rank
was asked to (SIGUSR1 from Slurm before its time limit): all ranks agree on it in the round's
progress Allreduce, so they stop after the same round, checkpointed. Where a run starts and how each client's state comes
back: mpicd.run.resume; what the results file records besides the rounds: mpicd.run.metadata.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable

import numpy as np
import yaml

from mpicd.config.identity import config_hash
from mpicd.config.sections import ConfigError
from mpicd.evaluation import degenerate
from mpicd.mpi.assignment import Assignment
from mpicd.mpi.channels import CHANNELS, payload_channel
from mpicd.mpi.comm import Traffic
from mpicd.privacy.journal import Journal, SLOTS
from mpicd.run import checkpoint, signals
from mpicd.run.client import Client, EpochLoss
from mpicd.run.faults import FaultInjector
from mpicd.run.metadata import placement_row, results_attrs
from mpicd.run.nonfinite import NonFiniteGuard
from mpicd.run.plan import Plan
from mpicd.run.agreement import raise_agreed
from mpicd.run.resume import (
    agree_on_start,
    check_key_dir,
    client_state,
    remove_checkpoints,
    resume_point,
    site_key,
)
from mpicd.run.watchdog import Watchdog


WITHHELD = EpochLoss(float("nan"), float("nan"), float("nan"))
"""A private run's training loss in the file: each client's stays on its rank (eval.share_train_metrics)."""


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
    from mpicd.results.writer import ResultsWriter

    if resume and overwrite:
        raise ValueError("resume and overwrite exclude each other")
    cfg, out = plan.config, Path(os.path.realpath(out) if follow_symlinks else out)
    refuse_with_several_per_rank(plan, comm.size)
    key = site_key(comm)  # before anything at --out is touched: a refused key deletes nothing
    check_key_dir(plan, comm)
    decision = agree_on_start(
        comm, out, plan.resolved_config, "resume" if resume else "overwrite" if overwrite else "new"
    )
    if comm.rank == 0 and decision.note:
        log(f"mpicd: {decision.note}")
    if comm.rank == 0 and plan.privacy is not None and not plan.privacy.private:
        log("mpicd: warning: privacy.noise is seeded: NOT PRIVATE (any peer can redraw the noise from the seed)")
    if decision.complete:
        if comm.rank == 0:
            log(f"mpicd: {out} already holds all {cfg.rounds} rounds of this config; nothing to do")
        return Outcome(cfg.rounds, False, already_complete=True)
    assignment = make_assignment(plan, comm)
    shared: dict = {}
    clients = [Client(plan, comm, placement.device, c, assignment.owner, shared) for c in assignment.mine]
    nonce = begin_privacy(plan, clients, comm, out, decision.run_id, key)
    start = 0 if decision.fresh else resume_point(plan, clients, comm, out, decision, key)
    if start == 0 and plan.privacy is not None:  # round 1: a key folder without a client's key gets it now
        for c in clients:
            c.algorithm.ctx.privacy.ensure_key()
    if resume and not decision.fresh and comm.rank == 0:
        log(
            f"mpicd: resuming at round {start + 1} from {checkpoint.folder_for(out)} (run {decision.run_id})"
            if start
            else f"mpicd: no checkpoint of run {decision.run_id} at or before round {decision.bound}; "
            "starting again at round 1"
        )
    test_counts = np.bincount(plan.dataset.test.y, minlength=plan.dataset.num_classes)
    writer = ResultsWriter(
        out,
        comm,
        rounds=cfg.rounds,
        num_classes=plan.dataset.num_classes,
        attrs={
            **results_attrs(plan, clients[0]),
            "run_id": decision.run_id,
            "config_hash": config_hash(plan.resolved_config),
            **privacy_run_attrs(plan, nonce),
        },
        train_counts=plan.partition.train_counts,
        test_counts=np.tile(test_counts, (cfg.clients, 1)),
        expertise=plan.partition.expertise,
        placement=placement_row(placement),
        parallel=parallel_io,
        resume_at=start or None,
        clients=assignment.mine,
        num_clients=cfg.clients,
        private=plan.privacy is not None,
        generic=plan.algorithm_cls.scores_generic,
    )
    # The assignment this job runs on (mpicd.mpi.assignment; a resumed job's may differ from the first one's).
    writer.set_attr("ranks", comm.size)
    writer.set_attr("client_rank", assignment.owner)
    if startup is not None:
        writer.set_attr(
            "startup_seconds", yaml.safe_dump({k: round(float(v), 4) for k, v in startup.items()}, sort_keys=False)
        )
    watchdog, fault, guards = _guards(plan, clients, comm, writer)
    comm.declare(payload_channel(plan.algorithm_cls, plan.algorithm_params))
    try:
        outcome = _rounds(
            plan, clients, comm, writer, out, start, log, stop_requested, watchdog, fault, guards, decision.run_id, key
        )
    finally:
        watchdog.stop()
        comm.on_transfer = comm.after_transfer = None
        comm.declare(CHANNELS["payload"])
    if outcome.stopped and comm.rank == 0:
        resume = f"; resume with: {again}" if again else ""
        log(f"mpicd: stopped on request after round {outcome.completed_rounds}{resume}")
    return outcome


def begin_privacy(plan: Plan, clients: list[Client], comm, out: Path, run_id: str, key: bytes) -> str | None:
    """Each private client's nonce (the run id, or privacy.nonce) and release journal (beside its
    checkpoints); returns the nonce (None: privacy off). A journal that does not read (or whose MACs
    under the site key ``key`` fail) stops the run on every rank (collective), a ConfigError naming it."""
    if plan.privacy is None:
        return None
    nonce = plan.privacy.nonce or run_id
    folder = checkpoint.folder_for(out)
    unread = None
    for c in clients:
        path = checkpoint.journal_path(folder, c.index, run_id)
        try:
            journal = Journal(path, key)
        except (OSError, ValueError) as err:
            unread = unread or ConfigError(
                "--resume",
                f"{err}: what the client released cannot be known, so the run cannot go on; restore the file, or "
                "pass --overwrite to start a new run (the releases already sent stay out of its epsilon)",
            )
            journal = None
        c.algorithm.ctx.privacy.begin(nonce, journal)
    raise_agreed(comm, unread)  # the rank that read it says why, in one line
    return nonce


def privacy_run_attrs(plan: Plan, nonce: str | None) -> dict:
    """The attrs a private run's file records of this run: its nonce and whence it came; and why its
    training metrics are NaN (privacy on: they stay on each client's rank)."""
    if plan.privacy is None:
        return {}
    named = plan.privacy.nonce is not None
    return {
        "privacy_nonce": nonce,
        "privacy_nonce_from": (
            "privacy.nonce: REPEATS the noise of the run whose privacy_nonce this is, with the same keys (two such "
            "runs' releases subtract to the difference of their sums)"
            if named
            else "the run id: 64 random bits drawn at the run's first start, no other run's"
        ),
        "train_metrics": "withheld: privacy is on, so each client's training loss and training-split scores stay on "
        "its rank (NaN here; eval.share_train_metrics)",
    }


def _guards(plan: Plan, clients: list[Client], comm, writer):
    """The round's watchdog, fault injector (on the rank's first client's model) and a non-finite
    guard per client, wired to the comm layer and writer."""
    from mpi4py import MPI

    cfg = plan.config
    watchdog = Watchdog(cfg.timeout.round_seconds, comm.rank, MPI.COMM_WORLD.Abort)
    fault = FaultInjector(
        cfg.debug,
        comm.rank,
        clients[0].model,
        on_hang=lambda: setattr(watchdog, "phase", "hanging on purpose (debug.fail_kind=hang)"),
    )

    def entering(operation: str, outgoing: list) -> None:
        watchdog.phase = f"waiting in {operation}"
        fault.at("in_exchange", outgoing)

    def left() -> None:
        watchdog.phase = "computing"

    comm.on_transfer, comm.after_transfer = entering, left
    writer.on_write = lambda: fault.at("in_write")
    return watchdog, fault, {c.index: NonFiniteGuard(cfg.on_nonfinite, c, comm) for c in clients}


def _rounds(
    plan: Plan,
    clients: list[Client],
    comm,
    writer,
    out: Path,
    start: int,
    log,
    stop_requested,
    watchdog: Watchdog,
    fault: FaultInjector,
    guards: dict[int, NonFiniteGuard],
    run_id: str,
    key: bytes,
) -> Outcome:
    from mpicd.results.columns import RoundRow
    from mpicd.results.writer import flush_interval
    from mpicd.run.client import evaluate_clients, train_clients
    from mpicd.run.participation import participants

    from mpicd.core.durations import duration

    cfg, ledger, every = plan.config, comm.ledger, plan.config.checkpoint.every
    flush_every = flush_interval(cfg.checkpoint.flush_every, comm.size)
    # several clients per rank, or partial participation: the rank-level path, with rows per client
    many = len(clients) > 1 or cfg.clients != comm.size or cfg.participation < 1
    first = clients[0]
    began = time.perf_counter()
    one_class: dict[int, list[bool]] = {c.index: [] for c in clients}  # per evaluated round: one-hot test recall
    withhold = plan.privacy is not None  # training metrics stay on their rank (privacy_run_attrs)
    for r in range(start, cfg.rounds):
        started = time.perf_counter()
        ledger.begin_round(tuple(c.index for c in clients) if many else ())
        comm.round_index = r
        fault.begin_round(r)
        watchdog.begin_round(r)
        for guard in guards.values():
            guard.begin_round()
        taking = participants(cfg.seed, r, cfg.clients, cfg.participation)  # None: every client
        for c in clients:
            c.algorithm.ctx.participants = taking
        watchdog.phase = "training"
        if many:
            losses, train_seconds = train_clients(clients, r, fault, guards)
        else:
            losses = {first.index: first.train_round(r, fault, guards[first.index])}
        trained = time.perf_counter()
        scores = {c.index: (None, None, None) for c in clients}  # not evaluated (eval.every): NaN metrics
        generic = {c.index: (None, None) for c in clients}  # a method's generic model (scores_generic)
        eval_seconds = dict.fromkeys(scores, 0.0)
        if (r + 1) % cfg.eval.every == 0 or r + 1 == cfg.rounds:
            watchdog.phase = "evaluating"
            held_out = ("test", "val") if "val" in first.eval_sets else ("test",)
            found, eval_seconds = evaluate_clients(clients, held_out, once=cfg.eval.shared_models == "once")
            for c in clients:
                began_eval = time.perf_counter()
                own = c.evaluate("train") if cfg.eval.train_split else None  # audit: its own training images
                eval_seconds[c.index] += time.perf_counter() - began_eval
                scores[c.index] = (found[c.index]["test"], found[c.index].get("val"), own)
                generic[c.index] = (found[c.index].get("generic_test"), found[c.index].get("generic_val"))
                one_class[c.index].append(bool(degenerate.one_hot(found[c.index]["test"].recall)))
        traffic = ledger.end_round()
        finished = time.perf_counter()
        elapsed = finished - started
        diag = None
        if cfg.eval.diagnostics:  # after end_round: the probe features count outside rounds
            watchdog.phase = "diagnostics (eval.diagnostics)"
            diag = first.round_diagnostics(r)  # one client per rank (run refuses it otherwise)
        # Outside the round's ledger row: the stop agreement (control: every rank needs it), and
        # the progress line's figures, gathered to rank 0 alone (instrumentation, mpicd.mpi.channels).
        asked = int(comm.allreduce_sum(np.array([stop_requested()], dtype=np.int64), channel="stop")[0])
        stop = asked > 0 and r + 1 < cfg.rounds
        interrupted = asked >= signals.INTERRUPTED
        minority = [scores[c.index][0].minority_acc for c in clients if scores[c.index][0] is not None]
        progress = comm.gather(
            np.array([sum(minority) if minority else np.nan, traffic.total_sent, elapsed]), channel="progress"
        )
        summary = progress.sum(axis=0) if progress is not None else None
        watchdog.phase = "writing the results row"
        rows = {}
        for c in clients:
            test, val, own = scores[c.index]
            if many:
                mine = ledger.client_rows[c.index]
                timing = dict(
                    compute_seconds=train_seconds[c.index] + eval_seconds[c.index] - mine.seconds,
                    train_seconds=train_seconds[c.index] - mine.seconds,
                    eval_seconds=eval_seconds[c.index],
                )
            else:
                mine = traffic
                timing = dict(
                    compute_seconds=elapsed - traffic.seconds,
                    train_seconds=trained - started - traffic.seconds,
                    eval_seconds=finished - trained,
                )
            rows[c.index] = RoundRow(
                loss=WITHHELD if withhold else losses[c.index],
                test=test,
                val=val,
                train=None if withhold else own,
                generic_test=generic[c.index][0],
                generic_val=generic[c.index][1],
                traffic=mine,
                mpi=traffic if c is first else Traffic(),
                teacher=c.algorithm.teacher(),
                skipped=int(guards[c.index].dropped),
                participated=int(c.algorithm.ctx.participating),
                diag=diag,
                **privacy_row(c, r),
                **timing,
            )
        writer.write_round(
            r,
            rows,
            flush=stop or (r + 1) % flush_every == 0 or r + 1 == cfg.rounds,
        )
        getattr(stop_requested, "round_took", lambda seconds: None)(time.perf_counter() - started)
        if comm.rank == 0:
            minority = "     -" if np.isnan(summary[0]) else f"{summary[0] / cfg.clients:.4f}"
            ran = time.perf_counter() - began
            left = ran / (r + 1 - start) * (cfg.rounds - r - 1)
            log(
                f"round {r + 1:>4}/{cfg.rounds}  minority_acc {minority}  "
                f"bytes {int(summary[1]):>12,d}  {summary[2] / comm.size:6.2f} s  "
                f"({duration(ran)} elapsed, about {duration(left)} left)"
            )
        watchdog.phase = "checkpointing"
        if ((every and (r + 1) % every == 0) or stop) and r + 1 < cfg.rounds:
            for c in clients:  # one file per client (named by the client), whatever rank holds it
                checkpoint.save(
                    checkpoint.folder_for(out),
                    c.index,
                    r + 1,
                    client_state(plan, c, ledger, outside=c is first),
                    run_id,
                    during=lambda: fault.at("in_checkpoint"),
                    claimed=writer.claimed,
                    key=key,
                )
        if stop:
            writer.close(outside=_outside(clients, ledger))
            # srun --kill-on-bad-exit ends every rank once one exits with 75: nobody leaves before
            # all have checkpointed and closed the file (a barrier moves no payload bytes).
            comm.mpi.Barrier()
            getattr(stop_requested, "done", threading.Event()).set()  # the interrupt watcher stands down
            return Outcome(r + 1, True, interrupted)
        watchdog.end_round()
        comm.round_index = None
    _warn_single_class(comm, writer, one_class, log, cfg.clients)
    if stop_requested() >= signals.INTERRUPTED:  # interrupted in the last round: it ends normally
        getattr(stop_requested, "done", threading.Event()).set()
    remove_checkpoints(comm, checkpoint.folder_for(out), run_id, [c.index for c in clients])
    writer.close(outside=_outside(clients, ledger))  # only on success: a failing rank aborts instead
    return Outcome(cfg.rounds, False)


def privacy_row(client: Client, round_index: int) -> dict:
    """The round's /metrics/epsilon, privacy_stopped and the releases it granted, in slots (q,
    multiplier, steps: what mpicd verify recomputes epsilon from) of a client (nothing: privacy off)."""
    budget = client.algorithm.ctx.privacy
    if budget is None:
        return {}
    q, multiplier, steps = np.full(SLOTS, np.nan), np.full(SLOTS, np.nan), np.zeros(SLOTS, dtype=np.int64)
    for slot, release in enumerate(budget.releases.get(round_index, [])):
        q[slot], multiplier[slot], steps[slot] = release
    return {
        "epsilon": budget.epsilon,
        "privacy_stopped": int(budget.stopped(round_index)),
        "privacy_q": q,
        "privacy_multiplier": multiplier,
        "privacy_steps": steps,
    }


def _outside(clients: list[Client], ledger) -> dict[int, Traffic]:
    """The rank's traffic outside rounds, on its first client (its others: none), as checkpointed."""
    return {c.index: ledger.outside_rounds if i == 0 else Traffic() for i, c in enumerate(clients)}


def _warn_single_class(comm, writer, one_class: dict[int, list[bool]], log, clients: int) -> None:
    """After the last round (outside rounds: one Allreduce of a flag per client): record and warn
    about clients that predicted a single class in their last evaluated rounds (mpicd.evaluation.degenerate)."""
    mine = np.zeros(clients, dtype=np.int64)
    last = 0
    for c, flags in one_class.items():
        last = min(degenerate.LAST_ROUNDS, len(flags))
        mine[c] = int(last > 0 and all(flags[-last:]))
    flagged = [int(c) for c in np.flatnonzero(comm.allreduce_sum(mine, channel="single_class"))]
    writer.set_attr("single_class_clients", np.array(flagged, dtype=np.int64))
    if flagged and comm.rank == 0:
        log(f"mpicd: warning: {degenerate.warning(flagged, clients, last)}")
