"""The interface between the round loop and an algorithm: a few hooks, nothing else.

The loop trains one local epoch per round and asks the algorithm three things: what to
exchange before the epoch, what extra loss to add to a batch, what to exchange after the
epoch. All communication goes through ``ctx.comm`` so the ledger sees every byte.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np
import torch

from ..models import FeatureHeadModel

if TYPE_CHECKING:  # the comm layer imports MPI; `mpicd check` must work without it
    from ..comm import Comm


@dataclass
class Context:
    """What an algorithm may know about its rank and the run."""

    comm: "Comm"
    model: FeatureHeadModel
    device: torch.device
    seed: int
    num_classes: int
    expertise: np.ndarray            # (clients,) expertise class of every client
    train_x: torch.Tensor            # this client's training data, on ``device``
    train_y: torch.Tensor

    @property
    def rank(self) -> int:
        return self.comm.rank

    @property
    def size(self) -> int:
        return self.comm.size


@dataclass
class Batch:
    """One training minibatch after the forward pass (features and logits keep their graph)."""

    x: torch.Tensor
    y: torch.Tensor
    features: torch.Tensor
    logits: torch.Tensor


@dataclass
class NoParams:
    """For algorithms without hyper-parameters."""


class Algorithm:
    """Subclass, set ``name`` and ``Params``, override the hooks you need, add a registry line."""

    name: ClassVar[str]
    Params: ClassVar[type] = NoParams
    trains_on_union: ClassVar[bool] = False  # True: every rank trains on all clients' training data
    carried: ClassVar[tuple[str, ...]] = ()  # attributes that carry state from one round to the next

    def state_dict(self) -> dict:
        """What a checkpoint must hold for the next round to equal an uninterrupted run's."""
        return {name: getattr(self, name) for name in self.carried}

    def load_state_dict(self, state: dict) -> None:
        for name in self.carried:
            setattr(self, name, state[name])

    def __init__(self, params, ctx: Context):
        self.params = params
        self.ctx = ctx

    @classmethod
    def check(cls, params, train_counts: np.ndarray, expertise: np.ndarray) -> None:
        """Reject hyper-parameters the partition cannot satisfy (ConfigError), before training."""

    def before_epoch(self, round_index: int) -> None:
        """Exchange what the coming epoch needs (co-distillation's representations)."""

    def extra_loss(self, batch: Batch) -> torch.Tensor | None:
        """A term added to the batch's cross-entropy, or None."""
        return None

    def after_epoch(self, round_index: int) -> None:
        """Exchange what the finished epoch produced (averaging, prototypes, logits)."""

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """Logits used for evaluation."""
        return self.ctx.model(x)

    def teacher(self) -> int:
        """The client this rank learned from in the current round, -1 if none."""
        return -1
