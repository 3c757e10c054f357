"""Built-in fault injection (``debug.fail_*``): one rank fails on purpose, in a chosen way and place.

For users to test their own cluster set-up (does a failing rank end the job, is the file kept?)
and for mpicd's own fault tests. Rounds count from 0: ``fail_round: 2`` fails during the third
round, so 2 rounds are complete in the file. Places, in the order a round reaches them:

* ``before_exchange``  before the round's first hook (the algorithm's first exchange);
* ``in_exchange``      inside the round's first transfer, before this rank posts its side
                       (the others are already waiting in it); an algorithm without an exchange
                       (local) reaches it in the round's closing progress Allreduce;
* ``after_epoch``      after the local epoch, before the algorithm's closing exchange;
* ``in_write``         inside the collective write of the round's results row;
* ``in_checkpoint``    inside the round's checkpoint write, the temporary file written but not
                       yet renamed (reached only in rounds that save a checkpoint).

Kinds: ``exception`` (raised: traceback and MPI_Abort), ``exit`` (``os._exit(1)``, no clean-up),
``kill`` (SIGKILL to itself), ``hang`` (sleeps instead of going on: only a watchdog,
``timeout.round_seconds``, or the launcher ends the job), ``nan`` (NaN written into this rank's
model parameters at that place, to exercise ``on_nonfinite``).
"""

from __future__ import annotations

import os
import signal
import sys
import time

import torch


class InjectedFault(RuntimeError):
    """The exception ``fail_kind: exception`` raises."""


class FaultInjector:
    """Fires once, on ``debug.fail_rank``, in ``debug.fail_round``, at ``debug.fail_at``."""

    def __init__(self, debug, rank: int, model: torch.nn.Module, on_hang=lambda: None):
        self.debug, self.rank, self.model, self.on_hang = debug, rank, model, on_hang
        self.armed = debug.fail_rank == rank
        self.round = -1

    def begin_round(self, round_index: int) -> None:
        self.round = round_index

    def at(self, place: str, outgoing: list | None = None) -> None:
        """Call at each place of the round; does nothing except at the configured one.

        ``outgoing``: the buffers about to be sent (in_exchange), poisoned too by ``nan``.
        """
        debug = self.debug
        if not self.armed or place != debug.fail_at or self.round != debug.fail_round:
            return
        self.armed = False
        what = (
            f"mpicd: rank {self.rank}, round {self.round}: injected fault debug.fail_kind={debug.fail_kind} at {place}"
        )
        if debug.fail_kind == "exception":
            raise InjectedFault(what)
        if debug.fail_kind == "nan":
            with torch.no_grad():
                for p in self.model.parameters():
                    p.fill_(float("nan"))
            for array in outgoing or []:
                if array.dtype.kind == "f":
                    array.fill(float("nan"))
            return
        sys.stdout.flush()
        sys.stderr.write(what + "\n")
        sys.stderr.flush()
        if debug.fail_kind == "exit":
            os._exit(1)
        if debug.fail_kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        self.on_hang()
        while True:  # hang: never returns; the watchdog or the launcher ends the job
            time.sleep(3600)
