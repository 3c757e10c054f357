"""FedNTD (Lee et al., NeurIPS 2022, "Preservation of the Global Knowledge by Not-True Distillation in
Federated Learning"): FedAvg whose clients distil the global model's predictions on the wrong classes.

Each round a client starts from the global model (the previous round's average; the common initial
model in round one) and keeps a frozen copy of it, the teacher. Its batch loss is

    CE(z, y) + beta * tau^2 * KL( softmax(g_nt / tau) || softmax(z_nt / tau) ),

z its own logits, g the teacher's (eval mode, no gradient), and ``_nt`` the logits with the sample's
true class removed (C - 1 columns), the KL a mean over the batch's samples ("batchmean"). Only the
distribution over the classes that are *not* the label is distilled, so the client may still learn
its own labels while it keeps the global model's view of the classes it rarely sees. With two
classes the not-true distribution has one class: the term is 0 and FedNTD is FedAvg, bit for bit
(tested): it acts from three classes (RetinaMNIST) on, and from a round's second local step on (at
the first the student is the teacher: the term and its gradient are 0 up to rounding). Defaults tau
1, beta 1: the authors' config (Lee-Gihun/FedNTD ``config/fedntd.json``; PFLlib's shared ``--beta``
default is 0, i.e. FedAvg).
The average is FedAvg's, sample-weighted (PFLlib's FedNTD server averages clients equally).

What crosses MPI: exactly FedAvg's (one Allreduce of ``[n_i theta_i ; n_i]``); the teacher is the
model every client already holds.

Privacy: refused for now: DP-SGD (mpicd.run.client) trains on the classification term alone, so the
distillation term would be silently dropped; a per-sample version through Opacus is not written.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from mpicd.algorithms.base import Batch, Context
from mpicd.algorithms.fedavg import FedAvg, FedAvgParams
from mpicd.core.schema import ConfigError, spec


@dataclass
class FedNTDParams(FedAvgParams):
    beta: float = spec(1.0, ge=0.0, doc="weight of the not-true distillation term (the authors' config: 1; 0: FedAvg)")
    tau: float = spec(1.0, gt=0.0, doc="softmax temperature of the not-true distributions (the authors' config: 1)")


def not_true(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """(B, C) logits without each row's true-class column: (B, C - 1), the other columns in order."""
    keep = torch.ones_like(logits, dtype=torch.bool)
    keep[torch.arange(len(labels), device=logits.device), labels] = False
    return logits[keep].reshape(len(labels), logits.shape[1] - 1)


def not_true_distillation(
    logits: torch.Tensor, teacher: torch.Tensor, labels: torch.Tensor, tau: float, reduction: str = "batchmean"
) -> torch.Tensor:
    """tau^2 * KL(softmax(teacher_nt / tau) || softmax(logits_nt / tau)), mean over rows ("batchmean")
    or their sum ("sum"); the teacher carries no gradient."""
    student = F.log_softmax(not_true(logits, labels) / tau, dim=1)
    target = F.softmax(not_true(teacher.detach(), labels) / tau, dim=1)
    return tau**2 * F.kl_div(student, target, reduction=reduction)


class FedNTD(FedAvg):
    name = "fedntd"
    Params = FedNTDParams

    def __init__(self, params, ctx: Context):
        super().__init__(params, ctx)
        self.global_model = copy.deepcopy(ctx.model).requires_grad_(False)  # refreshed at every round's start

    @classmethod
    def check_private(cls, params) -> None:
        raise ConfigError(
            "privacy",
            "fedntd has no private path yet: DP-SGD trains on the classification term alone and would drop "
            "the not-true distillation term; use fedavg",
        )

    def before_epoch(self, round_index: int) -> None:
        """The teacher: a frozen copy of the model the client starts the round with (the global model)."""
        self.global_model.load_state_dict(self.ctx.model.state_dict())
        self.global_model.eval()

    def extra_loss(self, batch: Batch) -> torch.Tensor | None:
        if self.params.beta == 0 or batch.logits.shape[1] < 3:
            return None  # two classes: nothing but the label's complement, a one-class distribution
        with torch.no_grad():
            teacher = self.global_model(batch.x)
        return self.params.beta * not_true_distillation(batch.logits, teacher, batch.y, self.params.tau)
