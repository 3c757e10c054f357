"""Stop requests: SIGUSR1 asks the run to stop at the next round boundary, checkpointed.

Slurm sends it before the time limit (``--signal=B:USR1@120``; the batch script forwards it to
srun or mpirun, which pass it on to every rank). The handler only sets a flag: the ranks agree
on stopping in the round's progress Allreduce, so they all stop after the same round.
"""

from __future__ import annotations

import signal

EXIT_STOPPED = 75  # EX_TEMPFAIL: stopped on request after a checkpoint; run again with --resume


class StopRequest:
    def __init__(self) -> None:
        self.requested = False

    def __call__(self) -> bool:
        return self.requested

    def _handle(self, signum, frame) -> None:  # noqa: ARG002 - the signal module's signature
        self.requested = True


def install(signals: tuple[int, ...] = (signal.SIGUSR1,)) -> StopRequest:
    """Route ``signals`` to a flag the round loop polls; returns it."""
    request = StopRequest()
    for signum in signals:
        signal.signal(signum, request._handle)
    return request
