"""The round loop: exchange -> local epoch -> exchange -> evaluate -> write a row -> checkpoint.

Nothing algorithm-specific happens here; the algorithm's hooks are called in a fixed order and
every byte they move is counted by the communicator's ledger. A run can start from the newest
checkpoint every rank holds (``resume``) and can stop cleanly at a round boundary when any rank
was asked to (SIGUSR1 from Slurm before its time limit): all ranks agree on it in the round's
progress Allreduce, so they stop after the same round, checkpointed.
"""

from __future__ import annotations

import platform
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from collections.abc import Callable

import numpy as np
import torch
import yaml

from mpicd import __version__
from mpicd.run import checkpoint
from mpicd.evaluation import degenerate
from mpicd.run import signals
from mpicd.run import startpoint
from mpicd.algorithms import Sizes
from mpicd.run.client import Client
from mpicd.mpi.assignment import Layout
from mpicd.run.faults import FaultInjector
from mpicd.run.nonfinite import NonFiniteGuard
from mpicd.run.watchdog import Watchdog
from mpicd.mpi.channels import CHANNELS, payload_channel
from mpicd.mpi.comm import Traffic
from mpicd.config.sections import ConfigError, config_difference
from mpicd.config.identity import RUN_ID_CHARS, config_hash
from mpicd.models.networks import num_parameters
from mpicd.run.plan import Plan
from mpicd.privacy import ADJACENCY


def software_versions() -> dict:
    import h5py
    import mpi4py
    from mpi4py import MPI

    return {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "torch": str(torch.__version__),
        "h5py": h5py.__version__,
        "hdf5": h5py.version.hdf5_version,
        "h5py_mpi": bool(h5py.get_config().mpi),
        "mpi4py": mpi4py.__version__,
        "mpi": MPI.Get_library_version().splitlines()[0].strip(),
    }


def results_attrs(plan: Plan, client: Client) -> dict:
    dataset = plan.dataset
    return {
        "config": yaml.safe_dump(plan.resolved_config, sort_keys=False),
        "mpicd_version": __version__,
        "versions": yaml.safe_dump(software_versions(), sort_keys=False),
        "algorithm": plan.algorithm_cls.name,
        "dataset": dataset.name,
        "clients": plan.config.clients,
        "rounds": plan.config.rounds,
        "seed": plan.config.seed,
        "skew": plan.config.data.skew,
        "images_per_class": plan.partition.base_per_class,
        "num_parameters": num_parameters(client.model),
        "feature_dim": client.model.feature_dim,
        "num_classes": dataset.num_classes,
        "class_names": list(dataset.class_names),
        "label_map": getattr(dataset, "label_map_text", "none (the file's own labels)"),
        "data_md5": getattr(dataset, "md5", None) or "none",
        "eval_split": dataset.eval_split,
        "val_split": getattr(dataset, "val_split", "none"),
        "normalization": yaml.safe_dump(getattr(dataset, "normalization", None), sort_keys=False),
        "backends": yaml.safe_dump(backend_settings(), sort_keys=False),
        "payload_sizes": yaml.safe_dump(asdict(Sizes.of(client.model, plan.config.clients)), sort_keys=False),
        **privacy_attrs(plan),
    }


def privacy_attrs(plan: Plan) -> dict:
    """With privacy: what the accountant was given (sigma derived or not, the release's multiplier)."""
    if plan.privacy is None:
        return {}
    s = plan.privacy
    return {
        "privacy_noise_multiplier": s.sigma,
        "privacy_release_multiplier": s.sigma if plan.algorithm_cls.dpsgd else s.multiplier,
        "privacy_sample_rate": "1 / ceil(n / train.batch_size) (DP-SGD)" if plan.algorithm_cls.dpsgd else s.q,
        "privacy_clip": s.clip,
        "privacy_delta": s.delta,
        "privacy_accountant": "dp-accounting PLD, Poisson-subsampled Gaussian, per client (add/remove-one's PLD, "
        "the zero-out adjacency's for these releases: mpicd.privacy)",
        "privacy_adjacency": ADJACENCY,
        "privacy_noise": NOISE_ATTR[s.noise],
    }


NOISE_ATTR = {
    "secret": "secret: drawn from a key per client that never left its rank",
    "seeded": "seeded: NOT PRIVATE, drawn from the run's seed, which any peer can redraw (privacy.noise)",
}
"""The attr ``privacy_noise`` by privacy.noise: what a release's Poisson sample and noise were drawn from."""


