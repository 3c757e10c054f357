"""The one place where bytes cross MPI, and the ledger that counts them (its types, free of MPI, in ledger.py).

Every transfer of mpicd goes through :class:`Comm`: point-to-point exchanges (Isend/Irecv +
Waitall), Allreduce, Allgather and Bcast on contiguous numpy buffers via mpi4py's uppercase
(buffer) API. Nothing is pickled on the training path.

What a byte count means (per rank, per round, per kind of operation):

* ``p2p``       sent = bytes of every message this rank posted; recv = bytes of every message it
                received (checked against the size it expected).
* ``allreduce`` sent = bytes of this rank's contribution; recv = bytes of the reduced result it
                gets back (the same size). Algorithm-level payload, not the wire traffic of
                MPI's internal reduction tree, which depends on the MPI library.
* ``allgather`` sent = bytes of this rank's block; recv = bytes of the whole gathered array
                (N blocks, its own included).
* ``bcast``     the root counts the buffer as sent, every other rank as received.

Traffic outside a round (start-up agreement, results fallback gather) is counted in a separate
``outside_rounds`` total so that per-round rows hold only what the algorithm exchanged.
"""

from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI

from .ledger import KINDS, Ledger, Traffic  # noqa: F401  (KINDS, Traffic: re-exported)

_MPI_TYPES = {
    np.dtype(np.float32): MPI.FLOAT,
    np.dtype(np.float64): MPI.DOUBLE,
    np.dtype(np.int32): MPI.INT,
    np.dtype(np.int64): MPI.INT64_T,
    np.dtype(np.uint8): MPI.UNSIGNED_CHAR,
}


def _buffer(array: np.ndarray) -> list:
    if not isinstance(array, np.ndarray):
        raise TypeError(f"comm: expected a numpy array, got {type(array).__name__}")
    if not array.flags.c_contiguous:
        raise ValueError("comm: buffer must be C-contiguous")
    try:
        return [array, _MPI_TYPES[array.dtype]]
    except KeyError:
        raise TypeError(f"comm: unsupported dtype {array.dtype}") from None


class Comm:
    """An MPI communicator whose every transfer is recorded in ``self.ledger``."""

    def __init__(self, mpi_comm: MPI.Comm | None = None) -> None:
        self.mpi = mpi_comm if mpi_comm is not None else MPI.COMM_WORLD
        self.rank = self.mpi.Get_rank()
        self.size = self.mpi.Get_size()
        self.ledger = Ledger()

    def exchange(self, sends: list[tuple[int, np.ndarray]], recvs: list[tuple[int, np.ndarray]],
                 tag: int) -> None:
        """Post every Isend and Irecv, then Waitall; fills the ``recvs`` buffers in place.

        Cannot deadlock as long as the sends and receives of all ranks match up (each algorithm
        derives both sides from the same shared plan): nothing blocks until all are posted.
        A received message of the wrong size is an error, never a silently short buffer.
        """
        start = time.perf_counter()
        requests = [self.mpi.Irecv(_buffer(buf), source=src, tag=tag) for src, buf in recvs]
        requests += [self.mpi.Isend(_buffer(buf), dest=dst, tag=tag) for dst, buf in sends]
        statuses = [MPI.Status() for _ in requests]
        MPI.Request.Waitall(requests, statuses)
        for (src, buf), status in zip(recvs, statuses):
            got = status.Get_count(MPI.BYTE)
            if got != buf.nbytes:
                raise RuntimeError(
                    f"comm: rank {self.rank} expected {buf.nbytes} bytes from rank {src} "
                    f"(tag {tag}), received {got}")
        self.ledger.record("p2p", sum(b.nbytes for _, b in sends), sum(b.nbytes for _, b in recvs),
                           time.perf_counter() - start)

    def allreduce_sum(self, array: np.ndarray) -> np.ndarray:
        """Element-wise sum over all ranks; every rank gets the result."""
        return self._allreduce(array, MPI.SUM)

    def allreduce_min(self, array: np.ndarray) -> np.ndarray:
        """Element-wise minimum over all ranks (used to agree on a decision)."""
        return self._allreduce(array, MPI.MIN)

    def _allreduce(self, array: np.ndarray, op: MPI.Op) -> np.ndarray:
        result = np.empty_like(array)
        start = time.perf_counter()
        self.mpi.Allreduce(_buffer(array), _buffer(result), op=op)
        self.ledger.record("allreduce", array.nbytes, result.nbytes, time.perf_counter() - start)
        return result

    def allgather(self, array: np.ndarray) -> np.ndarray:
        """Every rank's block stacked along a new first axis (size, *array.shape)."""
        result = np.empty((self.size, *array.shape), dtype=array.dtype)
        start = time.perf_counter()
        self.mpi.Allgather(_buffer(array), _buffer(result))
        self.ledger.record("allgather", array.nbytes, result.nbytes, time.perf_counter() - start)
        return result

    def bcast(self, array: np.ndarray, root: int = 0) -> np.ndarray:
        """Root's buffer copied into every rank's ``array`` (in place; returned for convenience)."""
        start = time.perf_counter()
        self.mpi.Bcast(_buffer(array), root=root)
        sent, recv = (array.nbytes, 0) if self.rank == root else (0, array.nbytes)
        self.ledger.record("bcast", sent, recv, time.perf_counter() - start)
        return array

    def first_failing_rank(self, failed: bool) -> int | None:
        """Collective agreement: the lowest rank that reports failure, or None if none did."""
        mine = np.array([self.rank if failed else self.size], dtype=np.int64)
        lowest = int(self.allreduce_min(mine)[0])
        return None if lowest == self.size else lowest
