"""DP-SGD (Abadi et al. 2016) for the model-sharing baselines, FedAvg and FedAMP, through Opacus.

:func:`make_private` wraps a client's model, a ``torch.optim`` optimizer and its local data with
Opacus (``PrivacyEngine.make_private``): Poisson-sampled minibatches (each local image in a batch
with probability q = batch_size / n), each sample's gradient clipped to L2 norm C over all
parameters ("flat" clipping), N(0, (sigma C)^2) added to the sum, divided by the expected batch
size q n. Each optimizer step is one release of the Poisson-subsampled Gaussian at (q, sigma),
accounted by :mod:`.accountant` (the same PLD accountant as the representation releases), per
client: what FedAvg/FedAMP then share is post-processing of the noised steps.

Opacus imports torch._dynamo, so it is imported inside the functions only (never on the default
path, which keeps ``mpicd.models.optim``). Randomness: the batch sampling and the noise are drawn from two
streams the caller passes (mpicd.privacy.streams: the client's secret key, or the public seed with
``privacy.noise: seeded``), not from torch generators: Opacus' own secure mode needs torchcsprng,
which is archived and has no build for this torch (``pip install torchcsprng``: no matching
distribution), and a torch generator seeded from the run's seed is one any peer can redraw. So
Opacus' Poisson sampler and DPOptimizer are kept, with their draws replaced: the sampler yields
``flatnonzero(sampling.random(n) < q)`` for Opacus' number of steps, the optimizer adds
``noise.normal(0, sigma C)`` to each clipped sum. The steps charged are Opacus' (q = 1 / the batches
of a plain DataLoader, steps = its sampler's ``int(1 / q)``) and are checked against the noised steps
the optimizer counted (:meth:`PrivateTraining.check_charged`).

Caveats for the wiring: a loss term that depends on the parameters only (FedAMP's proximal term)
gets no per-sample gradient, and Opacus overwrites ``p.grad`` with the noised clipped sum: such a
term must be applied as a separate, data-independent step (free of privacy cost). BatchNorm mixes
samples and is refused by Opacus' validator (resnet18): use lenet, fedavgcnn or mlp. An empty
Poisson batch is a step like any other: the forward and backward pass run on zero images, the
clipped sum is zero, the noise is added, and it is charged.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from mpicd.privacy.accountant import Accountant
from mpicd.privacy.clip import check_bound
from mpicd.privacy.gaussian import check_multiplier
from mpicd.privacy.sampling import check_rate


def schedule(n: int, batch_size: int) -> tuple[float, int]:
    """(q, steps per epoch) as Opacus' PrivacyEngine makes them for ``n`` images at ``batch_size``:
    q = 1 / len(DataLoader(n images, batch_size)), steps = its Poisson sampler's ``len`` (int(1 / q),
    which floating point can make one less than ceil(n / batch_size))."""
    from opacus.utils.uniform_sampler import UniformWithReplacementSampler

    q = 1 / len(torch.utils.data.DataLoader(range(int(n)), batch_size=int(batch_size)))
    return q, len(UniformWithReplacementSampler(num_samples=int(n), sample_rate=q))


@dataclass
class PrivateTraining:
    """What a client's private local training needs: the wrapped module (per-sample gradients),
    the DP optimizer (clips, noises, steps, counts its noised steps), the Poisson batches, and the
    privacy ledger."""

    module: torch.nn.Module
    optimizer: torch.optim.Optimizer
    x: torch.Tensor
    y: torch.Tensor
    sampling: object  # the stream of the batches (random(n))
    sample_rate: float
    steps_per_epoch: int
    noise_multiplier: float
    max_grad_norm: float
    accountant: Accountant

    def batches(self):
        """One epoch: Opacus' ``steps_per_epoch`` Poisson batches, image i in a batch iff u_i < q
        (n uniforms per batch from the sampling stream); a batch may be empty."""
        for _ in range(self.steps_per_epoch):
            taken = np.flatnonzero(self.sampling.random(len(self.y)) < self.sample_rate)
            index = torch.as_tensor(taken, dtype=torch.long, device=self.y.device)
            yield self.x[index], self.y[index]

    @property
    def noised_steps(self) -> int:
        """The steps the optimizer took, each a clipped sum plus noise (read back, not planned)."""
        return self.optimizer.noised_steps

    def check_charged(self, charged: int) -> None:
        """RuntimeError unless the optimizer took exactly the ``charged`` steps."""
        if self.noised_steps != charged:
            raise RuntimeError(f"privacy: DP-SGD took {self.noised_steps} noised steps, {charged} were charged")

    def record_steps(self, steps: int) -> None:
        self.accountant.spend(self.sample_rate, self.noise_multiplier, steps)

    def epsilon(self, delta: float) -> float:
        return self.accountant.epsilon(delta)


def _stream_optimizer():
    """Opacus' DPOptimizer with its noise drawn from a stream (:func:`make_private`)."""
    from opacus.optimizers import DPOptimizer
    from opacus.optimizers.optimizer import _check_processed_flag, _mark_as_processed

    class StreamNoiseDPOptimizer(DPOptimizer):
        def __init__(self, optimizer, *, noise, **kwargs):
            super().__init__(optimizer, **kwargs)
            self.noise, self.noised_steps = noise, 0

        def add_noise(self):
            std = self.noise_multiplier * self.max_grad_norm
            for p in self.params:
                _check_processed_flag(p.summed_grad)
                shape = tuple(p.summed_grad.shape)
                noise = torch.from_numpy(np.asarray(self.noise.normal(0.0, std, size=shape), dtype=np.float64))
                p.grad = (p.summed_grad + noise.to(p.summed_grad)).view_as(p)
                _mark_as_processed(p.summed_grad)
            self.noised_steps += 1

    return StreamNoiseDPOptimizer


