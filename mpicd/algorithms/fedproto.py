"""FedProto (Tan et al., AAAI 2022): clients share per-class mean features, never their models.

During the round's local epoch(s) client i accumulates, per class c, the sum S_ic of the
training-mode feature vectors of its batches (detached, as the forward pass produced them) and
the number n_ic of samples of c it trained on (times the local epochs, the same factor on every
client). After the epoch every rank contributes one float32 vector to an Allreduce(SUM) and
derives the global prototypes p_c locally from the result:

* ``weighting: samples`` (default, the paper's Eq. 6): the payload is ``[S_ic = n_ic * mean_ic
  (C x D) ; n_ic (C)]``, so ``p_c = sum_i n_ic mean_ic / sum_i n_ic``: the clients' means weighted
  by their sample counts of c, the weights ``|D_ic| / N_c`` of Eq. 6 and of the objective (Eq. 3).
  (Eq. 6 as printed carries a further factor ``1 / |N_c|``, the number of clients with c; with it the
  weights would sum to ``1 / |N_c|`` and p_c would not be a mean, so it is read as a typo.)
* ``weighting: equal`` (the reference code, yuetan031/FedProto ``proto_aggregation``): the payload
  is ``[mean_ic (C x D) ; 1 if client i had c (C)]``, so ``p_c`` is the plain mean of the means
  of the clients that had c, whatever their sample counts.

A class absent from a client that round adds a zero row and a zero to either payload; a class no
client had has no prototype. From the next round on the batch loss is
``CE + lambda * MSE(f(x_b), p[y_b])`` over the batch's samples whose class has a global prototype
(mean over those samples and the D coordinates). Models are never averaged.

Bytes per round per rank (``payloads``): ``4 C (D + 1)`` sent and received (kind ``allreduce``),
either way; ``reduction: exact`` (the same file on every layout, mpicd.mpi.comm.Comm.allreduce_sum_exact):
``8 + 8 C (D + 1)``.

Prediction uses the client's own head by default; ``predict: nearest_prototype`` classifies by
the nearest global prototype in squared Euclidean distance (what the reference code does).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F

from mpicd.core.schema import ConfigError, spec
from mpicd.algorithms.aggregate import (
    REDUCTION_DOC,
    PerClassMeans,
    allreduce_payloads,
    mean_over_clients,
    private_class_payload,
)
from mpicd.algorithms.base import Algorithm, Batch, Context, Payload


@dataclass
class FedProtoParams:
    lambda_: float = spec(1.0, ge=0.0, doc="weight of MSE(f(x), global prototype of y)")
    weighting: Literal["samples", "equal"] = spec(
        "samples",
        doc="samples: clients' means weighted by their counts of the class (the paper's Eq. 6); "
        "equal: plain mean of the clients' means (the reference code)",
    )
    predict: Literal["head", "nearest_prototype"] = spec(
        "head", doc="head: the client's own classifier; nearest_prototype: the nearest global prototype"
    )
    reduction: Literal["mpi", "exact"] = spec("mpi", doc=REDUCTION_DOC)


class FedProto(Algorithm):
    name = "fedproto"
    Params = FedProtoParams
    payloads = tuple(
        Payload(
            "allreduce",
            what
            + ("" if reduction == "mpi" else ", after the largest magnitude (float64), as int64 (reduction: exact)"),
            "(C D + C,)" if reduction == "mpi" else "(1,) + (C D + C,)",
            sent="4*C*(D+1)" if reduction == "mpi" else "8+8*C*(D+1)",
            recv="4*C*(D+1)" if reduction == "mpi" else "8+8*C*(D+1)",
            when=(("weighting", weighting), ("reduction", reduction)),
            dtypes=("float32",) if reduction == "mpi" else ("float64", "int64"),
        )
        for weighting, what in (
            ("samples", "[per-class sums of its training-mode features ; per-class sample counts]"),
            ("equal", "[per-class mean training-mode features ; 1 for each class it has]"),
        )
        for reduction in ("mpi", "exact")
    )
    carried = ("prototypes", "has_prototype")

    @classmethod
    def check_private(cls, params: FedProtoParams) -> None:
        """The private release is per-class sums and counts: the sample-weighted reading only."""
        if params.weighting != "samples":
            raise ConfigError("algorithm.weighting", f"is {params.weighting!r}, but privacy needs 'samples'")

    def __init__(self, params: FedProtoParams, ctx: Context):
        super().__init__(params, ctx)
        self.local = PerClassMeans(ctx.num_classes, ctx.model.feature_dim, ctx.device)
        self.sent: np.ndarray | None = None  # this round's payload (for tests and drivers)
        self.received: np.ndarray | None = None  # the Allreduce result
        self.prototypes: torch.Tensor | None = None  # (C, D) global prototypes
        self.has_prototype: torch.Tensor | None = None  # (C,) bool

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
            return self.local.payload(weighted=self.params.weighting == "samples")
        released = None
        if self.dropped_in != round_index:
            released = private_class_payload(ctx, ctx.model.features, ctx.model.feature_dim, round_index)
        return np.zeros_like(self.local.payload()) if released is None else released

    def observe_batch(self, batch: Batch) -> None:
        self.local.add(batch.features, batch.y)

    def extra_loss(self, batch: Batch) -> torch.Tensor | None:
        if self.prototypes is None or self.params.lambda_ == 0.0:
            return None
        mask = self.has_prototype[batch.y]
        if not bool(mask.any()):
            return None
        return self.params.lambda_ * F.mse_loss(batch.features[mask], self.prototypes[batch.y[mask]])

    @classmethod
    def after_round(cls, members: list["FedProto"], round_index: int) -> None:
        """The rank sums its participating clients' payloads, then one Allreduce (mpicd.mpi.comm); a
        client that sits the round out keeps what it had (mpicd.run.participation)."""
        received = allreduce_payloads(members, round_index)
        for m in (m for m in members if m.ctx.participating):
            m.received = received
            means, has = mean_over_clients(*m.local.split(received))
            m.prototypes = torch.from_numpy(means).to(m.ctx.device)
            m.has_prototype = torch.from_numpy(has).to(m.ctx.device)

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        model = self.ctx.model
        if self.params.predict == "head" or self.prototypes is None:
            return model(x)
        features = model.features(x)
        distance = ((features[:, None, :] - self.prototypes[None, :, :]) ** 2).sum(dim=2)
        return -distance.masked_fill(~self.has_prototype[None, :], float("inf"))