def backend_settings() -> dict:
    """The kernel choices that can change results on a GPU, as this rank ran them."""
    cudnn = torch.backends.cudnn
    return {
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "cudnn_available": bool(cudnn.is_available()),
        "cudnn_version": cudnn.version() if cudnn.is_available() else None,
        "cudnn_enabled": bool(cudnn.enabled),
        "cudnn_benchmark": bool(cudnn.benchmark),
        "cudnn_deterministic": bool(cudnn.deterministic),
        "cudnn_allow_tf32": bool(cudnn.allow_tf32),
        "cuda_matmul_allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
    }


@dataclass(frozen=True)
class Outcome:
    completed_rounds: int
    stopped: bool  # True: stopped early on request, checkpointed, resumable
    interrupted: bool = False  # stopped by SIGINT / SIGTERM (Ctrl-C, scancel) rather than SIGUSR1
    already_complete: bool = False  # --resume found every round in the file: nothing was run


def _state(plan: Plan, client: Client, ledger, outside: bool = True) -> dict:
    """One client's checkpoint; ``outside``: with this rank's traffic outside rounds (its first
    client's file holds it, the others none, so a resume on any layout adds up the same total)."""
    channels = {name: list(v) for name, v in ledger.channels.items()} if outside else {}
    outside = ledger.outside_rounds if outside else Traffic()
    return {
        "config": plan.resolved_config,
        "model": client.model.state_dict(),
        "optimizer": client.optimizer.state_dict(),
        "algorithm": client.algorithm.state_dict(),
        "torch_rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state_all() if client.device.type == "cuda" else None,
        "outside_rounds": (dict(outside.bytes_sent), dict(outside.bytes_recv), outside.seconds),
        "channels": channels,
        **({} if client.algorithm.ctx.privacy is None else {"privacy": client.algorithm.ctx.privacy.state_dict()}),
    }


def _restore(client: Client, ledger, state: dict) -> None:
    client.model.load_state_dict(state["model"])
    client.optimizer.load_state_dict(state["optimizer"])
    client.algorithm.load_state_dict(state["algorithm"])
    torch.set_rng_state(state["torch_rng"].cpu())
    if state["cuda_rng"] is not None:
        torch.cuda.set_rng_state_all(state["cuda_rng"])
    if client.algorithm.ctx.privacy is not None:  # the accountant's history: epsilon goes on from there
        client.algorithm.ctx.privacy.load_state_dict(state["privacy"])
    sent, recv, seconds = state["outside_rounds"]
    previous = Traffic(dict(sent), dict(recv), seconds)
    for kind in previous.bytes_sent:  # this job's start-up traffic adds to the earlier jobs'
        ledger.outside_rounds.add(kind, previous.bytes_sent[kind], previous.bytes_recv[kind], 0.0)
    ledger.outside_rounds.seconds += previous.seconds
    for name, (sent, recv) in state.get("channels", {}).items():  # {}: a checkpoint older than channels
        ledger.record_channel(name, sent, recv)


def agree_on_checkpoint(comm, folder: Path, run_id: str, bound: int, clients: list[int] | None = None) -> int:
    """The newest rounds-completed count <= ``bound`` that every rank holds a checkpoint of run
    ``run_id`` for, of each of its ``clients`` (default: the client whose index is the rank; 0:
    none). Checkpoints are per client, so a run checkpointed on one layout resumes on any other.
    Another run's checkpoints in the folder are not looked at.

    Collective; terminates because the bound strictly decreases until every rank holds the
    candidate or it reaches 0.
    """
    held = [set(checkpoint.available(folder, c, run_id)) for c in (clients or [comm.rank])]
    mine = sorted(set.intersection(*held), reverse=True)
    while True:
        best = max((n for n in mine if n <= bound), default=0)
        candidate = int(comm.allreduce_min(np.array([best], dtype=np.int64), channel="start")[0])
        if candidate == 0:
            return 0
        held = int(comm.allreduce_min(np.array([int(candidate in mine)], dtype=np.int64), channel="start")[0])
        if held:
            return candidate
        bound = candidate - 1


