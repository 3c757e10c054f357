"""Rank 2 passes a longer buffer to an Allreduce than ranks 0 and 1: every rank must stop with
a ProtocolError naming rank 2 instead of MPI truncating (exits through abort_on_exception)."""

import numpy as np
from mpi4py import MPI

from mpicd.mpi.comm import Comm
from mpicd.mpi.placement import abort_on_exception

comm = Comm()
with abort_on_exception(MPI.COMM_WORLD, where=comm.where):
    comm.allreduce_sum(np.ones(3 if comm.rank == 2 else 2, dtype=np.float32), channel="payload")
