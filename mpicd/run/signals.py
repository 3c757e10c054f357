"""Stop requests: SIGUSR1, SIGINT (Ctrl-C), SIGTERM and SIGUSR2 ask the run to stop at the next
round boundary, checkpointed.

Slurm sends SIGUSR1 before the time limit (``--signal=B:USR1@120``; the batch script forwards it
to srun or mpirun, which pass it on to every rank): exit 75. Ctrl-C reaches the ranks as SIGINT
(srun), as SIGTERM (``scancel``; Open MPI's mpirun, but only odls_base_sigkill_timeout = 1 s
before its SIGKILL), or as SIGUSR2 (``jobs/mpirun.sh`` turns Ctrl-C into it, which mpirun passes
on at once): exit 130. The handler only records the request: the ranks
agree on stopping in the round's progress Allreduce, so they all stop after the same round.

An interrupt must also end a rank that cannot reach that Allreduce (a peer died, so the others
wait in MPI for ever; the launcher's SIGTERM is then the only way out): a watcher thread, woken by
the signal even while the main thread is blocked inside MPI, gives the round ``grace`` seconds
(twice the longest round so far, at least MIN_GRACE) and then exits (130), keeping the last
checkpoint. A second interrupt exits at once; a SIGINT and a SIGTERM less than a second apart
count as one (a terminal's Ctrl-C reaches the ranks directly and again through mpirun).
"""

from __future__ import annotations

import os
import signal
import threading
import time

EXIT_STOPPED = 75  # EX_TEMPFAIL: stopped on request (SIGUSR1) after a checkpoint; run again to resume
EXIT_INTERRUPTED = 130  # 128 + SIGINT: stopped by Ctrl-C / SIGTERM; run again to continue from the checkpoint
INTERRUPTED = 1000  # what a rank adds to the progress Allreduce for SIGINT/SIGTERM (SIGUSR1: 1)
INTERRUPTS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR2)  # SIGUSR2: jobs/mpirun.sh's Ctrl-C
MIN_GRACE = float(os.environ.get("MPICD_STOP_GRACE", "10"))  # seconds
SAME_CTRL_C = 1.0  # seconds: a SIGINT and a SIGTERM closer than this are one Ctrl-C


class StopRequest:
    """Callable: 0 (no request), 1 (SIGUSR1) or INTERRUPTED (SIGINT / SIGTERM)."""

    def __init__(self) -> None:
        self.requested = 0
        self.grace = MIN_GRACE
        self.first: tuple[int, float] | None = None  # (signal, monotonic time) of the first interrupt
        self.done = threading.Event()  # set when the run has stopped: the watcher stands down
        self.again = ""  # the command that resumes (the caller's: run's with --resume, pack's as it was)

    def __call__(self) -> int:
        return self.requested

    def round_took(self, seconds: float) -> None:
        """The round loop reports each round's duration: the grace is twice the longest one."""
        self.grace = max(self.grace, 2 * seconds)

    def interrupt(self, signum: int) -> None:
        now = time.monotonic()
        if self.first is None:
            self.first = (signum, now)
            self.requested = INTERRUPTED
        elif self.first[0] == signum or now - self.first[1] > SAME_CTRL_C:
            _exit_now("interrupted again: exiting now", self.again)

    def _handle(self, signum, frame) -> None:  # noqa: ARG002 - the signal module's signature
        if signum in INTERRUPTS:
            self.interrupt(signum)
        else:
            self.requested = max(self.requested, 1)

    def _watch(self, fd: int) -> None:
        """Thread: wake on any signal byte; after an interrupt, allow ``grace`` seconds to stop."""
        armed = False
        while not armed:
            try:
                data = os.read(fd, 64)
            except OSError:
                return
            armed = any(b in INTERRUPTS for b in data)
        armed_at = time.monotonic()
        while not self.done.wait(0.2):
            if time.monotonic() > armed_at + self.grace:  # grace may grow while the round goes on
                _exit_now(f"no round boundary reached within {self.grace:.0f} s of the interrupt: exiting", self.again)


def _exit_now(why: str, again: str = "") -> None:
    rank = os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", os.environ.get("SLURM_PROCID", "?")))
    resume = f" ({again} continues from it)" if again else ""
    os.write(2, f"mpicd: rank {rank}: {why}; the last checkpoint stays{resume}\n".encode())
    os._exit(EXIT_INTERRUPTED)


def install(signals: tuple[int, ...] = (signal.SIGUSR1, *INTERRUPTS)) -> StopRequest:
    """Route ``signals`` to a flag the round loop polls, and start the interrupt watcher; returns it."""
    request = StopRequest()
    for signum in signals:
        signal.signal(signum, request._handle)
    if threading.current_thread() is threading.main_thread() and any(s in INTERRUPTS for s in signals):
        read, write = os.pipe()
        os.set_blocking(write, False)
        signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        threading.Thread(target=request._watch, args=(read,), name="mpicd-stop-watch", daemon=True).start()
    return request
