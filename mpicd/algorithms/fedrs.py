"""FedRS (Li & Zhan, KDD 2021, "FedRS: Federated Learning with Restricted Softmax for Label
Distribution Non-IID Data"): FedAvg whose clients train with a restricted softmax.

A client that lacks a class still pushes that class's logit down on every sample it trains on
(the class is always a wrong answer locally), so its update teaches the global head to never predict
it. FedRS scales each class's logit by s_c before the softmax of the local loss, damping the classes
a client lacks or rarely sees:

* ``restriction: soft`` (the default; the authors' code, lxcnju/FedRepo ``algorithms/fedrs.py``):
  s_c = alpha + (1 - alpha) n_c / max_k n_k, n_c the client's images of class c (all of them,
  whatever ``train.sampler`` draws): a rare class is damped, a lacking one most;
* ``restriction: hard`` (the paper's text; Flower's FedRS baselines, pull requests 4547 and 4548):
  s_c = 1 for a class the client holds, ``alpha`` for one it lacks. Under the expertise partition
  with skew < 1 every client holds every class, so hard is FedAvg there, bit for bit (tested); it
  acts where a client lacks a class (a Dirichlet partition at small alpha, skew 1 data). Soft is the
  default for that reason: it acts on imbalance, the setting mpicd is for, as well as on absence.

The loss is the cross-entropy of ``s * z``, z the head's output (its bias included, as in Flower's
baselines; FedRepo's head is read without its bias, so the two agree where the bias is zero, and
tests/algorithms/test_fedrs.py checks both against the references' own code on bias-free cases).
Evaluation uses the raw logits. ``alpha = 1`` is FedAvg.

What crosses MPI: exactly FedAvg's (one Allreduce of ``[n_i theta_i ; n_i]``, mpicd.algorithms.fedavg);
which classes a client holds never leaves the rank.

Privacy: refused, as FedLC's: the scale depends on the client's class sizes (soft) or on which
classes it holds (hard), which zero-out adjacency keeps private, so one record can move every other
sample's gradient.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from mpicd.algorithms.base import Context
from mpicd.algorithms.fedavg import FedAvg, FedAvgParams
from mpicd.core.schema import ConfigError, spec


@dataclass
class FedRSParams(FedAvgParams):
    alpha: float = spec(
        0.5,
        ge=0.0,
        le=1.0,
        doc="the scale of a lacking class's logit in the local softmax (1: FedAvg; 0.5: the middle of the "
        "authors' sweep 0.9, 0.5, 0.1)",
    )
    restriction: Literal["soft", "hard"] = spec(
        "soft",
        doc="soft: scale alpha + (1 - alpha) n_c / max n for every class (the authors' code); hard: alpha for "
        "the classes the client lacks, 1 for the others (the paper's text: FedAvg when every client holds "
        "every class, as with the expertise partition)",
    )


def restriction_scale(counts: torch.Tensor, alpha: float, restriction: str) -> torch.Tensor:
    """s (C,) float64 from the client's class counts: hard, 1 where n_c > 0 else alpha; soft,
    alpha + (1 - alpha) n_c / max n."""
    counts = counts.to(torch.float64)
    if restriction == "hard":
        return torch.where(counts > 0, torch.ones_like(counts), torch.full_like(counts, alpha))
    return alpha + (1 - alpha) * counts / counts.max()


class FedRS(FedAvg):
    name = "fedrs"
    Params = FedRSParams

    def __init__(self, params, ctx: Context):
        super().__init__(params, ctx)
        counts = torch.bincount(ctx.train_y, minlength=ctx.num_classes)
        self.scale = restriction_scale(counts, params.alpha, params.restriction)  # on the data's device

    @classmethod
    def check_private(cls, params) -> None:
        raise ConfigError(
            "privacy",
            "fedrs has no private path: its restricted softmax depends on which classes the client holds "
            "and how many of each, so one record can move every sample's gradient; use fedavg",
        )

    def training_logits(self, logits: torch.Tensor) -> torch.Tensor:
        return logits * self.scale.to(logits.dtype)
