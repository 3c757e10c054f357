"""FedProto (Tan et al., AAAI 2022): clients share per-class mean features, never their models.

During the round's local epoch(s) each client accumulates, per class, the sum of the
training-mode feature vectors of its batches (detached, as the forward pass produced them).
After the epoch it contributes one float32 vector ``[per-class means (C x D) ; presence flags
(C)]`` to an Allreduce(SUM). A class absent from a client's training data in that round gets a
zero mean row and flag 0, so it adds nothing to either part. Every rank then computes the
global prototype of class c as ``sum of the means / number of clients that had c`` (the clients'
means weighted equally, as the reference implementation does); a class no client had has no
prototype. From the next round on the batch loss is
``CE + lambda * MSE(f(x_b), p[y_b])`` over the batch's samples whose class has a global
prototype (mean over those samples and the D coordinates). Models are never averaged.

Bytes per round per rank: ``4 C (D + 1)`` sent and received (kind ``allreduce``).

Prediction uses the client's own head by default; ``predict: nearest_prototype`` classifies by
the nearest global prototype in squared Euclidean distance (what the reference code does).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F

from ..config import spec
from .base import Algorithm, Batch, Context


class PerClassMeans:
    """Per-class sums of vectors over a round, and the Allreduce payload built from them.

    The payload is ``[means (C x width) ; flags (C)]`` as one contiguous float32 vector: a class
    this client did not see has a zero row and flag 0. Summed over ranks, the first part is the
    sum of the clients' means and the second the number of clients that saw each class.
    """

    def __init__(self, num_classes: int, width: int, device: torch.device):
        self.num_classes, self.width = num_classes, width
        # float64 sums: exact enough whatever the number of samples (CUDA and CPU support it)
        self.sums = torch.zeros(num_classes, width, dtype=torch.float64, device=device)
        self.counts = torch.zeros(num_classes, dtype=torch.float64, device=device)

    def reset(self) -> None:
        self.sums.zero_()
        self.counts.zero_()

    def add(self, values: torch.Tensor, labels: torch.Tensor) -> None:
        values = values.detach().to(torch.float64)
        self.sums.index_add_(0, labels, values)
        self.counts.index_add_(0, labels, torch.ones_like(labels, dtype=torch.float64))

    def payload(self) -> np.ndarray:
        present = self.counts > 0
        means = torch.where(present[:, None], self.sums / self.counts.clamp(min=1)[:, None],
                            torch.zeros_like(self.sums))
        flat = torch.cat([means.reshape(-1), present.to(torch.float64)]).to(torch.float32)
        return np.ascontiguousarray(flat.cpu().numpy())

    def split(self, vector: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """A payload (or a sum of payloads) -> (means or their sum (C, width), flags or counts (C,))."""
        c, w = self.num_classes, self.width
        return vector[: c * w].reshape(c, w), vector[c * w:]


def mean_over_clients(summed: np.ndarray, contributors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sum of client means, number of contributing clients) -> (global means, has_mean).

    Rows of classes without contributors are zero and flagged False.
    """
    has = contributors > 0.5  # the counts are small integers held exactly in float32
    means = np.zeros_like(summed)
    means[has] = summed[has] / contributors[has, None]
    return means, has


@dataclass
class FedProtoParams:
    lambda_: float = spec(1.0, ge=0.0, doc="weight of MSE(f(x), global prototype of y)")
    predict: Literal["head", "nearest_prototype"] = spec(
        "head", doc="head: the client's own classifier; nearest_prototype: the nearest global prototype")


class FedProto(Algorithm):
    name = "fedproto"
    Params = FedProtoParams

    def __init__(self, params: FedProtoParams, ctx: Context):
        super().__init__(params, ctx)
        self.local = PerClassMeans(ctx.num_classes, ctx.model.feature_dim, ctx.device)
        self.sent: np.ndarray | None = None        # this round's payload (for tests and drivers)
        self.received: np.ndarray | None = None    # the Allreduce result
        self.prototypes: torch.Tensor | None = None  # (C, D) global prototypes
        self.has_prototype: torch.Tensor | None = None  # (C,) bool

    def before_epoch(self, round_index: int) -> None:
        self.local.reset()

    def extra_loss(self, batch: Batch) -> torch.Tensor | None:
        self.local.add(batch.features, batch.y)
        if self.prototypes is None or self.params.lambda_ == 0.0:
            return None
        mask = self.has_prototype[batch.y]
        if not bool(mask.any()):
            return None
        return self.params.lambda_ * F.mse_loss(batch.features[mask], self.prototypes[batch.y[mask]])

    def after_epoch(self, round_index: int) -> None:
        self.sent = self.local.payload()
        self.received = self.ctx.comm.allreduce_sum(self.sent)
        means, has = mean_over_clients(*self.local.split(self.received))
        self.prototypes = torch.from_numpy(means).to(self.ctx.device)
        self.has_prototype = torch.from_numpy(has).to(self.ctx.device)

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        model = self.ctx.model
        if self.params.predict == "head" or self.prototypes is None:
            return model(x)
        features = model.features(x)
        distance = ((features[:, None, :] - self.prototypes[None, :, :]) ** 2).sum(dim=2)
        return -distance.masked_fill(~self.has_prototype[None, :], float("inf"))
