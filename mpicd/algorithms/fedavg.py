"""FedAvg (McMahan et al., 2017) without a server: one Allreduce of the weighted models per round.

After the local epoch every rank contributes one float32 vector ``[n_i * theta_i ; n_i]`` to an
Allreduce(SUM), where ``theta_i`` is its flattened parameters followed by its floating-point
buffers and ``n_i`` is its actual training-set size after skew (the authors' code divided by the
pre-skew size, so their weights did not sum to 1). Every rank then sets
``theta <- sum[:-1] / sum[-1]``: the sample-weighted mean with weights ``n_i / sum(n)``, which
sum to 1. All ranks divide the same reduced vector the same way, so they end the round holding
bit-identical models (MPI recommends, and Open MPI and MPICH deliver, the same reduced vector on
every rank; the tests check the bits at 2, 4 and 6 ranks). Bytes per round per rank:
``4 (P + B + 1)`` sent and received (kind ``allreduce``), B = floating buffer elements (0 for
lenet and mlp; BatchNorm statistics for resnet18).

The optimizer's state (Adam's moments) stays on each client, as in FedAvg with local optimizers.
"""

from __future__ import annotations

import numpy as np
import torch

from .base import Algorithm


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
            t.copy_(torch.from_numpy(vector[offset: offset + n]).reshape(t.shape).to(t.device, t.dtype))
            offset += n
    if offset != len(vector):
        raise RuntimeError(f"fedavg: vector has {len(vector)} values, the model {offset}")


class FedAvg(Algorithm):
    name = "fedavg"

    def payload(self) -> np.ndarray:
        """This rank's contribution ``[n_i * theta_i ; n_i]`` (float32, P + B + 1 values)."""
        n = np.float32(len(self.ctx.train_y))
        theta = flatten(averaged_tensors(self.ctx.model))
        return np.ascontiguousarray(np.concatenate([theta * n, [n]]), dtype=np.float32)

    def after_epoch(self, round_index: int) -> None:
        total = self.ctx.comm.allreduce_sum(self.payload())
        assign(averaged_tensors(self.ctx.model), total[:-1] / total[-1])
