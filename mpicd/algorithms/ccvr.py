"""CCVR (Luo et al., NeurIPS 2021, "No Fear of Heterogeneity: Classifier Calibration for Federated
Learning with Non-IID Data"): FedAvg, then its classifier recalibrated on virtual features drawn from
class Gaussians the clients' statistics describe.

Every round is FedAvg's. After the last round's average, every client that takes part in that round
(all of them unless ``participation`` < 1, when the others' images are left out, as from the
round's average) passes its training images through the global model's body once (eval mode) and
contributes, for each class c, the sum S_c of
its feature vectors, the sum Q_c of their outer products (its upper triangle: Q is symmetric) and its
count n_c, to one Allreduce(SUM). From the sums every client forms the same class Gaussians

    mu_c = S_c / N_c,    Sigma_c = (Q_c - N_c mu_c mu_c^T) / (N_c - 1)

(N_c the federation's images of c): the pooled unbiased covariance of all the class's features, which
is the paper's Eq. 4 (its client covariances unbiased). FL-bench's ``server/ccvr.py`` uses the same
pooling weights on client covariances it computes with ``correction=0``, which is not the pooled
covariance (tests/algorithms/test_ccvr.py shows the difference). A class with N_c < 2 (or, with
privacy, a noised count below 2) has no covariance and draws no virtual features. Every client then
draws ``virtual_per_class`` features of each such class from N(mu_c, Sigma_c) (Sigma_c's negative
eigenvalues, from noise or rounding, set to 0) from one stream all clients derive alike
(:data:`mpicd.core.seeds.CALIBRATION`), and retrains the model's head alone on them: plain SGD,
``calibration_lr``, ``calibration_batch``, ``calibration_epochs`` passes in an order from the same
stream (defaults FL-bench's: 200 per class, lr 0.01, batches of 32, one pass). Every client ends with
the same recalibrated model, which is what is evaluated in the last round; the rounds before are
FedAvg's, bit for bit. "The same": each rank recalibrates from the same sums and the same stream, so
the heads are equal bit for bit where the ranks' LAPACK/BLAS give the same bits for the same input
(one machine: tested on 1, 2, 3 and 6 ranks); nodes of different CPUs may differ in the last bits.

What crosses MPI: FedAvg's Allreduce every round; in the last round also ``[S (C D) ; upper(Q)
(C D (D + 1) / 2) ; n (C)]``, float64 (:func:`pack` says why; int64 with ``reduction: exact``):
``4 C (D + 1) (D + 2)`` bytes each way (``Payload.rounds: last``), 324,816 for the LeNet's D = 200 and
two classes (FedAvg's every round: 178,300).

Privacy: the rounds' training is DP-SGD as FedAvg's; the statistics are one more release, in the last
round, from the client's release stream: a Poisson sample at ``privacy.sample_rate`` (1 under
DP-SGD), each feature vector clipped to norm C, then N(0, (sigma C)^2) on every entry of S, N(0,
(sigma C^2)^2) on every entry of upper(Q) and N(0, sigma^2) on every count (``counts: public``: q n_c
exact). One record moves S by at most C, upper(Q) by at most ||x x^T||_F = ||x||^2 <= C^2 and its
count by 1, so the release is one Gaussian mechanism of multiplier sigma / sqrt(3) (sigma / sqrt(2)
with public counts), charged to the client's accountant like its DP-SGD steps. The virtual features
then come from the clipped features' distribution, while evaluation sees unclipped ones: with C below
the features' norms (the LeNet's tanh features of D = 200 reach norm 14; privacy.clip's default is 1)
the recalibrated head is fitted at another scale. And a class no client holds has a noised count of
std sigma sqrt(K) over K clients, which may exceed 2: such a class draws virtual features from noise.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from mpicd.algorithms.aggregate import allreduce_over_clients, eval_rows
from mpicd.algorithms.base import Context, Payload
from mpicd.algorithms.fedavg import FedAvg, FedAvgParams
from mpicd.core import seeds
from mpicd.core.schema import spec
from mpicd.models import optim
from mpicd.privacy.clip import clip_rows
from mpicd.privacy.gaussian import noise_std, release_multiplier
from mpicd.privacy.sampling import poisson_subset


@dataclass
class CCVRParams(FedAvgParams):
    virtual_per_class: int = spec(200, ge=1, doc="virtual features drawn of each class (FL-bench: 200)")
    calibration_lr: float = spec(
        0.01, gt=0.0, doc="plain SGD learning rate of the head's recalibration (FL-bench: 0.01)"
    )
    calibration_batch: int = spec(32, ge=1, doc="minibatch of the recalibration (FL-bench: its batch size, 32)")
    calibration_epochs: int = spec(1, ge=1, doc="passes over the virtual features (FL-bench: 1)")


def upper(d: int) -> tuple[np.ndarray, np.ndarray]:
    """Row and column indices of a d x d matrix's upper triangle, diagonal included, row by row."""
    return np.triu_indices(d)


