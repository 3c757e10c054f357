"""A per-rank watchdog (``timeout.round_seconds``): a round that takes too long ends the job.

A rank that hangs (a dead peer the MPI library did not notice, a stuck file system, a deadlock
bug) would otherwise burn the allocation until Slurm's time limit. A daemon thread watches the
round in progress; past the limit it prints which rank, round and phase it was in (``waiting in
allreduce`` on the ranks that wait, something else on the one that hangs) and calls MPI_Abort,
which ends every rank. mpi4py initialises MPI with MPI_THREAD_MULTIPLE, so the thread may call it.
"""

from __future__ import annotations

import sys
import threading
import time

EXIT_TIMEOUT = 124


class Watchdog:
    def __init__(self, seconds: float | None, rank: int, abort) -> None:
        self.seconds, self.rank, self.abort = seconds, rank, abort
        self.phase = "starting"
        self._round: int | None = None
        self._started = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        if seconds is not None:
            threading.Thread(target=self._watch, name="mpicd-watchdog", daemon=True).start()

    def begin_round(self, round_index: int) -> None:
        with self._lock:
            self._round, self._started = round_index, time.monotonic()

    def end_round(self) -> None:
        with self._lock:
            self._round = None

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        tick = min(1.0, self.seconds / 4)
        while not self._stop.wait(tick):
            with self._lock:
                late = self._round is not None and time.monotonic() - self._started > self.seconds
                round_index, phase = self._round, self.phase
            if late:
                sys.stderr.write(
                    f"mpicd: rank {self.rank}, round {round_index}: the round took longer than "
                    f"timeout.round_seconds={self.seconds:g} s while this rank was {phase}; "
                    f"ending the job\n"
                )
                sys.stderr.flush()
                self.abort(EXIT_TIMEOUT)
                return
