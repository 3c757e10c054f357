"""Aggregation helpers the algorithms share: models as flat vectors, per-class means over clients.

Here rather than in one algorithm's module, so that no algorithm imports another.
"""

from __future__ import annotations

import numpy as np
import torch

from mpicd.privacy.release import class_sums_payload, private_class_sums
from mpicd.privacy.sampling import poisson_subset


def averaged_tensors(model: torch.nn.Module) -> list[torch.Tensor]:
    """Parameters, then floating-point buffers, in a fixed order: what FedAvg averages.

    BatchNorm's running mean and variance are averaged with the same weights as the parameters:
    they are statistics of the training data, and the averaged model must be evaluated with
    statistics of the same (pooled) distribution its averaged weights were fitted to.
    Integer buffers (BatchNorm's ``num_batches_tracked``) are left out: it is a step counter,
    not a statistic; a weighted mean of counters is not an integer and means nothing, and
    torch only reads it when ``momentum=None`` (cumulative averaging), which no mpicd model uses.
    """
    return [*model.parameters(), *(b for b in model.buffers() if b.is_floating_point())]


def flatten(tensors: list[torch.Tensor]) -> np.ndarray:
    """The tensors as one contiguous float32 vector on the CPU."""
    if not tensors:
        return np.zeros(0, dtype=np.float32)
    flat = torch.cat([t.detach().reshape(-1).to(torch.float32) for t in tensors])
    return np.ascontiguousarray(flat.cpu().numpy(), dtype=np.float32)


def assign(tensors: list[torch.Tensor], vector: np.ndarray) -> None:
    """Copy ``vector`` (the layout of :func:`flatten`) into the tensors, in place."""
    offset = 0
    with torch.no_grad():
        for t in tensors:
            n = t.numel()
            t.copy_(torch.from_numpy(vector[offset : offset + n]).reshape(t.shape).to(t.device, t.dtype))
            offset += n
    if offset != len(vector):
        raise RuntimeError(f"fedavg: vector has {len(vector)} values, the model {offset}")


