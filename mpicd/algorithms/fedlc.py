"""FedLC (Zhang et al., ICML 2022, "Federated Learning with Label Distribution Skew via Logits
Calibration"): FedAvg whose clients train on logits calibrated by their own label counts.

Client i trains with the cross-entropy of the calibrated logits ``z_c - tau * n_ic ** (-1/4)``, n_ic its
training images of class c (all of them, whatever ``train.sampler`` draws): a rare class's logit is
lowered more, so the local loss pushes it up harder and the model leans less towards the client's
majority classes. A class the client lacks (n_ic = 0) gets -inf: it has no probability in the local
softmax and its logit no gradient, as in PFLlib's ``clientlc.py`` (``torch.pow(0, -1/4)`` is inf).
The sum runs over every class, the target's included, as in PFLlib's and Flower's code (the paper's
Eq. 11 prints a denominator over y' != y; the reference code does not). Evaluation uses the raw
logits. ``tau = 0`` is FedAvg.

What crosses MPI: exactly FedAvg's (one Allreduce of ``[n_i theta_i ; n_i]``, mpicd.algorithms.fedavg);
the label counts never leave the rank.

Privacy: refused. The calibration makes every sample's loss depend on the client's class sizes,
which zero-out adjacency keeps private (docs/explanation/privacy.md): one record changed moves every
other sample's gradient, which DP-SGD's per-sample clipping does not bound.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mpicd.algorithms.base import Context
from mpicd.algorithms.fedavg import FedAvg, FedAvgParams
from mpicd.core.schema import ConfigError, spec


@dataclass
class FedLCParams(FedAvgParams):
    tau: float = spec(
        1.0,
        ge=0.0,
        doc="the calibration strength: logit z_c - tau n_c^(-1/4), n_c the client's images of class c "
        "(PFLlib's default 1.0; 0: FedAvg)",
    )


def calibrated_logits(logits: torch.Tensor, counts: torch.Tensor, tau: float) -> torch.Tensor:
    """``z_c - tau * n_c ** (-1/4)`` for every row (``counts``: (C,) images of each class); -inf where
    n_c = 0 and tau > 0; the logits themselves when tau = 0 (where 0 * inf would be NaN)."""
    if tau == 0:
        return logits
    shift = tau * counts.to(torch.float64).pow(-0.25)  # n_c = 0: inf
    return logits - shift.to(logits.dtype)


class FedLC(FedAvg):
    name = "fedlc"
    Params = FedLCParams

    def __init__(self, params, ctx: Context):
        super().__init__(params, ctx)
        self.counts = torch.bincount(ctx.train_y, minlength=ctx.num_classes)  # n_ic, on the data's device

    @classmethod
    def check_private(cls, params) -> None:
        raise ConfigError(
            "privacy",
            "fedlc has no private path: its calibrated loss depends on the client's class sizes, so one "
            "record moves every sample's gradient (DP-SGD bounds each sample's own); use fedavg",
        )

    def training_logits(self, logits: torch.Tensor) -> torch.Tensor:
        return calibrated_logits(logits, self.counts, self.params.tau)