def class_moments(rows: np.ndarray, labels: np.ndarray, num_classes: int):
    """((C, D) sums, (C, D, D) sums of outer products, (C,) counts) of float64 ``rows`` by label."""
    rows = np.asarray(rows, dtype=np.float64)
    d = rows.shape[1]
    sums = np.zeros((num_classes, d))
    outer = np.zeros((num_classes, d, d))
    for c in range(num_classes):
        mine = rows[labels == c]
        sums[c] = mine.sum(axis=0)
        outer[c] = mine.T @ mine
    return sums, outer, np.bincount(labels, minlength=num_classes).astype(np.float64)


def pack(sums: np.ndarray, outer: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``[S (C D) ; upper(Q) (C D (D + 1) / 2) ; n (C)]``, float64: the last round's payload. Float64
    because the covariance Q / N - mu mu^T cancels: for saturated features (tanh near +-1, a variance
    of 1e-8 against second moments of 1) float32 sums leave no correct digit."""
    i, j = upper(sums.shape[1])
    return np.ascontiguousarray(
        np.concatenate([sums.reshape(-1), outer[:, i, j].reshape(-1), counts]), dtype=np.float64
    )


def unpack(vector: np.ndarray, num_classes: int, d: int):
    """The inverse of :func:`pack` (float64; Q made symmetric from its upper triangle)."""
    vector = np.asarray(vector, dtype=np.float64)
    i, j = upper(d)
    t = len(i)
    sums = vector[: num_classes * d].reshape(num_classes, d)
    tri = vector[num_classes * d : num_classes * (d + t)].reshape(num_classes, t)
    outer = np.zeros((num_classes, d, d))
    outer[:, i, j] = tri
    outer[:, j, i] = tri
    return sums, outer, vector[num_classes * (d + t) :]


def class_gaussians(
    sums: np.ndarray, outer: np.ndarray, counts: np.ndarray
) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """(class, mean, covariance) of every class with a count of at least 2: mean S / N, covariance
    (Q - N mu mu^T) / (N - 1), made exactly symmetric (float rounding, and noise, may leave it
    indefinite: :func:`virtual_features` draws from its positive part)."""
    found = []
    for c, n in enumerate(counts):
        if not n >= 2:
            continue
        mu = sums[c] / n
        cov = (outer[c] - n * np.outer(mu, mu)) / (n - 1)
        found.append((c, mu, (cov + cov.T) / 2))
    return found


def virtual_features(gaussians, per_class: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``per_class`` draws of each Gaussian in class order: mu + A z, z standard normal, A = V sqrt(max(L, 0))
    from the covariance's eigendecomposition V L V^T (float64; a negative eigenvalue, from rounding or
    noise, counts as 0: the nearest positive semi-definite covariance). Returns (features (M, D), labels (M,))."""
    xs, ys = [], []
    for c, mu, cov in gaussians:
        values, vectors = np.linalg.eigh(cov)
        root = vectors * np.sqrt(np.clip(values, 0.0, None))
        xs.append(mu + rng.standard_normal((per_class, len(mu))) @ root.T)
        ys.append(np.full(per_class, c, dtype=np.int64))
    if not xs:
        return np.zeros((0, 0)), np.zeros(0, dtype=np.int64)
    return np.concatenate(xs), np.concatenate(ys)


def recalibrate(head: torch.nn.Module, x: np.ndarray, y: np.ndarray, params, rng) -> None:
    """Plain SGD on the head alone, cross-entropy of its logits of the virtual features, in minibatches
    of an order drawn from ``rng`` each pass."""
    if len(y) == 0:
        return
    weight = next(head.parameters())
    features = torch.as_tensor(x, dtype=weight.dtype, device=weight.device)
    labels = torch.as_tensor(y, device=weight.device)
    sgd = optim.SGD(list(head.parameters()), lr=params.calibration_lr)
    head.train()
    for _ in range(params.calibration_epochs):
        order = torch.as_tensor(rng.permutation(len(y)), device=weight.device)
        for start in range(0, len(y), params.calibration_batch):
            taken = order[start : start + params.calibration_batch]
            loss = F.cross_entropy(head(features[taken]), labels[taken])
            sgd.zero_grad(set_to_none=True)
            loss.backward()
            sgd.step()


def moments_multiplier(sigma: float, noised_counts: bool) -> float:
    """The accountant's multiplier of the statistics release: S and upper(Q) are two noised blocks."""
    return release_multiplier(sigma, noised_counts, blocks=2)


class CCVR(FedAvg):
    name = "ccvr"
    Params = CCVRParams
    payloads = (
        *FedAvg.payloads,
        *(
            Payload(
                "allreduce",
                "[per-class sums of its eval-mode features ; of their outer products, upper triangle ; per-class "
                "counts], float64" + ("" if reduction == "mpi" else ", after the largest magnitude, as int64"),
                "(C D + C D (D + 1) / 2 + C,)" if reduction == "mpi" else "(1,) + (C D + C D (D + 1) / 2 + C,)",
                sent="4*C*(D+1)*(D+2)" if reduction == "mpi" else "8+4*C*(D+1)*(D+2)",
                recv="4*C*(D+1)*(D+2)" if reduction == "mpi" else "8+4*C*(D+1)*(D+2)",
                when=(("reduction", reduction),),
                dtypes=("float64",) if reduction == "mpi" else ("float64", "int64"),
                rounds="last",
            )
            for reduction in ("mpi", "exact")
        ),
    )

    def __init__(self, params: CCVRParams, ctx: Context):
        super().__init__(params, ctx)
        self.gaussians: list | None = None  # after the last round: (class, mean, covariance) it drew from

    @classmethod
    def release_attrs(cls, settings) -> dict:
        return {"privacy_moments_multiplier": moments_multiplier(settings.sigma, settings.noised_counts)}

    def moments(self, round_index: int) -> np.ndarray:
        """The client's statistics payload (:func:`pack`); with privacy its private release, zeros when
        its budget refuses it."""
        ctx, d = self.ctx, self.ctx.model.feature_dim
        if ctx.privacy is None:
            rows = eval_rows(ctx.model.features, ctx.model, ctx.train_x, d)
            return pack(*class_moments(rows, ctx.train_y.cpu().numpy(), ctx.num_classes))
        budget, s = ctx.privacy, ctx.privacy.settings
        empty = pack(np.zeros((ctx.num_classes, d)), np.zeros((ctx.num_classes, d, d)), np.zeros(ctx.num_classes))
        if not budget.request(round_index, 1, s.q, moments_multiplier(s.sigma, s.noised_counts)):
            return empty
        generator = budget.generator(round_index)  # the Poisson sample, then the noise: S, upper(Q), counts
        taken = torch.as_tensor(poisson_subset(len(ctx.train_y), s.q, generator), device=ctx.train_y.device)
        rows = clip_rows(eval_rows(ctx.model.features, ctx.model, ctx.train_x[taken], d), s.clip)
        sums, outer, counts = class_moments(rows, ctx.train_y[taken].cpu().numpy(), ctx.num_classes)
        i, j = upper(d)
        sums += generator.normal(0.0, noise_std(s.clip, s.sigma), size=sums.shape)
        tri = outer[:, i, j] + generator.normal(
            0.0, noise_std(s.clip, s.sigma) * s.clip, size=(ctx.num_classes, len(i))
        )
        outer[:, i, j], outer[:, j, i] = tri, tri
        if s.noised_counts:
            counts += generator.normal(0.0, s.sigma, size=ctx.num_classes)
        else:
            counts = s.q * np.bincount(ctx.train_y.cpu().numpy(), minlength=ctx.num_classes)
        payload = pack(sums, outer, counts)
        budget.released(round_index, payload)  # journaled before it is sent
        return payload

    @classmethod
    def after_round(cls, members: list["CCVR"], round_index: int) -> None:
        """FedAvg's average; after the last round's, the statistics' Allreduce and every client's
        recalibration (mpicd.algorithms.aggregate.allreduce_over_clients: a rank sums its clients')."""
        super().after_round(members, round_index)
        first = members[0]
        if first.ctx.rounds is None or round_index != first.ctx.rounds - 1:
            return
        mine = {m.ctx.index: m.moments(round_index) for m in members if m.ctx.participating}
        d, k = first.ctx.model.feature_dim, first.ctx.num_classes
        template = pack(np.zeros((k, d)), np.zeros((k, d, d)), np.zeros(k))
        total = allreduce_over_clients(first.ctx, mine, template, first.params.reduction)
        gaussians = class_gaussians(*unpack(total, k, d))
        for m in members:
            m.gaussians = gaussians
            rng = seeds.rng(m.ctx.seed, seeds.CALIBRATION, round_index)  # the same on every client
            x, y = virtual_features(gaussians, m.params.virtual_per_class, rng)
            recalibrate(m.ctx.model.head, x, y, m.params, rng)
