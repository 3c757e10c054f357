"""FedAMP (Huang et al., AAAI 2021): attentive message passing, without a server.

After the local epoch every rank Allgathers its flattened parameter vector (P float32), so every
rank holds all N models and computes, for itself only, the weights

    xi_ij = alpha * exp(-||w_i - w_j||^2 / sigma) / sigma   (j != i),   xi_ii = 1 - sum_{j != i} xi_ij

and its personalised cloud model ``u_i = sum_j xi_ij w_j``. In the next round's epoch it trains
its own model (continuing from its own w_i) on ``CE + (lambda / (2 alpha)) ||w - u_i||^2``, with
``w`` the live parameters and ``u_i`` a fixed tensor: the proximal term has a real gradient,
``(lambda / alpha)(w - u_i)``. (A widely copied implementation builds this term from detached
tensors, so it adds a constant to the loss and FedAMP silently becomes local training.)
Round 0 is plain local training; the exchange happens after every epoch, the last included.
Only parameters are exchanged: BatchNorm statistics (resnet18) are personal state.

Bytes per round per rank (``payloads``): ``4 P`` sent, ``4 N P`` received (kind ``allgather``). With
``exchange: ring`` (for large models on many ranks: ResNet-18 on 32 ranks gathers 1.4 GB per rank)
the models travel round a ring in N - 1 point-to-point steps instead: ``4 (N - 1) P`` sent and
``4 (N - 1) P`` received (kind ``p2p``), and a rank holds at most three float32 models (its own, the
one it passes on, the one arriving) and two float64 work vectors, 7P floats whatever N, instead of
N P; xi and u_i are accumulated as the models pass (:func:`streaming_cloud`), equal to the
Allgather's up to the order of float summation.

**Units of alpha and sigma.** ``||w_i - w_j||^2`` and ``||w - u_i||^2`` are sums over the P
coordinates, so any fixed sigma is either far too small for a ResNet-18 (11M parameters: every
xi_ij = 0) or far too large for a 15k-parameter MLP. The config therefore gives both *per
parameter*: the formula's sigma is ``sigma * P`` and its alpha is ``alpha * P``. Then
``||w_i - w_j||^2 / sigma = mean_k (w_ik - w_jk)^2 / sigma_cfg``, the largest neighbour weight is
``alpha / sigma`` (P cancels) and the proximal term is ``lambda / (2 alpha_cfg)`` times the mean
squared deviation from u_i: the same defaults behave alike on every model.

**Defaults, measured, not guessed**: ``sigma = 1e-4`` per parameter and ``lambda = 0.1``, from the
distances between clients' models and the xi they give; the measurements and the reasoning are in
docs/explanation/fedamp-defaults.md (re-measure for a new model or optimiser: ``tests/drivers/baselines.py``
writes every rank's xi).

**Default alpha** (``auto``): ``alpha = sigma / N``, so that identical models (round 0: all
clients start from the same initial model) give xi_ij = 1/N for every j, i.e. u_i is the plain
mean, and a neighbour's weight decays as it drifts away, the lost weight going to xi_ii.
**Guard:** since xi_ij <= alpha / sigma, ``xi_ii >= 1 - (N - 1) alpha / sigma``; an explicit
alpha above ``sigma / (N - 1)`` could make xi_ii negative (u_i extrapolating away from the
client's own model), so ``check`` rejects it before training.

``similarity: cosine`` is the paper's heuristic variant (HeurFedAMP): ``xi_ii = self_weight`` and
the rest split as a softmax of ``cosine_scale * cos(w_i, w_j)`` over the other clients.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Literal, Union

import numpy as np
import torch

from mpicd.algorithms.aggregate import allgather_over_clients, assign, flatten
from mpicd.algorithms.base import Algorithm, Batch, Context, Payload
from mpicd.core.schema import ConfigError, spec
from mpicd.models.networks import num_parameters


def squared_distances(models: np.ndarray, i: int) -> np.ndarray:
    """||w_i - w_j||^2 for every j (float64), from the gathered (N, P) float32 parameters."""
    own = models[i].astype(np.float64)
    return np.array([float(np.sum(np.square(m.astype(np.float64) - own))) for m in models])


def gaussian_weights(sq_distances: np.ndarray, i: int, alpha: float, sigma: float) -> np.ndarray:
    """Row i of FedAMP's xi: alpha exp(-d_ij / sigma) / sigma for j != i, xi_ii = 1 - the rest."""
    xi = alpha * np.exp(-sq_distances / sigma) / sigma
    xi[i] = 0.0
    xi[i] = 1.0 - xi.sum()
    return xi


