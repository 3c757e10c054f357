"""The round's watchdog (``timeout.round_seconds``) and fault injection (``debug.fail_*``), as one
observer: both follow what the rank is doing, and both are wired to the communicator's transfers
(the watchdog names the collective a rank waits in; a fault can fire inside one)."""

from __future__ import annotations

from mpicd.run.engine import Observer, Round
from mpicd.run.faults import FaultInjector
from mpicd.run.watchdog import Watchdog


class Supervisor(Observer):
    """The watchdog of this rank's rounds and the fault injector on its first client's model; ``fault``
    is handed to the training and to the writes (``in_write``) and checkpoints (``in_checkpoint``)."""

    def __init__(self, plan, clients, comm, writer) -> None:
        from mpi4py import MPI  # importing mpi4py.MPI initialises MPI: only a rank that runs rounds does

        cfg = plan.config
        self.comm = comm
        self.watchdog = Watchdog(cfg.timeout.round_seconds, comm.rank, MPI.COMM_WORLD.Abort)
        self.fault = FaultInjector(
            cfg.debug,
            comm.rank,
            clients[0].model,
            on_hang=lambda: setattr(self.watchdog, "phase", "hanging on purpose (debug.fail_kind=hang)"),
        )
        comm.on_transfer, comm.after_transfer = self._entering, self._left
        writer.on_write = lambda: self.fault.at("in_write")

    def _entering(self, operation: str, outgoing: list) -> None:
        self.watchdog.phase = f"waiting in {operation}"
        self.fault.at("in_exchange", outgoing)

    def _left(self) -> None:
        self.watchdog.phase = "computing"

    def phase(self, what: str) -> None:
        self.watchdog.phase = what

    def begin_round(self, rnd: Round) -> None:
        self.fault.begin_round(rnd.index)
        self.watchdog.begin_round(rnd.index)

    def finish(self, stopped: bool) -> None:
        """Disarmed after the last round (the next round re-arms it, so a round is watched to its last
        checkpoint); an agreed stop's close and barrier stay watched, as part of the round."""
        if not stopped:
            self.watchdog.end_round()

    def close(self) -> None:
        self.watchdog.stop()
        self.comm.on_transfer = self.comm.after_transfer = None
