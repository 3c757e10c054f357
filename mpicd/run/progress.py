"""The stop agreement and the progress line, as one observer.

A rank asked to stop (SIGUSR1 from Slurm before its time limit; SIGINT / SIGTERM: mpicd.run.signals)
says so in one Allreduce after each round, so every rank stops after the same round, checkpointed.
The progress line's figures (mean minority accuracy, bytes sent, seconds) go to rank 0 alone in one
Gather (instrumentation, mpicd.mpi.channels); rank 0 prints them. Both are outside the round's
ledger row.
"""

from __future__ import annotations

import threading
import time

import numpy as np

from mpicd.core.durations import duration
from mpicd.run import signals
from mpicd.run.engine import Observer, Round


class Progress(Observer):
    """``stop_requested``: 0, 1 (SIGUSR1) or signals.INTERRUPTED on this rank (mpicd.run.signals.StopRequest,
    told how long each round took and when the run has stopped); ``log``: rank 0's line printer."""

    def __init__(self, plan, clients, comm, stop_requested, log, start: int) -> None:
        self.rounds, self.clients, self.comm = plan.config.rounds, clients, comm
        self.num_clients = plan.config.clients
        self.stop_requested, self.log, self.start = stop_requested, log, start
        self.began = time.perf_counter()
        self._summary = None

    def end_round(self, rnd: Round) -> None:
        asked = int(self.comm.allreduce_sum(np.array([self.stop_requested()], dtype=np.int64), channel="stop")[0])
        rnd.stop = asked > 0 and rnd.index + 1 < self.rounds
        rnd.interrupted = asked >= signals.INTERRUPTED
        minority = [rnd.scores[c.index][0].minority_acc for c in self.clients if rnd.scores[c.index][0] is not None]
        progress = self.comm.gather(
            np.array([sum(minority) if minority else np.nan, rnd.traffic.total_sent, rnd.finished - rnd.started]),
            channel="progress",
        )
        self._summary = progress.sum(axis=0) if progress is not None else None

    def after_round(self, rnd: Round) -> None:
        getattr(self.stop_requested, "round_took", lambda seconds: None)(time.perf_counter() - rnd.started)
        if self.comm.rank == 0:
            summary, r = self._summary, rnd.index
            minority = "     -" if np.isnan(summary[0]) else f"{summary[0] / self.num_clients:.4f}"
            ran = time.perf_counter() - self.began
            left = ran / (r + 1 - self.start) * (self.rounds - r - 1)
            self.log(
                f"round {r + 1:>4}/{self.rounds}  minority_acc {minority}  "
                f"bytes {int(summary[1]):>12,d}  {summary[2] / self.comm.size:6.2f} s  "
                f"({duration(ran)} elapsed, about {duration(left)} left)"
            )

    def finish(self, stopped: bool) -> None:
        """The interrupt watcher stands down: after an agreed stop's checkpoint, close and barrier
        (mpicd.run.recording, at the round's after_round); interrupted in the last round, before the
        end's collectives, so it cannot exit between deleting the checkpoints and claiming the last round."""
        if stopped or self.stop_requested() >= signals.INTERRUPTED:
            getattr(self.stop_requested, "done", threading.Event()).set()
