"""What the ledger counts, without MPI: byte and second totals per kind of operation, per round.

Kept apart from :mod:`mpicd.comm` (which needs mpi4py) so that reading results files, the report
and ``mpicd check`` work on a machine without MPI. What each kind's counts mean is defined in
:mod:`mpicd.comm`, where the bytes are recorded.
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


class Ledger:
    """Per-round accounting: ``begin_round`` opens a row, ``end_round`` closes and returns it."""

    def __init__(self) -> None:
        self.current: Traffic | None = None
        self.outside_rounds = Traffic()

    def begin_round(self) -> None:
        if self.current is not None:
            raise RuntimeError("ledger: begin_round called twice without end_round")
        self.current = Traffic()

    def end_round(self) -> Traffic:
        if self.current is None:
            raise RuntimeError("ledger: end_round without begin_round")
        row, self.current = self.current, None
        return row

    def record(self, kind: str, sent: int, recv: int, seconds: float) -> None:
        (self.current or self.outside_rounds).add(kind, sent, recv, seconds)
