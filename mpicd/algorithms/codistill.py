"""Co-distillation (Racha et al., arXiv 2411.10383): share one mean feature vector, peer to peer.

Each round every client i learns from a teacher t(i) != i drawn from an RNG seeded by
(seed, round), so every rank knows the whole assignment without a message. A teacher sends
each of its students the mean feature vector R (D floats) of k random images of its expertise
class, computed in eval mode; the student adds lambda * MSE(f(x_b), R) over the batch samples
labelled with the teacher's expertise class. No parameters ever move.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Union

import numpy as np
import torch
import torch.nn.functional as F

from ..config import ConfigError, spec
from .. import seeds
from .base import Algorithm, Batch, Context


def teacher_assignment(seed: int, round_index: int, clients: int) -> np.ndarray:
    """t(i) for every client, uniform over the others; -1 everywhere for a single client."""
    if clients < 2:
        return np.full(clients, -1, dtype=np.int64)
    draws = seeds.rng(seed, seeds.TEACHERS, round_index).integers(0, clients - 1, size=clients)
    return draws + (draws >= np.arange(clients))


@dataclass
class CoDistillParams:
    lambda_: float = spec(1.0, ge=0.0, doc="weight of the distillation term")
    k: Union[int, Literal["all"]] = spec("all", ge=1, doc="images the teacher averages; all = its whole expertise class")


class CoDistillation(Algorithm):
    name = "codistill"
    Params = CoDistillParams

    @classmethod
    def check(cls, params: CoDistillParams, train_counts: np.ndarray, expertise: np.ndarray) -> None:
        for client, expert in enumerate(expertise):
            own = int(train_counts[client, expert])
            if params.k != "all" and params.k > own:
                raise ConfigError("algorithm.k", f"is {params.k}, but client {client} has only {own} "
                                                 f"images of its expertise class {int(expert)}")

    def __init__(self, params: CoDistillParams, ctx: Context):
        super().__init__(params, ctx)
        self.teachers = np.full(ctx.size, -1, dtype=np.int64)
        self.representation: torch.Tensor | None = None

    def representation_of_expertise(self, round_index: int) -> np.ndarray:
        """Mean eval-mode feature vector of k random images of this client's expertise class."""
        ctx = self.ctx
        (index,) = torch.nonzero(ctx.train_y == int(ctx.expertise[ctx.rank]), as_tuple=True)
        if self.params.k != "all":
            pick = seeds.rng(ctx.seed, seeds.ALGORITHM, ctx.rank, round_index).choice(
                len(index), size=self.params.k, replace=False)
            index = index[torch.as_tensor(np.sort(pick), device=index.device)]
        model = ctx.model
        was_training = model.training
        model.eval()
        with torch.no_grad():
            mean = model.features(ctx.train_x[index]).mean(dim=0)
        model.train(was_training)
        return np.ascontiguousarray(mean.detach().cpu().numpy(), dtype=np.float32)

    def before_epoch(self, round_index: int) -> None:
        ctx = self.ctx
        self.teachers = teacher_assignment(ctx.seed, round_index, ctx.size)
        self.representation = None
        if ctx.size < 2:
            return
        students = np.flatnonzero(self.teachers == ctx.rank)
        sends = []
        if len(students):
            mine = self.representation_of_expertise(round_index)
            sends = [(int(s), mine) for s in students]
        received = np.empty(ctx.model.feature_dim, dtype=np.float32)
        ctx.comm.exchange(sends, [(int(self.teachers[ctx.rank]), received)], tag=round_index % 32768)
        self.representation = torch.from_numpy(received).to(ctx.device)

    def extra_loss(self, batch: Batch) -> torch.Tensor | None:
        if self.representation is None or self.params.lambda_ == 0.0:
            return None
        mask = batch.y == int(self.ctx.expertise[self.teachers[self.ctx.rank]])
        if not bool(mask.any()):
            return None
        selected = batch.features[mask]
        return self.params.lambda_ * F.mse_loss(selected, self.representation.expand_as(selected))

    def teacher(self) -> int:
        return int(self.teachers[self.ctx.rank])
