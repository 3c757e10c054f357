"""A clean ending's exit status, handed to the wrapper that started the job rather than to the launcher.

mpirun and srun answer a rank's non-zero exit with their abort banner (Open MPI: "Primary job
terminated normally, but 1 process returned a non-zero exit code..."), even where every rank
agreed on the ending: a config error (2), a stop on request (75, 130), failed packed runs (1).
``jobs/mpirun.sh`` and ``slurm/launch.sh`` create an empty file and export its path
(MPICD_EXIT_STATUS_FILE) and their host (MPICD_EXIT_STATUS_HOST); as ``mpicd run`` or ``pack``
ends, the ranks agree on the status, the lowest rank on that host writes it into the file, and
every rank exits 0; the wrapper exits with the file's status. Where that cannot be done (the ranks'
statuses differ, no rank runs on the wrapper's host, the write fails) every rank exits with its own
status, as without a wrapper: the banner shows, the status is never lost. A crash never gets here:
abort_on_exception aborts the job, traceback and banner included.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Mapping

FILE, HOST = "MPICD_EXIT_STATUS_FILE", "MPICD_EXIT_STATUS_HOST"


def hand_over(code: int, environ: Mapping[str, str] | None = None) -> int:
    """Every rank calls this as it leaves ``mpicd run`` or ``pack`` normally; returns the status to
    exit with: ``code`` itself without MPICD_EXIT_STATUS_FILE, 0 once the file holds the agreed one."""
    environ = os.environ if environ is None else environ
    path = environ.get(FILE)
    if not path:
        return code
    # mpi4py.MPI runs MPI_Init when imported: only a process that agrees on an exit status needs it
    from mpi4py import MPI

    from mpicd.mpi.comm import Comm  # imports mpi4py.MPI, as above
    from mpicd.mpi.placement import abort_on_exception

    with abort_on_exception(MPI.COMM_WORLD):  # a failure in here ends the job, never leaves it waiting
        return agree(Comm(), code, path, environ.get(HOST, ""))


def agree(comm, code: int, path: str, host: str) -> int:
    """The collective part of :func:`hand_over` on ``comm`` (every rank of the job)."""
    import numpy as np

    # Collective, and it cannot deadlock: every rank that leaves run or pack normally gets here (how
    # each ends is agreed collectively: a ConfigError by runner.agreed, a stop in the round's
    # Allreduce, pack's summary Allreduce), and a rank that fails instead never does: it aborts the
    # job (abort_on_exception, MPI_Abort) or exits non-zero, which ends the job's other ranks too
    # (mpirun's default, srun --kill-on-bad-exit). The bytes go through Comm on the "launch" channel
    # (the launch's instrumentation; a channel of its own would change every results file's channel
    # list); its ledger is this call's own and no results file holds it: every file is closed by now.
    here = socket.gethostname() == host  # the wrapper's `uname -n`: the same kernel host name
    mine = np.array([code, -code, comm.rank if here else comm.size], dtype=np.int64)
    low, minus_high, writer = (int(v) for v in comm.allreduce_min(mine, channel="launch"))
    # Every rank has the same three numbers: every rank takes the same branch below.
    if low != -minus_high or writer == comm.size:
        return code  # the ranks differ, or none runs where the wrapper can read the file
    if low == 0:
        return 0  # nothing to hand over: an empty file and the launcher's 0 say it
    done = np.array([comm.rank == writer and write(path, low)], dtype=np.int64)
    comm.bcast(done, root=writer, channel="launch")
    return 0 if done[0] else code


def write(path: str, code: int) -> bool:
    """``code`` into the wrapper's file ``path``, atomically (a temporary file, fsync, rename), so the
    wrapper reads the whole status or none; False, with the reason on stderr, where that fails."""
    temporary = f"{path}.{os.getpid()}.tmp"
    try:
        if not os.path.isfile(path):  # the wrapper made it: absent, it is not the wrapper's /tmp
            raise FileNotFoundError(f"{path} does not exist on {socket.gethostname()}")
        with open(temporary, "w") as out:
            out.write(f"{code}\n")
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
        return True
    except OSError as err:
        sys.stderr.write(f"mpicd: could not pass exit status {code} to the wrapper ({err}); every rank exits with it\n")
        sys.stderr.flush()
        try:
            os.unlink(temporary)
        except OSError:
            pass
        return False