def agree_on_start(comm, out: Path, resolved: dict, mode: str) -> startpoint.Start:
    """Rank 0 applies :func:`mpicd.run.startpoint.decide` to what lies at ``out`` (and, for
    ``--overwrite``, deletes it); every rank gets the same decision, or the same ConfigError."""
    decision, error = None, None
    if comm.rank == 0:
        try:
            decision = startpoint.decide(startpoint.inspect(out), resolved, mode)
            if decision.clear:
                out.unlink(missing_ok=True)
                checkpoint.remove_all(checkpoint.folder_for(out))
        except ConfigError as err:
            error = err
        except OSError as err:
            error = ConfigError("--out", f"cannot replace {out}: {err.strerror or err}")
    failing = comm.first_failing_rank(error is not None)
    if failing is not None:  # rank 0 prints it (cli.run); the others raise quietly
        raise error or ConfigError("--out", "rank 0 refused the output (see its message)")
    flags = np.zeros(4 + RUN_ID_CHARS, dtype=np.int64)
    if comm.rank == 0:
        flags[:4] = [decision.fresh, decision.complete, decision.bound, decision.clear]
        flags[4:] = np.frombuffer(decision.run_id.encode().ljust(RUN_ID_CHARS), dtype=np.uint8)
    flags = comm.bcast(flags, channel="start")
    if comm.rank == 0:
        return decision
    run_id = bytes(flags[4:].astype(np.uint8)).decode().strip()
    return startpoint.Start(bool(flags[0]), run_id, bool(flags[1]), int(flags[2]), bool(flags[3]))


def resume_point(plan: Plan, clients: list[Client], comm, out: Path, decision: startpoint.Start) -> int:
    """Load the newest checkpoint of this run that all ranks share, at or before the file's
    completed rounds (collective); returns the first round to run. This run's checkpoints past
    that point (a round the file does not hold) are deleted, so they never count among the newest two.

    A checkpoint whose config differs from this run's in anything but operational keys is
    refused with a ConfigError naming the key (raised on every rank).
    """
    folder = checkpoint.folder_for(out)
    indices = [c.index for c in clients]
    agreed = agree_on_checkpoint(comm, folder, decision.run_id, decision.bound, indices)
    states, refused = [], []
    for c in clients:
        try:
            states.append(checkpoint.load(folder, c.index, agreed, decision.run_id, c.device) if agreed else None)
        except checkpoint.Refused:
            states.append(None)
            refused.append(c.index)
    none = plan.config.clients  # more than any client index: no file was refused
    first = int(comm.allreduce_min(np.array([min(refused, default=none)], dtype=np.int64), channel="start")[0])
    if first < none:  # every rank raises, so none is left in a collective; rank 0 prints it
        raise ConfigError(
            "--resume",
            f"{checkpoint.path_for(folder, first, agreed, decision.run_id)} is not a checkpoint mpicd wrote"
            " (it holds more than tensors and plain types; nothing in it was run): move it away to resume"
            " from an older checkpoint, or start a new output",
        )
    ok = int(
        comm.allreduce_min(np.array([int(all(s is not None for s in states))], dtype=np.int64), channel="start")[0]
    )
    for c in indices:
        checkpoint.discard(folder, c, decision.run_id, newer_than=agreed if ok else -1)
    if not ok:
        return 0
    state = states[0]
    difference = config_difference(state["config"], plan.resolved_config, "the checkpoint", "this run")
    same = int(comm.allreduce_min(np.array([int(difference is None)], dtype=np.int64), channel="start")[0])
    if not same:  # every rank raises here, so none is left in a collective
        raise ConfigError(
            "--resume",
            f"the checkpoint in {folder} was made with a different config: "
            f"{difference or 'on another rank'}; use another output file or "
            f"restore the config",
        )
    for c, client_state in zip(clients, states):
        _restore(c, comm.ledger, client_state)
    return agreed


def make_layout(plan: Plan, comm) -> Layout:
    """The run's assignment of clients to ranks (mpicd.mpi.assignment), by training-set size."""
    sizes = plan.partition.train_counts.sum(axis=1)
    if plan.config.clients_per_rank == "one":
        return Layout.one_per_rank(plan.config.clients, comm.rank)
    return Layout.of(sizes, comm.size, comm.rank)


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


