"""FedAvg (McMahan et al., 2017) without a server: one Allreduce of the weighted models per round.

After the local epoch every rank contributes one float32 vector ``[n_i * theta_i ; n_i]`` to an
Allreduce(SUM), where ``theta_i`` is its flattened parameters followed by its floating-point
buffers and ``n_i`` is its actual training-set size after skew (the authors' code divided by the
pre-skew size, so their weights did not sum to 1). Every rank then sets
``theta <- sum[:-1] / sum[-1]``: the sample-weighted mean with weights ``n_i / sum(n)``, which
sum to 1. All ranks divide the same reduced vector the same way, so they end the round holding
bit-identical models (MPI recommends, and Open MPI and MPICH deliver, the same reduced vector on
every rank; the tests check the bits at 2, 4 and 6 ranks). Bytes per round per rank (``payloads``):
``4 (P + B + 1)`` sent and received (kind ``allreduce``), B = floating buffer elements (0 for
lenet, fedavgcnn and mlp; BatchNorm statistics for resnet18); ``reduction: exact`` (the same
file on every layout of clients on ranks, mpicd.mpi.comm.Comm.allreduce_sum_exact): ``8 + 8 (P + B + 1)``.

The optimizer's state (Adam's moments) stays on each client, as in FedAvg with local optimizers.

With ``privacy`` the local training is DP-SGD (Opacus, mpicd/privacy/dpsgd.py, in mpicd.run.client):
every optimizer step is one Poisson-subsampled Gaussian release at q = 1 / ceil(n_i / batch_size)
with multiplier sigma; a client whose budget is spent contributes nothing, as a dropped one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from mpicd.algorithms.aggregate import REDUCTION_DOC, allreduce_over_clients, assign, averaged_tensors, flatten
from mpicd.algorithms.base import Algorithm, Payload
from mpicd.core.schema import spec


@dataclass
class FedAvgParams:
    reduction: Literal["mpi", "exact"] = spec("mpi", doc=REDUCTION_DOC)


class FedAvg(Algorithm):
    name = "fedavg"
    Params = FedAvgParams
    payloads = (
        Payload(
            "allreduce",
            "[n_i theta_i ; n_i]: its parameters and floating buffers, flattened and "
            "multiplied by its training-set size n_i, then n_i",
            "(P + B + 1,)",
            sent="4*(P+B+1)",
            recv="4*(P+B+1)",
            when=(("reduction", "mpi"),),
        ),
        Payload(
            "allreduce",
            "the largest magnitude (float64), then [n_i theta_i ; n_i] as int64 multiples of one "
            "power of two (reduction: exact)",
            "(1,) + (P + B + 1,)",
            sent="8+8*(P+B+1)",
            recv="8+8*(P+B+1)",
            when=(("reduction", "exact"),),
            dtypes=("float64", "int64"),
        ),
    )

    dpsgd = True  # privacy: DP-SGD local training (mpicd.run.client), the average post-processing of it
    shared_at_evaluation = True  # every client ends the round with the average (mpicd.evaluation.predictors)

    @classmethod
    def check_private(cls, params) -> None:
        """The private path is DP-SGD on the local training: what is averaged is post-processing."""

    dropped = False

    def drop_update(self, round_index: int) -> None:
        self.dropped = True  # weight 0 in this round's average: the others' mean, as if absent

    def payload(self) -> np.ndarray:
        """This rank's contribution ``[n_i * theta_i ; n_i]`` (float32, P + B + 1 values); all
        zeros when its update was dropped (``on_nonfinite: skip``)."""
        n = np.float32(0 if self.dropped else len(self.ctx.train_y))
        theta = flatten(averaged_tensors(self.ctx.model))
        return np.ascontiguousarray(np.concatenate([theta * n, [n]]), dtype=np.float32)

    @classmethod
    def after_round(cls, members: list["FedAvg"], round_index: int) -> None:
        """The rank sums its participating clients' contributions, then one Allreduce (mpicd.mpi.comm);
        every client takes the average (mpicd.run.participation)."""
        mine = {m.ctx.index: m.payload() for m in members if m.ctx.participating}
        template = mine[min(mine)] if mine else members[0].payload()
        total = allreduce_over_clients(members[0].ctx, mine, template, members[0].params.reduction)
        for m in members:
            m.dropped = False
            if total[-1] > 0:  # 0: every client's update was dropped; each keeps its own model
                assign(averaged_tensors(m.ctx.model), total[:-1] / total[-1])