class PerClassMeans:
    """Per-class sums and counts of vectors over a round, and the Allreduce payloads built from them.

    Both payloads are one contiguous float32 vector ``[rows (C x width) ; weights (C)]``:
    ``weighted=True``: rows are the sums n_c * mean_c, weights the counts n_c;
    ``weighted=False``: rows are the means, weights 1 for a class this client saw. A class it did
    not see has a zero row and weight 0 in both. Summed over ranks and divided row by row
    (:func:`mean_over_clients`), the first gives the sample-weighted, the second the equal-weighted
    mean of the clients' means.
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

    def payload(self, weighted: bool = False) -> np.ndarray:
        if weighted:
            rows, weights = self.sums, self.counts
        else:
            present = self.counts > 0
            rows = torch.where(
                present[:, None], self.sums / self.counts.clamp(min=1)[:, None], torch.zeros_like(self.sums)
            )
            weights = present.to(torch.float64)
        flat = torch.cat([rows.reshape(-1), weights]).to(torch.float32)
        return np.ascontiguousarray(flat.cpu().numpy())

    def split(self, vector: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """A payload (or a sum of payloads) -> (rows (C, width), weights (C,))."""
        c, w = self.num_classes, self.width
        return vector[: c * w].reshape(c, w), vector[c * w :]


def eval_rows(outputs, model: torch.nn.Module, x: torch.Tensor, width: int, chunk: int = 256) -> np.ndarray:
    """(len(x), width) float64: ``outputs`` of every image in eval mode without gradients, in chunks
    (the private releases' rows: one pass, one row per image); the model's mode is restored."""
    was_training = model.training
    model.eval()
    with torch.no_grad():
        rows = [outputs(x[i : i + chunk]).to(torch.float64).cpu() for i in range(0, len(x), chunk)]
    model.train(was_training)
    return torch.cat(rows).numpy() if rows else np.zeros((0, width))


def private_class_payload(ctx, outputs, width: int, round_index: int) -> np.ndarray | None:
    """FedProto's and FedDistill's release with privacy: ``[sums (C width) ; counts (C)]`` float32 of
    the client's training images Poisson-sampled at q, one eval-mode row each (``outputs``), clipped
    to C, the sums noised (std sigma C) and the counts noised (std sigma) or public (q n_c, n_c its
    images of class c); None when the client's budget refuses the release (mpicd.privacy.budget)."""
    budget = ctx.privacy
    s = budget.settings
    if not budget.request(round_index):
        return None
    generator = budget.generator(round_index)  # the Poisson sample, then the noise
    taken = torch.as_tensor(poisson_subset(len(ctx.train_y), s.q, generator), device=ctx.train_y.device)
    rows = eval_rows(outputs, ctx.model, ctx.train_x[taken], width)
    labels = ctx.train_y[taken].cpu().numpy()
    sums, counts = private_class_sums(
        rows, labels, ctx.num_classes, clip=s.clip, sigma=s.sigma, generator=generator, noise_counts=s.noised_counts
    )
    if not s.noised_counts:
        counts = s.q * np.bincount(ctx.train_y.cpu().numpy(), minlength=ctx.num_classes)
    payload = class_sums_payload(sums, counts)
    budget.released(round_index, payload)  # journaled before it is sent
    return payload


def mean_over_clients(summed: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(summed rows, summed weights) -> (global means = rows / weights, has_mean = weights > 0).

    Weights are sample counts or client counts: integers held exactly in float32. Rows of
    classes without weight are zero and flagged False.
    """
    has = weights > 0.5
    means = np.zeros_like(summed)
    means[has] = summed[has] / weights[has, None]
    return means, has


def one_per_rank(ctx) -> bool:
    """Whether the exchange is a single client's, without a layout (``ctx.owner`` None: drivers and
    tests that build one client per rank without the round loop): the plain operations then."""
    return ctx.owner is None


def allreduce_over_clients(
    ctx, contributions: dict[int, np.ndarray], template: np.ndarray, reduction: str = "mpi"
) -> np.ndarray:
    """The sum of every participating client's contribution: without a layout its ``allreduce_sum``;
    else the rank sums its clients' first (zeros like ``template`` if none takes part), then one
    Allreduce (:meth:`mpicd.mpi.comm.Comm.allreduce_sum_clients`). ``reduction: exact``: integer sums,
    the same bits on every layout (:meth:`mpicd.mpi.comm.Comm.allreduce_sum_exact`)."""
    if reduction == "exact":
        return ctx.comm.allreduce_sum_exact(
            contributions, template, ctx.clients, per_client=not one_per_rank(ctx), channel="payload"
        )
    if one_per_rank(ctx):
        (only,) = contributions.values()
        return ctx.comm.allreduce_sum(only, channel="payload")
    return ctx.comm.allreduce_sum_clients(contributions, template, channel="payload")


def allreduce_payloads(members: list, round_index: int) -> np.ndarray:
    """FedProto's and FedDistill's exchange: each participating client's ``payload(round_index)``
    (kept as its ``sent``), summed over every client of every rank (:func:`allreduce_over_clients`)."""
    taking = [m for m in members if m.ctx.participating]
    for m in taking:
        m.sent = m.payload(round_index)
    first = members[0]
    return allreduce_over_clients(
        first.ctx, {m.ctx.index: m.sent for m in taking}, first.local.payload(), first.params.reduction
    )


REDUCTION_DOC = (
    "mpi: one float32 Allreduce(SUM), the order of additions MPI's and the layout's (files agree "
    "across layouts to float32 rounding); exact: int64 fixed-point sums, the same bits on every "
    "layout, at 8 bytes a value instead of 4 (plus 8)"
)


def allgather_over_clients(ctx, blocks: dict[int, np.ndarray]) -> np.ndarray:
    """Every client's block in client order: with one client per rank an ``allgather``, else one
    Allgatherv of each rank's clients' blocks (:meth:`mpicd.mpi.comm.Comm.allgather_clients`)."""
    if one_per_rank(ctx):
        (only,) = blocks.values()
        return ctx.comm.allgather(only, channel="payload")
    return ctx.comm.allgather_clients(blocks, ctx.owner, channel="payload")
