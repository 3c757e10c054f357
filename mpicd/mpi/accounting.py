"""The byte ledger (what crosses MPI, counted), without MPI: byte and second totals per kind of
operation, per round. (The runs ledger, a sweep's finished scores, is mpicd.report.ledger.)

Kept apart from :mod:`mpicd.mpi.comm` (which needs mpi4py) so that reading results files, the report
and ``mpicd check`` work on a machine without MPI. What each kind's counts mean is defined in
:mod:`mpicd.mpi.comm`, where the bytes are recorded.
"""

from __future__ import annotations

from dataclasses import dataclass, field

KINDS = ("p2p", "allreduce", "allgather", "bcast")


@dataclass
class Traffic:
    """Bytes and seconds of one rank over some span, split by kind of operation."""

    bytes_sent: dict = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    bytes_recv: dict = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    seconds: float = 0.0

    def add(self, kind: str, sent: int, recv: int, seconds: float) -> None:
        self.bytes_sent[kind] += int(sent)
        self.bytes_recv[kind] += int(recv)
        self.seconds += seconds

    @property
    def total_sent(self) -> int:
        return sum(self.bytes_sent.values())

    @property
    def total_recv(self) -> int:
        return sum(self.bytes_recv.values())


class ByteLedger:
    """Per-round accounting: ``begin_round`` opens a row, ``end_round`` closes and returns it.

    Two figures per round. ``current`` (returned by ``end_round``): what crossed MPI from this rank.
    ``clients`` (kept in ``client_rows`` after ``end_round``): per client this rank holds, what the
    client would send and receive in a deployment with one site per client, recorded by the
    rank-level exchanges of :mod:`mpicd.mpi.comm` (``record_client``); opened only for the clients
    ``begin_round`` names. With one client per rank and every client in every round the loop names
    none and uses ``current`` for both: the rank is the client's site.
    """

    def __init__(self) -> None:
        self.current: Traffic | None = None
        self.outside_rounds = Traffic()
        self.clients: dict[int, Traffic] | None = None
        self.client_rows: dict[int, Traffic] = {}
        # The whole run's [sent, received] bytes per channel (mpicd.mpi.channels), in and outside rounds.
        self.channels: dict[str, list[int]] = {}

    def record_channel(self, channel: str, sent: int, recv: int) -> None:
        totals = self.channels.setdefault(channel, [0, 0])
        totals[0] += int(sent)
        totals[1] += int(recv)

    def begin_round(self, clients: tuple[int, ...] = ()) -> None:
        if self.current is not None:
            raise RuntimeError("ledger: begin_round called twice without end_round")
        self.current = Traffic()
        self.clients = {int(c): Traffic() for c in clients}

    def end_round(self) -> Traffic:
        if self.current is None:
            raise RuntimeError("ledger: end_round without begin_round")
        row, self.current = self.current, None
        self.client_rows, self.clients = self.clients or {}, None
        return row

    def record(self, kind: str, sent: int, recv: int, seconds: float) -> None:
        (self.current or self.outside_rounds).add(kind, sent, recv, seconds)

    def record_client(self, client: int, kind: str, sent: int, recv: int, seconds: float = 0.0) -> None:
        """A client's deployment bytes of an exchange (ignored outside rounds and for clients the
        round was not opened for: tests driving an algorithm without the loop)."""
        if self.current is not None and self.clients is not None and client in self.clients:
            self.clients[client].add(kind, sent, recv, seconds)
