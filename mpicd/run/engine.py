"""The round engine: train, exchange, evaluate, and tell the observers.

Nothing algorithm-specific happens here (the algorithm's hooks are called by :mod:`mpicd.run.client`
in a fixed order) and nothing else either: each other concern is an :class:`Observer` in its own
module, handed every event of a round in the order the observers were listed (the same on every
rank, so their collectives line up). Adding a concern is adding an observer.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from mpicd.evaluation.predictors import Scores
from mpicd.mpi.accounting import Traffic
from mpicd.run.client import Client, EpochLoss, evaluate_clients, train_clients
from mpicd.run.participation import participants
from mpicd.run.plan import Plan


@dataclass
class Round:
    """One round as the engine saw it, filled in as it goes; observers read it and add ``columns``."""

    index: int
    started: float
    trained: float = 0.0
    finished: float = 0.0
    losses: dict[int, EpochLoss] = field(default_factory=dict)
    scores: dict[int, tuple[Scores | None, Scores | None, Scores | None]] = field(
        default_factory=dict
    )  # test, val, own
    generic: dict[int, tuple[Scores | None, Scores | None]] = field(default_factory=dict)  # scores_generic
    seconds: dict[int, dict[str, float]] = field(default_factory=dict)  # client -> compute/train/eval seconds
    traffic: Traffic | None = None  # the rank's ledger row of the round
    client_traffic: dict[int, Traffic] = field(default_factory=dict)  # each client's (one per rank: the rank's)
    diagnostics: object = None  # eval.diagnostics' row (one client per rank)
    columns: dict[int, dict] = field(default_factory=dict)  # client -> results columns observers add
    stop: bool = False  # every rank agreed to stop after this round (mpicd.run.progress)
    interrupted: bool = False  # ... because of SIGINT / SIGTERM rather than SIGUSR1
    announce: Callable[[str], None] = lambda what: None  # an observer says what the rank does now (phase)


class Observer:
    """One concern of a run, told of each event; every hook does nothing unless overridden.

    ``phase(what)``: what the rank is doing now (the watchdog names it); ``begin_round`` before
    training; ``end_round`` once the round's ledger row is closed (agreements, columns, the results
    row: in list order); ``after_round`` after every observer's ``end_round`` (the progress line,
    checkpoints; at an agreed stop the file's close); ``finish(stopped)`` once, after the last round
    or after the round an agreed stop came after; ``close`` always, also on an exception (threads and
    hooks let go)."""

    def phase(self, what: str) -> None: ...
    def begin_round(self, rnd: Round) -> None: ...
    def end_round(self, rnd: Round) -> None: ...
    def after_round(self, rnd: Round) -> None: ...
    def finish(self, stopped: bool) -> None: ...
    def close(self) -> None: ...


class RoundEngine:
    """The rounds of a rank's ``clients`` from round ``start``; ``training``: what the clients' training
    is handed (the fault injector and a non-finite guard per client, :mod:`mpicd.run.supervision`)."""

    def __init__(self, plan: Plan, clients: list[Client], comm, observers: list[Observer], training) -> None:
        self.plan, self.clients, self.comm, self.observers, self.training = plan, clients, comm, observers, training
        cfg = plan.config
        # several clients per rank, or partial participation: the rank-level path, with rows per client
        self.many = len(clients) > 1 or cfg.clients != comm.size or cfg.participation < 1

    def run(self, start: int) -> Round | None:
        """Every round from ``start``; returns the round an agreed stop came after (None: all ran)."""
        try:
            for r in range(start, self.plan.config.rounds):
                rnd = self.round(r)
                if rnd.stop:
                    self._tell("finish", True)
                    return rnd
            self._tell("finish", False)
            return None
        finally:
            self._tell("close")

    def round(self, r: int) -> Round:
        cfg, ledger, comm = self.plan.config, self.comm.ledger, self.comm
        rnd = Round(r, time.perf_counter(), columns={c.index: {} for c in self.clients}, announce=self._phase)
        ledger.begin_round(tuple(c.index for c in self.clients) if self.many else ())
        comm.round_index = r
        taking = participants(cfg.seed, r, cfg.clients, cfg.participation)  # None: every client
        for c in self.clients:
            c.algorithm.ctx.participants = taking
        self._tell("begin_round", rnd)
        self._phase("training")
        train_seconds = self._train(rnd)
        rnd.trained = time.perf_counter()
        eval_seconds = self._evaluate(rnd)
        rnd.traffic = ledger.end_round()
        rnd.finished = time.perf_counter()
        self._timing(rnd, train_seconds, eval_seconds)
        if cfg.eval.diagnostics:  # after end_round: the probe features count outside rounds
            self._phase("diagnostics (eval.diagnostics)")
            rnd.diagnostics = self.clients[0].round_diagnostics(r)  # one client per rank (refused otherwise)
        self._tell("end_round", rnd)
        self._tell("after_round", rnd)
        comm.round_index = None
        return rnd

    def _train(self, rnd: Round) -> dict[int, float] | None:
        fault, guards = self.training
        if self.many:
            rnd.losses, seconds = train_clients(self.clients, rnd.index, fault, guards)
            return seconds
        first = self.clients[0]
        rnd.losses = {first.index: first.train_round(rnd.index, fault, guards[first.index])}
        return None

    def _evaluate(self, rnd: Round) -> dict[int, float]:
        """Held-out scores every eval.every rounds and at the last (not evaluated: None, NaN in the file)."""
        cfg, clients = self.plan.config, self.clients
        rnd.scores = {c.index: (None, None, None) for c in clients}
        rnd.generic = {c.index: (None, None) for c in clients}
        seconds = dict.fromkeys(rnd.scores, 0.0)
        if (rnd.index + 1) % cfg.eval.every and rnd.index + 1 != cfg.rounds:
            return seconds
        self._phase("evaluating")
        held_out = ("test", "val") if "val" in clients[0].eval_sets else ("test",)
        found, seconds = evaluate_clients(clients, held_out, once=cfg.eval.shared_models == "once")
        for c in clients:
            began = time.perf_counter()
            own = c.evaluate("train") if cfg.eval.train_split else None  # audit: its own training images
            seconds[c.index] += time.perf_counter() - began
            rnd.scores[c.index] = (found[c.index]["test"], found[c.index].get("val"), own)
            rnd.generic[c.index] = (found[c.index].get("generic_test"), found[c.index].get("generic_val"))
        return seconds

    def _timing(self, rnd: Round, train_seconds: dict | None, eval_seconds: dict) -> None:
        """Each client's compute, training and evaluation seconds, communication excluded."""
        for c in self.clients:
            if self.many:
                comm_seconds = self.comm.ledger.client_rows[c.index].seconds
                rnd.client_traffic[c.index] = self.comm.ledger.client_rows[c.index]
                rnd.seconds[c.index] = dict(
                    compute_seconds=train_seconds[c.index] + eval_seconds[c.index] - comm_seconds,
                    train_seconds=train_seconds[c.index] - comm_seconds,
                    eval_seconds=eval_seconds[c.index],
                )
            else:
                rnd.client_traffic[c.index] = rnd.traffic
                rnd.seconds[c.index] = dict(
                    compute_seconds=rnd.finished - rnd.started - rnd.traffic.seconds,
                    train_seconds=rnd.trained - rnd.started - rnd.traffic.seconds,
                    eval_seconds=rnd.finished - rnd.trained,
                )

    def _phase(self, what: str) -> None:
        self._tell("phase", what)

    def _tell(self, event: str, *args) -> None:
        for observer in self.observers:
            getattr(observer, event)(*args)