def cosine_weights(models: np.ndarray, i: int, self_weight: float, scale: float) -> np.ndarray:
    """Row i of HeurFedAMP's xi: xi_ii = self_weight, the rest softmax(scale * cos(w_i, w_j)) * (1 - self_weight)."""
    n = len(models)
    xi = np.zeros(n)
    if n == 1:
        xi[0] = 1.0
        return xi
    w = models.astype(np.float64)
    norms = np.maximum(np.linalg.norm(w, axis=1), 1e-12)
    cos = (w @ w[i]) / (norms * norms[i])
    others = np.arange(n) != i
    logits = scale * cos[others]
    e = np.exp(logits - logits.max())
    xi[others] = (1.0 - self_weight) * e / e.sum()
    xi[i] = self_weight
    return xi


def cloud_model(models: np.ndarray, xi: np.ndarray) -> np.ndarray:
    """u_i = sum_j xi_ij w_j, accumulated in float64, returned as float32."""
    u = np.zeros(models.shape[1], dtype=np.float64)
    for weight, m in zip(xi, models):
        u += weight * m.astype(np.float64)
    return u.astype(np.float32)


def ring(comm, own: np.ndarray) -> Iterator[tuple[int, np.ndarray]]:
    """Yield (j, w_j) for every other rank j, holding two receive buffers besides ``own``.

    N - 1 steps; in step s every rank sends to rank + 1 what arrived in step s - 1 (its own model
    first) and receives from rank - 1, so it then holds w_{rank - s}. Each step is one
    ``Comm.exchange`` (both sides posted before the wait, tag s): it cannot deadlock. A yielded
    buffer is valid until the next step but one, i.e. while the caller uses it.
    """
    n, i = comm.size, comm.rank
    buffers, outgoing = (np.empty_like(own), np.empty_like(own)), own
    for step in range(1, n):
        incoming = buffers[step % 2]
        comm.exchange([((i + 1) % n, outgoing)], [((i - 1) % n, incoming)], tag=step, channel="payload")
        yield (i - step) % n, incoming
        outgoing = incoming


