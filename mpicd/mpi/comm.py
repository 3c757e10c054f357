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

* ``gather``    (to the writer only, :meth:`Comm.gather`) every rank counts its block as sent, the
                root the N blocks as received; counted under ``allgather``'s kind (it happens only
                outside rounds, and its channel names it).

Traffic outside a round (start-up agreement, the writer's gathers) is counted in a separate
``outside_rounds`` total so that per-round rows hold only what the algorithm exchanged.

Every transfer names its channel (:mod:`mpicd.mpi.channels`: why the bytes cross, protocol or
instrumentation); a channel that is not declared, or a dtype or operation it does not declare,
is refused before anything is sent (:class:`ProtocolError`), and the ledger counts each
channel's bytes over the run (``ByteLedger.channels``).

Two guards, so that nothing wrong crosses MPI silently:

* every floating-point buffer an algorithm is about to send in a round is checked for NaN and inf
  (:class:`NonFiniteError` names rank, round and operation);
* before every collective the ranks Allgather (bytes, dtype) of their buffers and compare: a rank
  that passes another size or dtype than the others is named (:class:`ProtocolError`) instead of
  MPI truncating or reading past a buffer. That agreement is 16 N bytes received per collective,
  counted outside the round's row (``outside_rounds``), so per-round bytes stay the protocol's.
  Point-to-point messages are checked on arrival (the received size must be the expected one).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
from mpi4py import MPI

from mpicd.mpi.channels import CHANNELS, Channel
from mpicd.mpi.accounting import KINDS, ByteLedger, Traffic  # noqa: F401  (KINDS, Traffic: re-exported)

_MPI_TYPES = {
    np.dtype(np.float32): MPI.FLOAT,
    np.dtype(np.float64): MPI.DOUBLE,
    np.dtype(np.int32): MPI.INT,
    np.dtype(np.int64): MPI.INT64_T,
    np.dtype(np.uint8): MPI.UNSIGNED_CHAR,
}


class NonFiniteError(RuntimeError):
    """NaN or inf in a buffer about to be sent."""


class ProtocolError(RuntimeError):
    """A message or collective buffer whose size or dtype is not what the protocol says."""


_DTYPE_CODES = {dtype: code for code, dtype in enumerate(_MPI_TYPES, start=1)}


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
        self.ledger = ByteLedger()
        # Called at every transfer with its name and send buffers, before this rank posts its side
        # (fault injection, the watchdog's phase), and after it completes; None: nothing to call.
        self.on_transfer: Callable[[str, list[np.ndarray]], None] | None = None
        self.after_transfer: Callable[[], None] | None = None
        self.channels: dict[str, Channel] = dict(CHANNELS)
        self.channel: str | None = None  # the channel of the transfer in progress (for audit recorders)

    def declare(self, channel: Channel) -> None:
        """Replace a channel's declaration (a run narrows ``payload`` to its algorithm's)."""
        self.channels[channel.name] = channel

    def _open(self, channel: str, operation: str, arrays: list[np.ndarray]) -> None:
        """The transfer is on a declared channel, with an operation and dtypes it declares, or
        nothing is sent (every rank runs the same check on the same declaration)."""
        declared = self.channels.get(channel)
        if declared is None:
            raise ProtocolError(
                f"mpicd: {self.where()}: {operation} on undeclared channel {channel!r}; nothing was sent"
            )
        if operation not in declared.operations:
            raise ProtocolError(
                f"mpicd: {self.where()}: channel {channel!r} declares {', '.join(declared.operations) or 'no operation'}, "
                f"not {operation}; nothing was sent"
            )
        for array in arrays:
            if array.dtype.name not in declared.dtypes:
                raise ProtocolError(
                    f"mpicd: {self.where()}: channel {channel!r} declares {', '.join(declared.dtypes) or 'no dtype'}, "
                    f"but a {array.dtype.name} buffer {array.shape} was about to be sent; nothing was sent"
                )
        self.channel = channel

    def _count(self, channel: str, sent: int, recv: int) -> None:
        self.ledger.record_channel(channel, sent, recv)
        self.channel = None

    round_index: int | None = None  # the round in progress, set by the round loop (for messages)

    def where(self) -> str:
        """``rank R, round N`` (the round only inside one), for messages."""
        r = self.round_index
        return f"rank {self.rank}" + (f", round {r}" if r is not None else "")

    def _check_finite(self, operation: str, arrays: list[np.ndarray]) -> None:
        """An algorithm's payload (inside a round) is never NaN or inf; bookkeeping outside rounds
        (the serial writer's gather of a row whose missing metrics are NaN) is not checked."""
        if self.ledger.current is None:
            return
        for array in arrays:
            if array.dtype.kind == "f" and not np.isfinite(array).all():
                bad = int(array.size - np.isfinite(array).sum())
                raise NonFiniteError(
                    f"mpicd: {self.where()}: {bad} of {array.size} values about to be sent "
                    f"({operation}) are NaN or inf; nothing was sent"
                )

    def _agree_on_layout(self, operation: str, array: np.ndarray, channel: str) -> None:
        """Every rank passes the same bytes and dtype to this collective, or every rank raises
        (after the channel's own check: an undeclared buffer is refused before any agreement)."""
        self._open(channel, operation, [array])
        mine = np.array([array.nbytes, _DTYPE_CODES[array.dtype]], dtype=np.int64)
        everyone = np.empty((self.size, 2), dtype=np.int64)
        start = time.perf_counter()
        self._open("layout", "allgather", [mine])
        self.mpi.Allgather(_buffer(mine), _buffer(everyone))
        self._count("layout", mine.nbytes, everyone.nbytes)
        # Its bytes are not the protocol's (outside the round's row); its seconds are waiting in
        # MPI like the collective's own, so they count where that collective's seconds count.
        self.ledger.outside_rounds.add("allgather", mine.nbytes, everyone.nbytes, 0.0)
        (self.ledger.current or self.ledger.outside_rounds).seconds += time.perf_counter() - start
        if (everyone == everyone[0]).all():
            return
        names = {code: dtype.name for dtype, code in _DTYPE_CODES.items()}
        odd = int(np.flatnonzero((everyone != np.median(everyone, axis=0)).any(axis=1))[0]) if self.size > 2 else 1
        raise ProtocolError(
            f"mpicd: {self.where()}: {operation} layouts differ: rank {odd} passes {everyone[odd, 0]} bytes of "
            f"{names[int(everyone[odd, 1])]}, rank {0 if odd else 1} passes {everyone[0 if odd else 1, 0]} bytes "
            f"of {names[int(everyone[0 if odd else 1, 1])]}"
        )

    def _enter(self, operation: str, arrays: list[np.ndarray]) -> None:
        if self.on_transfer is not None:
            self.on_transfer(operation, arrays)
        self._check_finite(operation, arrays)

    def _leave(self) -> None:
        if self.after_transfer is not None:
            self.after_transfer()

    def exchange(
        self,
        sends: list[tuple[int, np.ndarray]],
        recvs: list[tuple[int, np.ndarray]],
        tag: int,
        *,
        channel: str,
        allow_empty: bool = False,
        clients: dict[int, tuple[int, int]] | None = None,
    ) -> list[int]:
        """Post every Isend and Irecv, then Waitall; fills the ``recvs`` buffers in place and
        returns the bytes received per receive (``allow_empty``: an empty message, "nothing
        this round", is accepted besides the full size).

        Cannot deadlock as long as the sends and receives of all ranks match up (each algorithm
        derives both sides from the same shared plan): nothing blocks until all are posted.
        A received message of the wrong size is an error, never a silently short buffer.
        ``clients``: the (sent, received) deployment bytes of each client this rank holds, when the
        messages carry several clients' payloads (:meth:`mpicd.mpi.accounting.ByteLedger.record_client`).
        """
        self._open(channel, "p2p", [buf for _, buf in sends] + [buf for _, buf in recvs])
        self._enter("p2p", [buf for _, buf in sends])
        start = time.perf_counter()
        requests = [self.mpi.Irecv(_buffer(buf), source=src, tag=tag) for src, buf in recvs]
        requests += [self.mpi.Isend(_buffer(buf), dest=dst, tag=tag) for dst, buf in sends]
        statuses = [MPI.Status() for _ in requests]
        MPI.Request.Waitall(requests, statuses)
        self._leave()
        received = []
        for (src, buf), status in zip(recvs, statuses):
            got = status.Get_count(MPI.BYTE)
            received.append(got)
            if got != buf.nbytes and not (allow_empty and got == 0):
                raise ProtocolError(
                    f"mpicd: {self.where()}: expected {buf.nbytes} bytes from rank {src} (tag {tag}), received {got}"
                )
        seconds = time.perf_counter() - start
        self.ledger.record("p2p", sum(b.nbytes for _, b in sends), sum(received), seconds)
        self._count(channel, sum(b.nbytes for _, b in sends), sum(received))
        for c, (sent, recv) in (clients or {}).items():
            self.ledger.record_client(c, "p2p", sent, recv, seconds / len(clients))
        return received

    def allreduce_sum(self, array: np.ndarray, *, channel: str) -> np.ndarray:
        """Element-wise sum over all ranks; every rank gets the result."""
        return self._allreduce(array, MPI.SUM, channel)

    def allreduce_min(self, array: np.ndarray, *, channel: str) -> np.ndarray:
        """Element-wise minimum over all ranks (used to agree on a decision)."""
        return self._allreduce(array, MPI.MIN, channel)

    def _allreduce(self, array: np.ndarray, op: MPI.Op, channel: str) -> np.ndarray:
        result = np.empty_like(array)
        self._agree_on_layout("allreduce", array, channel)
        self._open(channel, "allreduce", [array])
        self._enter("allreduce", [array])
        start = time.perf_counter()
        self.mpi.Allreduce(_buffer(array), _buffer(result), op=op)
        self._leave()
        self.ledger.record("allreduce", array.nbytes, result.nbytes, time.perf_counter() - start)
        self._count(channel, array.nbytes, result.nbytes)
        return result

    def allgather(self, array: np.ndarray, *, channel: str) -> np.ndarray:
        """Every rank's block stacked along a new first axis ``(size, *array.shape)``."""
        result = np.empty((self.size, *array.shape), dtype=array.dtype)
        self._agree_on_layout("allgather", array, channel)
        self._open(channel, "allgather", [array])
        self._enter("allgather", [array])
        start = time.perf_counter()
        self.mpi.Allgather(_buffer(array), _buffer(result))
        self._leave()
        self.ledger.record("allgather", array.nbytes, result.nbytes, time.perf_counter() - start)
        self._count(channel, array.nbytes, result.nbytes)
        return result

    def gather(self, array: np.ndarray, root: int = 0, *, channel: str) -> np.ndarray | None:
        """Every rank's block stacked along a new first axis ``(size, *array.shape)``, on ``root`` only
        (None elsewhere): what only the writer needs reaches no other rank."""
        result = np.empty((self.size, *array.shape), dtype=array.dtype) if self.rank == root else None
        self._agree_on_layout("gather", array, channel)
        self._open(channel, "gather", [array])
        self._enter("gather", [array])
        start = time.perf_counter()
        self.mpi.Gather(_buffer(array), _buffer(result) if result is not None else None, root=root)
        self._leave()
        recv = result.nbytes if result is not None else 0
        self.ledger.record("allgather", array.nbytes, recv, time.perf_counter() - start)
        self._count(channel, array.nbytes, recv)
        return result

    # Rank-level exchanges of the clients this rank holds (mpicd.mpi.assignment): one MPI operation for all
    # of them, and each client's deployment bytes (one site per client) in the ledger's client rows.

    def allreduce_sum_clients(
        self, contributions: dict[int, np.ndarray], template: np.ndarray, *, channel: str
    ) -> np.ndarray:
        """The sum over every client of every rank: this rank's contributions summed here, in client
        order (none, a rank whose clients sit the round out: zeros like ``template``), then one
        Allreduce(SUM). Each contributing client counts as sending its contribution and receiving
        the result, as it would alone on a rank (one contribution: exactly :meth:`allreduce_sum`)."""
        clients = sorted(contributions)
        total = contributions[clients[0]] if clients else np.zeros_like(template)
        if len(clients) > 1:
            total = total.copy()
            for c in clients[1:]:
                total += contributions[c]
        start = time.perf_counter()
        result = self.allreduce_sum(total, channel=channel)
        share = (time.perf_counter() - start) / max(len(clients), 1)
        for c in clients:
            self.ledger.record_client(c, "allreduce", contributions[c].nbytes, result.nbytes, share)
        return result

    def allreduce_sum_exact(
        self,
        contributions: dict[int, np.ndarray],
        template: np.ndarray,
        clients: int,
        per_client: bool = True,
        *,
        channel: str,
    ) -> np.ndarray:
        """The sum over every client of every rank, the same bits whatever the layout and whatever
        order MPI reduces in (``reduction: exact``). Float addition is not associative, so a
        float32 Allreduce depends on the ranks and on MPI's reduction tree; integer addition is.
        One Allreduce(MAX) of one float64 gives every rank the largest magnitude m (a maximum is
        exact in any order); every client rounds its float32 values to int64 multiples of the same
        power of two, 2^(e - 62 + b) with m < 2^e and 2^b >= 2 ``clients`` (so no sum of up to
        ``clients`` of them overflows, and the quantum is below m 2^-(61 - b): finer than float32's
        2^-24 relative to m); the rank adds its clients' integers, one Allreduce(SUM) of int64 adds
        the ranks', and the sum is scaled back to float32. Bytes: 8 for the maximum plus 8 per
        value, sent and received by each client (``per_client``: recorded in the ledger's client
        rows too, as :meth:`allreduce_sum_clients` does)."""
        clients_here = sorted(contributions)
        self._check_finite("allreduce", [contributions[c] for c in clients_here])
        biggest = max((float(np.abs(contributions[c]).max(initial=0.0)) for c in clients_here), default=0.0)
        start = time.perf_counter()
        m = float(self._allreduce(np.array([biggest], dtype=np.float64), MPI.MAX, channel)[0])
        headroom = max(int(clients) - 1, 1).bit_length() + 1
        exponent = np.frexp(m)[1] if m > 0 else 0
        scale = np.ldexp(1.0, 62 - headroom - int(exponent))  # a power of two: x * scale is exact in float64
        total = np.zeros(template.shape, dtype=np.int64)
        for c in clients_here:
            total += np.rint(contributions[c].astype(np.float64) * scale).astype(np.int64)
        summed = self.allreduce_sum(total, channel=channel)
        result = (summed.astype(np.float64) / scale).astype(template.dtype)
        if per_client:
            share = (time.perf_counter() - start) / max(len(clients_here), 1)
            for c in clients_here:
                self.ledger.record_client(c, "allreduce", 8 + total.nbytes, 8 + summed.nbytes, share)
        return result

    def allgather_clients(self, blocks: dict[int, np.ndarray], owner: np.ndarray, *, channel: str) -> np.ndarray:
        """Every client's block, stacked in client order ``(clients, *shape)``; ``owner[i]``: client
        i's rank (mpicd.mpi.assignment), ``blocks``: this rank's clients' blocks, all of one shape and dtype.
        One Allgatherv of each rank's blocks; each client counts as sending its block and receiving
        all N (its own included), as :meth:`allgather` counts a rank. One client per rank: exactly
        :meth:`allgather`."""
        owner = np.asarray(owner)
        clients = sorted(blocks)
        if len(owner) == self.size:
            result = self.allgather(blocks[clients[0]], channel=channel)
        else:
            block = blocks[clients[0]]
            mine = np.ascontiguousarray(np.stack([blocks[c] for c in clients]))
            counts = np.bincount(owner, minlength=self.size) * block.size
            order = np.argsort(owner, kind="stable")  # rank-major, each rank's clients ascending
            gathered = np.empty((len(owner), *block.shape), dtype=block.dtype)
            self._agree_on_layout("allgather", block, channel)
            self._open(channel, "allgather", [mine])
            self._enter("allgather", [mine])
            start = time.perf_counter()
            displacements = np.concatenate([[0], np.cumsum(counts)[:-1]])
            self.mpi.Allgatherv(
                _buffer(mine), [gathered, (counts.tolist(), displacements.tolist()), _MPI_TYPES[block.dtype]]
            )
            self._leave()
            self.ledger.record("allgather", mine.nbytes, gathered.nbytes, time.perf_counter() - start)
            self._count(channel, mine.nbytes, gathered.nbytes)
            result = np.empty_like(gathered)
            result[order] = gathered
        for c in clients:
            self.ledger.record_client(c, "allgather", blocks[c].nbytes, blocks[c].nbytes * len(owner))
        return result

    def bcast(self, array: np.ndarray, root: int = 0, *, channel: str) -> np.ndarray:
        """Root's buffer copied into every rank's ``array`` (in place; returned for convenience)."""
        self._agree_on_layout("bcast", array, channel)
        self._open(channel, "bcast", [array])
        self._enter("bcast", [array] if self.rank == root else [])
        start = time.perf_counter()
        self.mpi.Bcast(_buffer(array), root=root)
        self._leave()
        sent, recv = (array.nbytes, 0) if self.rank == root else (0, array.nbytes)
        self.ledger.record("bcast", sent, recv, time.perf_counter() - start)
        self._count(channel, sent, recv)
        return array

    def first_failing_rank(self, failed: bool, *, channel: str = "failure") -> int | None:
        """Collective agreement: the lowest rank that reports failure, or None if none did."""
        mine = np.array([self.rank if failed else self.size], dtype=np.int64)
        lowest = int(self.allreduce_min(mine, channel=channel)[0])
        return None if lowest == self.size else lowest
