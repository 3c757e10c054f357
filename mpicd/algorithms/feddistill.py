"""Federated distillation (Jeong et al. 2018; Seo et al.): clients share per-class mean logits.

The same pattern as FedProto with logits instead of features: during the round each client
accumulates per-class sums of its training-mode logits (detached); after the epoch it
contributes ``[per-class mean logits (C x C) ; presence flags (C)]`` (float32) to an
Allreduce(SUM). A class absent from a client that round has a zero row and flag 0. The clients'
means are weighted equally, as in Jeong et al. From the next round the batch loss is
``CE + lambda * CE_soft(z_b, softmax(t[y_b]))``, averaged over the batch's samples whose class
has a teacher t.

* ``exclude_self: true`` (default, Jeong et al.'s FD: a device's teacher is the global average
  with its own local average taken out): the teacher of class c on rank i is the mean over the
  *other* clients that had c, ``(sum of the means - own mean) / (clients with c - own flag)``,
  computed locally from the same Allreduce result; a class that no other client had gets no term.
* ``exclude_self: false`` (what widely copied code does, e.g. PFLlib's FedDistill, whose server
  sends every client the same average): the teacher is the mean over all clients that had c, this
  rank's own mean included.

Bytes per round per rank (``payloads``): ``4 C (C + 1)`` sent and received (kind ``allreduce``),
either way; ``reduction: exact`` (the same file on every layout, mpicd.mpi.comm.Comm.allreduce_sum_exact):
``8 + 8 C (C + 1)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F

from mpicd.algorithms.base import Algorithm, Batch, Context, Payload
from mpicd.core.schema import spec
from mpicd.algorithms.aggregate import (
    REDUCTION_DOC,
    PerClassMeans,
    allreduce_payloads,
    mean_over_clients,
    private_class_payload,
)


def teacher_logits(
    received: np.ndarray, sent: np.ndarray, num_classes: int, exclude_self: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Allreduce result (and this rank's own payload) -> (teacher logits (C, C), has_teacher (C,))."""
    c = num_classes
    summed, contributors = received[: c * c].reshape(c, c), received[c * c :]
    if exclude_self:
        summed = summed - sent[: c * c].reshape(c, c)
        contributors = contributors - sent[c * c :]
    return mean_over_clients(summed, contributors)


@dataclass
class FedDistillParams:
    lambda_: float = spec(1.0, ge=0.0, doc="weight of the soft-target cross-entropy to the mean logits of y")
    exclude_self: bool = spec(
        True,
        doc="true: the teacher is the other clients' mean (Jeong et al.); "
        "false: all clients' mean, this one's included (common code)",
    )
    reduction: Literal["mpi", "exact"] = spec("mpi", doc=REDUCTION_DOC)


class FedDistill(Algorithm):
    name = "feddistill"
    Params = FedDistillParams
    payloads = (
        Payload(
            "allreduce",
            "[per-class mean training-mode logits ; 1 for each class it has]",
            "(C C + C,)",
            sent="4*C*(C+1)",
            recv="4*C*(C+1)",
            when=(("reduction", "mpi"),),
        ),
        Payload(
            "allreduce",
            "the largest magnitude (float64), then [per-class mean logits ; 1 for each class it has] "
            "as int64 (reduction: exact)",
            "(1,) + (C C + C,)",
            sent="8+8*C*(C+1)",
            recv="8+8*C*(C+1)",
            when=(("reduction", "exact"),),
            dtypes=("float64", "int64"),
        ),
    )
    carried = ("targets", "has_teacher")

    @classmethod
    def check_private(cls, params: FedDistillParams) -> None:
        """Private path: per-class logit sums and counts (the teacher then the pooled mean)."""

    def __init__(self, params: FedDistillParams, ctx: Context):
        super().__init__(params, ctx)
        self.local = PerClassMeans(ctx.num_classes, ctx.num_classes, ctx.device)
        self.sent: np.ndarray | None = None
        self.received: np.ndarray | None = None
        self.targets: torch.Tensor | None = None  # (C, C) softmax of the teacher logits
        self.has_teacher: torch.Tensor | None = None  # (C,) bool

    def before_epoch(self, round_index: int) -> None:
        self.local.reset()

    def drop_update(self, round_index: int) -> None:
        self.local.reset()  # no class counts: the others' means, as if this client were absent
        self.dropped_in = round_index

    dropped_in: int | None = None

    def payload(self, round_index: int) -> np.ndarray:
        """What the client contributes to the round's Allreduce; with privacy its private release
        (mpicd.algorithms.aggregate.private_class_payload), zeros when dropped or its budget is spent."""
        ctx = self.ctx
        if ctx.privacy is None:
            return self.local.payload()
        released = None
        if self.dropped_in != round_index:
            released = private_class_payload(ctx, ctx.model, ctx.num_classes, round_index)
        return np.zeros_like(self.local.payload()) if released is None else released

    def observe_batch(self, batch: Batch) -> None:
        self.local.add(batch.logits, batch.y)

    def extra_loss(self, batch: Batch) -> torch.Tensor | None:
        if self.targets is None or self.params.lambda_ == 0.0:
            return None
        mask = self.has_teacher[batch.y]
        if not bool(mask.any()):
            return None
        return self.params.lambda_ * F.cross_entropy(batch.logits[mask], self.targets[batch.y[mask]])

    @classmethod
    def after_round(cls, members: list["FedDistill"], round_index: int) -> None:
        """The rank sums its participating clients' payloads, then one Allreduce (mpicd.mpi.comm); a
        client that sits the round out keeps what it had (mpicd.run.participation)."""
        received = allreduce_payloads(members, round_index)
        for m in (m for m in members if m.ctx.participating):
            m.received = received
            logits, has = teacher_logits(received, m.sent, m.ctx.num_classes, m.params.exclude_self)
            m.targets = torch.softmax(torch.from_numpy(logits).to(m.ctx.device), dim=1)
            m.has_teacher = torch.from_numpy(has).to(m.ctx.device)
