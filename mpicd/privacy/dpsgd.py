"""DP-SGD (Abadi et al. 2016) for the model-sharing baselines, FedAvg and FedAMP, through Opacus.

:func:`make_private` wraps a client's model, a ``torch.optim`` optimizer and its local data with
Opacus (``PrivacyEngine.make_private``): Poisson-sampled minibatches (each local image in a batch
with probability q = batch_size / n), each sample's gradient clipped to L2 norm C over all
parameters ("flat" clipping), N(0, (sigma C)^2) added to the sum, divided by the expected batch
size q n. Each optimizer step is one release of the Poisson-subsampled Gaussian at (q, sigma),
accounted by :mod:`.accountant` (the same PLD accountant as the representation releases), per
client: what FedAvg/FedAMP then share is post-processing of the noised steps.

Opacus imports torch._dynamo, so it is imported inside :func:`make_private` only (never on the
default path, which keeps ``mpicd.optim``). Randomness: the batch sampling and the noise come from
two torch generators seeded from ``seeds.torch_seed(seed, seeds.PRIVACY, client, round, use)``, so
a client's private training is deterministic per seed on a given machine and thread count.

Caveats for the wiring: a loss term that depends on the parameters only (FedAMP's proximal term)
gets no per-sample gradient, and Opacus overwrites ``p.grad`` with the noised clipped sum: such a
term must be applied as a separate, data-independent step (free of privacy cost). BatchNorm mixes
samples and is refused by Opacus' validator (resnet18): use lenet, fedavgcnn or mlp.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .. import seeds
from .accountant import Accountant
from .clip import check_bound
from .gaussian import check_multiplier

from .streams import DPSGD_NOISE as NOISE
from .streams import DPSGD_SAMPLING as SAMPLING


@dataclass
class PrivateTraining:
    """What a client's private local training needs: the wrapped module (per-sample gradients),
    the DP optimizer (clips, noises, steps), the Poisson-sampling loader, and its privacy ledger."""

    module: torch.nn.Module
    optimizer: torch.optim.Optimizer
    loader: torch.utils.data.DataLoader
    sample_rate: float
    noise_multiplier: float
    max_grad_norm: float
    accountant: Accountant

    def record_steps(self, steps: int) -> None:
        self.accountant.spend(self.sample_rate, self.noise_multiplier, steps)

    def epsilon(self, delta: float) -> float:
        return self.accountant.epsilon(delta)


def make_private(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    batch_size: int,
    noise_multiplier: float,
    max_grad_norm: float,
    seed: int,
    client: int = 0,
    round_index: int = 0,
    accountant: Accountant | None = None,
) -> PrivateTraining:
    """Wrap (model, optimizer, local data) for DP-SGD; ``accountant`` carries a client's ledger
    over rounds (a new one when None). The expected batch size is ``batch_size``: q = 1 / ceil(n / batch_size)."""
    from opacus import PrivacyEngine
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

    def generator(use: int) -> torch.Generator:
        return torch.Generator(device="cpu").manual_seed(
            seeds.torch_seed(seed, seeds.PRIVACY, client, round_index, use)
        )

    dataset = torch.utils.data.TensorDataset(x, y)
    loader = torch.utils.data.DataLoader(dataset, batch_size=int(batch_size), generator=generator(SAMPLING))
    with warnings.catch_warnings():  # seeded generators on purpose: determinism per seed
        warnings.filterwarnings("ignore", message="Secure RNG turned off")
        engine = PrivacyEngine(accountant="rdp", secure_mode=False)
    module, dp_optimizer, dp_loader = engine.make_private(
        module=model,
        optimizer=optimizer,
        data_loader=loader,
        noise_multiplier=float(noise_multiplier),
        max_grad_norm=float(max_grad_norm),
        poisson_sampling=True,
        noise_generator=generator(NOISE),
    )
    return PrivateTraining(
        module=module,
        optimizer=dp_optimizer,
        loader=dp_loader,
        sample_rate=1.0 / math.ceil(len(x) / int(batch_size)),
        noise_multiplier=float(noise_multiplier),
        max_grad_norm=float(max_grad_norm),
        accountant=accountant if accountant is not None else Accountant(),
    )


def train_epoch(private: PrivateTraining, loss=F.cross_entropy) -> int:
    """One pass of Poisson-sampled steps (1 / q of them); returns the steps taken, all accounted
    (an empty batch is still a release: its noise is added and it is counted)."""
    private.module.train()
    steps = 0
    for xb, yb in private.loader:
        private.optimizer.zero_grad(set_to_none=True)
        if len(yb):
            with warnings.catch_warnings():  # the images need no gradient: Opacus' hooks say so
                warnings.filterwarnings("ignore", message="Full backward hook is firing")
                loss(private.module(xb), yb).backward()
        private.optimizer.step()
        steps += 1
    private.record_steps(steps)
    return steps