def streaming_cloud(
    own: np.ndarray,
    i: int,
    n: int,
    arrivals: Iterable[tuple[int, np.ndarray]],
    similarity: str,
    alpha: float,
    sigma: float,
    self_weight: float,
    scale: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Row i of xi and u_i (float32) from the other models seen once each, in any order.

    What :func:`gaussian_weights` / :func:`cosine_weights` and :func:`cloud_model` compute from all
    N models, with one float64 accumulator: a gaussian weight is final when w_j arrives; cosine's
    softmax over the others is online (running max m of the logits, sum_j exp(l_j - m) and
    sum_j exp(l_j - m) w_j, both rescaled by exp(m_old - m_new) when the max grows).
    """
    xi, u = np.zeros(n), np.zeros(len(own), dtype=np.float64)
    if n == 1:
        xi[i] = 1.0
        return xi, own.copy()
    work = np.empty_like(u)
    own_norm = max(float(np.sqrt(np.square(own, out=work, dtype=np.float64).sum())), 1e-12)
    top, total = -np.inf, 0.0  # cosine: running max and sum
    for j, w in arrivals:
        if similarity == "gaussian":
            np.subtract(w, own, out=work, dtype=np.float64)
            xi[j] = weight = alpha * np.exp(-float(np.sum(np.square(work, out=work))) / sigma) / sigma
        else:
            norm = max(float(np.sqrt(np.square(w, out=work, dtype=np.float64).sum())), 1e-12)
            cos = float(np.multiply(w, own, out=work, dtype=np.float64).sum()) / (norm * own_norm)
            xi[j] = logit = scale * cos  # the logit until the end
            if logit > top:
                u *= np.exp(top - logit)
                total *= np.exp(top - logit)
                top = logit
            weight = np.exp(logit - top)
            total += weight
        u += np.multiply(w, weight, out=work, dtype=np.float64)
    others = np.arange(n) != i
    if similarity == "gaussian":
        xi[i] = 1.0 - xi[others].sum()
        u += np.multiply(own, xi[i], out=work, dtype=np.float64)
    else:
        e = np.exp(xi[others] - top)
        xi[others], xi[i] = (1.0 - self_weight) * e / e.sum(), self_weight
        u *= (1.0 - self_weight) / total
        u += np.multiply(own, self_weight, out=work, dtype=np.float64)
    return xi, u.astype(np.float32)


@dataclass
class FedAMPParams:
    lambda_: float = spec(
        0.1,
        ge=0.0,
        doc="weight of the proximal term (lambda / (2 alpha)) ||w - u_i||^2; "
        "default measured, see docs/explanation/fedamp-defaults.md",
    )
    sigma: float = spec(
        1e-4,
        gt=0.0,
        doc="kernel width per parameter (the formula's sigma is sigma * P); default measured on the mlp and lenet",
    )
    alpha: Union[float, Literal["auto"]] = spec(
        "auto",
        gt=0.0,
        doc="per parameter (the formula's alpha is alpha * P); auto: sigma / clients, so identical "
        "models are averaged equally; must be <= sigma / (clients - 1) so that xi_ii >= 0",
    )
    similarity: Literal["gaussian", "cosine"] = spec(
        "gaussian", doc="gaussian: the paper's xi from squared distances; cosine: the heuristic HeurFedAMP"
    )
    self_weight: float = spec(0.5, ge=0.0, le=1.0, doc="cosine only: xi_ii")
    cosine_scale: float = spec(
        10.0, gt=0.0, doc="cosine only: the other clients' weights are softmax(cosine_scale * cos)"
    )
    exchange: Literal["allgather", "ring"] = spec(
        "allgather",
        doc="allgather: every rank holds all N models (4P sent, 4NP received); ring: N - 1 p2p steps "
        "passing models on, at most 3 held (4(N-1)P sent and received), same result up to rounding",
    )


def alpha_per_parameter(params: FedAMPParams, clients: int) -> float:
    return params.sigma / clients if params.alpha == "auto" else float(params.alpha)


class FedAMP(Algorithm):
    name = "fedamp"
    Params = FedAMPParams
    carried = ("xi", "cloud")
    payloads = (
        Payload(
            "allgather",
            "its flattened parameters w_i (BatchNorm statistics stay personal), to every rank",
            "(P,) block, (N, P) gathered",
            sent="4*P",
            recv="4*N*P",
            when=(("exchange", "allgather"),),
            rank_sent="4*K*P",
        ),
        Payload(
            "p2p",
            "its parameters, then each model it received, to the next rank in a ring (N - 1 steps)",
            "(P,) per step",
            sent="4*(N-1)*P",
            recv="4*(N-1)*P",
            when=(("exchange", "ring"),),
        ),
    )

    @classmethod
    def check(cls, params: FedAMPParams, train_counts: np.ndarray, expertise: np.ndarray) -> None:
        clients = len(expertise)
        if (
            params.similarity == "gaussian"
            and params.alpha != "auto"
            and clients > 1
            and params.alpha * (clients - 1) > params.sigma
        ):
            raise ConfigError(
                "algorithm.alpha",
                f"is {params.alpha}, but with {clients} clients and sigma "
                f"{params.sigma} xi_ii = 1 - sum of the others could be negative; alpha must be "
                f"<= sigma / (clients - 1) = {params.sigma / (clients - 1):.6g} (or auto)",
            )

    def __init__(self, params: FedAMPParams, ctx: Context):
        super().__init__(params, ctx)
        self.num_parameters = num_parameters(ctx.model)
        self.alpha = alpha_per_parameter(params, ctx.clients) * self.num_parameters  # the formula's alpha
        self.sigma = params.sigma * self.num_parameters  # the formula's sigma
        self.xi: np.ndarray | None = None  # this rank's row of xi, last round
        self.cloud: list[torch.Tensor] | None = None  # u_i, shaped like the parameters (no grad)

    dpsgd = True  # privacy: DP-SGD local training (mpicd.run.client), the proximal term added after the noise
    frozen: np.ndarray | None = None  # privacy: the model shared once the budget is spent

    @classmethod
    def check_private(cls, params: FedAMPParams) -> None:
        """The private path is DP-SGD on the local training: what is gathered is post-processing."""

    def privacy_spent(self, round_index: int) -> None:
        """The budget is spent: from now on it shares the model it had then (post-processing of its
        private steps), whatever it trains after."""
        if self.frozen is None:
            self.frozen = flatten(list(self.ctx.model.parameters()))

    def shared(self) -> np.ndarray:
        """The parameter vector it sends: its model, or the frozen one once its budget is spent."""
        return flatten(list(self.ctx.model.parameters())) if self.frozen is None else self.frozen

    def parameter_loss(self) -> torch.Tensor | None:
        return self.extra_loss(None)

    def state_dict(self) -> dict:
        return {**super().state_dict(), **({} if self.frozen is None else {"frozen": self.frozen})}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.frozen = state.get("frozen")

    def weights(self, models: np.ndarray) -> np.ndarray:
        i = self.ctx.index
        if self.params.similarity == "cosine":
            return cosine_weights(models, i, self.params.self_weight, self.params.cosine_scale)
        return gaussian_weights(squared_distances(models, i), i, self.alpha, self.sigma)

    @classmethod
    def after_round(cls, members: list["FedAMP"], round_index: int) -> None:
        """The ring (one client per rank), or one Allgather(v) of the rank's clients' models, from
        which each client computes its own xi and u_i (the same numbers on any layout)."""
        if members[0].params.exchange == "ring":
            (member,) = members  # mpicd.run.loop refuses the ring with several clients on a rank
            member._after_ring()
            return
        ctx = members[0].ctx
        models = allgather_over_clients(ctx, {m.ctx.index: m.shared() for m in members})
        for m in members:
            m.xi = m.weights(models)
            m._set_cloud(cloud_model(models, m.xi))

    def _set_cloud(self, u: np.ndarray) -> None:
        cloud = [torch.empty_like(p, requires_grad=False) for p in self.ctx.model.parameters()]
        assign(cloud, u)
        self.cloud = cloud

    def _after_ring(self) -> None:
        own, cfg = self.shared(), self.params
        self.xi, u = streaming_cloud(
            own,
            self.ctx.index,
            self.ctx.clients,
            ring(self.ctx.comm, own),
            cfg.similarity,
            self.alpha,
            self.sigma,
            cfg.self_weight,
            cfg.cosine_scale,
        )
        self._set_cloud(u)

    def proximal(self) -> torch.Tensor:
        """(lambda / (2 alpha)) ||w - u_i||^2 on the live parameters: differentiable in w."""
        total = sum(torch.sum((p - u) ** 2) for p, u in zip(self.ctx.model.parameters(), self.cloud))
        return self.params.lambda_ / (2.0 * self.alpha) * total

    def extra_loss(self, batch: Batch) -> torch.Tensor | None:
        if self.cloud is None or self.params.lambda_ == 0.0:
            return None
        return self.proximal()
