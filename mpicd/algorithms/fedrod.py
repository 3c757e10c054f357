"""FedRoD (Chen & Chao, ICLR 2022, "On Bridging Generic and Personalized Federated Learning for Image
Classification"): a generic model trained with the balanced softmax and averaged, plus a personal head
each client keeps.

The model's body f and head g (:class:`mpicd.models.networks.FeatureHeadModel`) are the generic model.
Client i trains it with the balanced-softmax loss, the cross-entropy of ``g(f(x)) + log n_i``, n_ic its
training images of class c (all of them, whatever ``train.sampler`` draws): the logits a model
trained on balanced data would give are shifted by the client's log prior, so what g learns is not
the client's skew (Ren et al., 2020). A class the client lacks gets -inf, as in PFLlib's
``clientrod.py``. The personal head p, a copy of g made once at the start (PFLlib's deepcopy of the
head), is trained on each batch with ``CE(g(f(x)) + p(f(x)), y)`` where g's output and f's are
detached: it learns only what the client's own data adds to the generic prediction and moves nothing
else. Both terms come from the same forward pass and are stepped together (one optimizer over f, g and
p with the run's ``train`` settings; Adam and SGD update each tensor on its own, so this is PFLlib's two
optimizers when they share settings). ``/metrics/train_ce`` is the balanced-softmax loss,
``/metrics/train_extra`` the personal head's.

Prediction: the client's personal model ``g(f(x)) + p(f(x))`` (scored like every personalised method,
held-out and personalised protocol); the generic model ``g(f(x))`` is also scored, in the
``/metrics/generic_*`` columns (:attr:`mpicd.algorithms.Algorithm.scores_generic`).

What crosses MPI: exactly FedAvg's (one Allreduce of ``[n_i theta_i ; n_i]`` over f and g); the
personal head and the label counts never leave the client.

Privacy: refused, as FedLC: the balanced softmax makes every sample's loss depend on the client's
class sizes, which zero-out adjacency keeps private.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from mpicd.algorithms.base import Batch, Context
from mpicd.algorithms.fedavg import FedAvg, FedAvgParams
from mpicd.core.schema import ConfigError


def balanced_softmax_logits(logits: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """``z + log n`` for every row (``counts``: (C,) images of each class); -inf where n_c = 0."""
    return logits + counts.to(torch.float64).log().to(logits.dtype)


def personal_loss(generic: torch.Tensor, personal: torch.Tensor, y: torch.Tensor, reduction: str = "mean"):
    """The personal head's term: CE(generic.detach() + personal, y); only ``personal`` gets a gradient."""
    return F.cross_entropy(generic.detach() + personal, y, reduction=reduction)


class FedRoD(FedAvg):
    name = "fedrod"
    Params = FedAvgParams
    scores_generic = True  # the generic model g(f(x)) is scored too (/metrics/generic_*)
    shared_at_evaluation = False  # predict is the personal model

    def __init__(self, params, ctx: Context):
        super().__init__(params, ctx)
        self.counts = torch.bincount(ctx.train_y, minlength=ctx.num_classes)  # n_ic, on the data's device
        self.personal = copy.deepcopy(ctx.model.head)  # p: starts as the common initial head

    @classmethod
    def check_private(cls, params) -> None:
        raise ConfigError(
            "privacy",
            "fedrod has no private path: its balanced-softmax loss depends on the client's class sizes, so one "
            "record moves every sample's gradient (DP-SGD bounds each sample's own); use fedavg",
        )

    def trained_parameters(self) -> list[torch.nn.Parameter]:
        return list(self.personal.parameters())

    def state_dict(self) -> dict:
        return {"personal": self.personal.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.personal.load_state_dict(state["personal"])

    def training_logits(self, logits: torch.Tensor) -> torch.Tensor:
        return balanced_softmax_logits(logits, self.counts)

    def extra_loss(self, batch: Batch) -> torch.Tensor:
        return personal_loss(batch.logits, self.personal(batch.features.detach()), batch.y)

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        features = self.ctx.model.features(x)
        return self.ctx.model.head(features) + self.personal(features)

    def predict_generic(self, x: torch.Tensor) -> torch.Tensor:
        return self.ctx.model(x)

    def predictor_tensors(self) -> list[torch.Tensor]:
        return [*super().predictor_tensors(), *self.personal.parameters()]