def run(
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
) -> Outcome:
    """Train the config's rounds on this rank and write the results file collectively.

    What lies at ``out`` already decides where the run starts (:mod:`mpicd.run.startpoint`): without
    ``resume`` or ``overwrite`` an existing file or checkpoint is refused (ConfigError, every rank).
    ``startup``: rank 0's seconds per start-up phase (recorded as the attr ``startup_seconds``).
    """
    from mpicd.results.file import ResultsWriter

    if resume and overwrite:
        raise ValueError("resume and overwrite exclude each other")
    cfg, out = plan.config, Path(out)
    refuse_with_several_per_rank(plan, comm.size)
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
    layout = make_layout(plan, comm)
    shared: dict = {}
    clients = [Client(plan, comm, placement.device, c, layout.owner, shared) for c in layout.mine]
    start = 0 if decision.fresh else resume_point(plan, clients, comm, out, decision)
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
        },
        train_counts=plan.partition.train_counts,
        test_counts=np.tile(test_counts, (cfg.clients, 1)),
        expertise=plan.partition.expertise,
        placement=placement_row(placement),
        parallel=parallel_io,
        resume_at=start or None,
        clients=layout.mine,
        num_clients=cfg.clients,
        private=plan.privacy is not None,
    )
    # The layout this job runs on (mpicd.mpi.assignment; a resumed job's may differ from the first one's).
    writer.set_attr("ranks", comm.size)
    writer.set_attr("client_rank", layout.owner)
    if startup is not None:
        writer.set_attr(
            "startup_seconds", yaml.safe_dump({k: round(float(v), 4) for k, v in startup.items()}, sort_keys=False)
        )
    watchdog, fault, guards = _guards(plan, clients, comm, writer)
    comm.declare(payload_channel(plan.algorithm_cls, plan.algorithm_params))
    try:
        return _rounds(
            plan, clients, comm, writer, out, start, log, stop_requested, watchdog, fault, guards, decision.run_id
        )
    finally:
        watchdog.stop()
        comm.on_transfer = comm.after_transfer = None
        comm.declare(CHANNELS["payload"])


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
) -> Outcome:
    from mpicd.run.client import evaluate_clients, train_clients
    from mpicd.run.participation import participants
    from mpicd.results.file import RoundRow, flush_interval

    from mpicd.core.durations import duration

    cfg, ledger, every = plan.config, comm.ledger, plan.config.checkpoint.every
    flush_every = flush_interval(cfg.checkpoint.flush_every, comm.size)
    # several clients per rank, or partial participation: the rank-level path, with rows per client
    many = len(clients) > 1 or cfg.clients != comm.size or cfg.participation < 1
    first = clients[0]
    began = time.perf_counter()
    one_class: dict[int, list[bool]] = {c.index: [] for c in clients}  # per evaluated round: one-hot test recall
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
                loss=losses[c.index],
                test=test,
                val=val,
                train=own,
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
                    _state(plan, c, ledger, outside=c is first),
                    run_id,
                    during=lambda: fault.at("in_checkpoint"),
                    claimed=writer.claimed,
                )
        if stop:
            writer.close(outside=_outside(clients, ledger))
            # srun --kill-on-bad-exit ends every rank once one exits with 75: nobody leaves before
            # all have checkpointed and closed the file (a barrier moves no payload bytes).
            comm.mpi.Barrier()
            getattr(stop_requested, "done", threading.Event()).set()  # the interrupt watcher stands down
            if comm.rank == 0:
                log(f"mpicd: stopped on request after round {r + 1}; resume with --resume")
            return Outcome(r + 1, True, interrupted)
        watchdog.end_round()
        comm.round_index = None
    _warn_single_class(comm, writer, one_class, log, cfg.clients)
    if stop_requested() >= signals.INTERRUPTED:  # interrupted in the last round: it ends normally
        getattr(stop_requested, "done", threading.Event()).set()
    _remove_checkpoints(comm, checkpoint.folder_for(out), run_id, [c.index for c in clients])
    writer.close(outside=_outside(clients, ledger))  # only on success: a failing rank aborts instead
    return Outcome(cfg.rounds, False)


def privacy_row(client: Client, round_index: int) -> dict:
    """The round's /metrics/epsilon and /metrics/privacy_stopped of a client (nothing: privacy off)."""
    budget = client.algorithm.ctx.privacy
    if budget is None:
        return {}
    return {"epsilon": budget.epsilon, "privacy_stopped": int(budget.stopped(round_index))}


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


def _remove_checkpoints(comm, folder: Path, run_id: str, clients: list[int]) -> None:
    """A complete run needs no checkpoint: each rank drops its clients', then rank 0 the folder
    (left in place if another run's files are still in it)."""
    for c in clients:
        checkpoint.discard(folder, c, run_id)
    comm.allreduce_min(np.zeros(1, dtype=np.int64), channel="stop")  # every rank has deleted its files
    if comm.rank == 0 and folder.is_dir():
        try:
            folder.rmdir()
        except OSError:
            pass  # something else lives there: leave it


def placement_row(placement) -> dict:
    import socket

    return {
        "host": socket.gethostname(),
        "local_rank": placement.local_rank,
        "device": placement.device,
        "threads": placement.threads,
        "cpu": cpu_model(),
    }


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo; else what platform knows): results are bit-identical
    only between runs on the same CPU model with the same threads and library versions."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "cpu model"):
                    return " ".join(value.split())
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"
