"""The results file and the checkpoints, as one observer: each round's rows written (flushed every
checkpoint.flush_every rounds, at a stop and at the end), each client's checkpoint every
checkpoint.every rounds and at a stop, and at the end the single-class warning, the checkpoints
removed and the file closed. A private run's training metrics stay on their rank (NaN in the file)."""

from __future__ import annotations

import numpy as np

from mpicd.evaluation import degenerate
from mpicd.mpi.accounting import Traffic
from mpicd.results.columns import RoundRow
from mpicd.results.writer import ResultsWriter, flush_interval
from mpicd.run.client import Client, EpochLoss
from mpicd.run.engine import Observer, Round
from mpicd.run.folder import RunFolder
from mpicd.run.plan import Plan
from mpicd.run.resume import client_state

WITHHELD = EpochLoss(float("nan"), float("nan"), float("nan"))
"""A private run's training loss in the file: each client's stays on its rank (eval.share_train_metrics)."""


class Recorder(Observer):
    """Writes the rows of this rank's ``clients`` to ``writer`` and checkpoints them in ``folder``;
    ``fault``: the fault injector (``in_checkpoint``); ``log``: rank 0's line printer."""

    def __init__(
        self, plan: Plan, clients: list[Client], comm, folder: RunFolder, writer: ResultsWriter, fault, log
    ) -> None:
        cfg = plan.config
        self.plan, self.clients, self.comm, self.folder, self.writer = plan, clients, comm, folder, writer
        self.fault, self.log = fault, log
        self.flush_every = flush_interval(cfg.checkpoint.flush_every, comm.size)
        self.withhold = plan.privacy is not None  # training metrics stay on their rank (privacy_records.attrs)
        self.one_class: dict[int, list[bool]] = {c.index: [] for c in clients}  # per evaluated round: one-hot recall

    def end_round(self, rnd: Round) -> None:
        """The round's rows, flushed at a stop (agreed by then: mpicd.run.progress comes first)."""
        cfg, r, first = self.plan.config, rnd.index, self.clients[0]
        rnd.announce("writing the results row")
        rows = {}
        for c in self.clients:
            test, val, own = rnd.scores[c.index]
            if test is not None:
                self.one_class[c.index].append(bool(degenerate.one_hot(test.recall)))
            rows[c.index] = RoundRow(
                loss=WITHHELD if self.withhold else rnd.losses[c.index],
                test=test,
                val=val,
                train=None if self.withhold else own,
                generic_test=rnd.generic[c.index][0],
                generic_val=rnd.generic[c.index][1],
                traffic=rnd.client_traffic[c.index],
                mpi=rnd.traffic if c is first else Traffic(),
                teacher=c.algorithm.teacher(),
                participated=int(c.algorithm.ctx.participating),
                diag=rnd.diagnostics,
                **rnd.columns[c.index],
                **rnd.seconds[c.index],
            )
        self.writer.write_round(r, rows, flush=rnd.stop or (r + 1) % self.flush_every == 0 or r + 1 == cfg.rounds)

    def after_round(self, rnd: Round) -> None:
        """Each client's checkpoint when due or at a stop (after the progress line); at a stop the file's close."""
        cfg, r, first = self.plan.config, rnd.index, self.clients[0]
        every = cfg.checkpoint.every
        if ((every and (r + 1) % every == 0) or rnd.stop) and r + 1 < cfg.rounds:
            rnd.announce("checkpointing")
            for c in self.clients:  # one file per client (named by the client), whatever rank holds it
                state = client_state(self.plan, c, self.comm.ledger, outside=c is first)
                self.folder.save(c.index, r + 1, state, lambda: self.fault.at("in_checkpoint"), self.writer.claimed)
        if rnd.stop:
            self.writer.close(outside=self._outside())
            # srun --kill-on-bad-exit ends every rank once one exits with 75: nobody leaves before
            # all have checkpointed and closed the file (a barrier moves no payload bytes).
            self.comm.mpi.Barrier()

    def finish(self, stopped: bool) -> None:
        if stopped:  # closed at the round's after_round, before the barrier
            return
        self._warn_single_class()
        self.folder.remove_checkpoints([c.index for c in self.clients])
        self.writer.close(outside=self._outside())  # only on success: a failing rank aborts instead

    def _outside(self) -> dict[int, Traffic]:
        """The rank's traffic outside rounds, on its first client (its others: none), as checkpointed."""
        ledger = self.comm.ledger
        return {c.index: ledger.outside_rounds if i == 0 else Traffic() for i, c in enumerate(self.clients)}

    def _warn_single_class(self) -> None:
        """After the last round (outside rounds: one Allreduce of a flag per client): record and warn
        about clients that predicted a single class in their last evaluated rounds (mpicd.evaluation.degenerate)."""
        clients = self.plan.config.clients
        mine = np.zeros(clients, dtype=np.int64)
        last = 0
        for c, flags in self.one_class.items():
            last = min(degenerate.LAST_ROUNDS, len(flags))
            mine[c] = int(last > 0 and all(flags[-last:]))
        flagged = [int(c) for c in np.flatnonzero(self.comm.allreduce_sum(mine, channel="single_class"))]
        self.writer.set_attr("single_class_clients", np.array(flagged, dtype=np.int64))
        if flagged and self.comm.rank == 0:
            self.log(f"mpicd: warning: {degenerate.warning(flagged, clients, last)}")