def expected_batch_size(n: int, batch_size: int) -> int:
    """The public denominator of every step's noised sum: floor(n q), q = 1 / ceil(n / batch_size), in
    integers. Opacus' own ``int(n * q)`` in floating point gives 0 where n q is exactly 1 but n * (1 / n)
    rounds below it (n = 49, 98, 103 at batch size 1): a division by zero, a NaN model. Never below 1,
    as ceil(n / b) <= n."""
    n, batch_size = int(n), int(batch_size)
    if n < 1 or batch_size < 1:
        raise ValueError(f"privacy: DP-SGD needs n >= 1 images and train.batch_size >= 1, got {n}, {batch_size}")
    return n // -(-n // batch_size)


def make_private(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    batch_size: int,
    noise_multiplier: float,
    max_grad_norm: float,
    sampling,
    noise,
    accountant: Accountant | None = None,
) -> PrivateTraining:
    """Wrap (model, optimizer, local data) for DP-SGD; ``sampling`` and ``noise`` are the round's
    streams (mpicd.privacy.streams), ``accountant`` carries a client's ledger over rounds (a new one
    when None). The expected batch size is :func:`expected_batch_size`."""
    from opacus import GradSampleModule
    from opacus.validators import ModuleValidator

    check_bound(max_grad_norm)
    check_multiplier(noise_multiplier)
    problems = ModuleValidator.validate(model, strict=False)
    if problems:
        raise ValueError(f"privacy: DP-SGD cannot train this model: {problems[0]}")
    if len(x) != len(y) or len(x) == 0:
        raise ValueError(
            f"privacy: DP-SGD needs a non-empty local dataset with one label per sample, got {len(x)}, {len(y)}"
        )
    q, steps = schedule(len(x), batch_size)
    module = GradSampleModule(model, batch_first=True, loss_reduction="mean")
    dp_optimizer = _stream_optimizer()(
        optimizer,
        noise=noise,
        noise_multiplier=float(noise_multiplier),
        max_grad_norm=float(max_grad_norm),
        expected_batch_size=expected_batch_size(len(x), batch_size),
        loss_reduction="mean",
    )
    return PrivateTraining(
        module=module,
        optimizer=dp_optimizer,
        x=x,
        y=y,
        sampling=sampling,
        sample_rate=check_rate(q),
        steps_per_epoch=steps,
        noise_multiplier=float(noise_multiplier),
        max_grad_norm=float(max_grad_norm),
        accountant=accountant if accountant is not None else Accountant(),
    )


def batch_loss(module: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, loss=F.cross_entropy) -> torch.Tensor:
    """The batch's mean loss; of an empty batch, a zero that still runs the backward pass (its
    per-sample gradients are empty, so the step adds the noise alone)."""
    with warnings.catch_warnings():  # the images need no gradient: Opacus' hooks say so
        warnings.filterwarnings("ignore", message="Full backward hook is firing")
        out = module(x)
    return loss(out, y) if len(y) else loss(out, y, reduction="sum")


def backward(value: torch.Tensor) -> None:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Full backward hook is firing")
        value.backward()


def train_epoch(private: PrivateTraining, loss=F.cross_entropy) -> int:
    """One epoch of Poisson-sampled steps; returns the noised steps taken, all accounted (an empty
    batch is a step: its noise is added and it is counted)."""
    private.module.train()
    before = private.noised_steps
    for xb, yb in private.batches():
        private.optimizer.zero_grad(set_to_none=True)
        backward(batch_loss(private.module, xb, yb, loss))
        private.optimizer.step()
    steps = private.noised_steps - before
    private.record_steps(steps)
    return steps
