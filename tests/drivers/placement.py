"""Run under mpiexec: where each rank was placed (argv: folder; writes rank<r>.txt)."""

import sys
from pathlib import Path

from mpi4py import MPI

from mpicd.mpi.placement import abort_on_exception, place

with abort_on_exception():
    p = place(MPI.COMM_WORLD, "auto")
    Path(sys.argv[1], f"rank{p.rank}.txt").write_text(f"{p.local_rank} {p.local_size} {p.device} {p.threads}")
