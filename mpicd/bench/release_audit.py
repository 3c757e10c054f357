"""Canary audits of every method's private release, each made by the code a run calls.

What is audited is the release itself, not a re-implementation of it: co-distillation's R comes
from ``CoDistillation.class_means`` (the default ``counts: noised``, ``share: features`` or
``logits``), FedProto's and FedDistill's payload from their ``payload`` methods, FedAvg's and
FedAMP's DP-SGD steps from :func:`mpicd.privacy.dpsgd.make_private` and ``train_epoch``. Each
runs with the run's :class:`~mpicd.privacy.budget.Budget` (its accountant charges the release as in
a run; the claim audited is that charge) and its secret stream (``privacy.noise: secret``), keyed by
the audit's seed so that a table can be regenerated.

Neighbours (zero-out, mpicd.privacy.ADJACENCY): a client's data D, and D with one canary record.
The records are vectors the model maps to themselves (an identity feature map: differential privacy
must hold for any model, and the auditor chooses the worst): D holds real LeNet vectors of real
images, the canary has norm 2C in a direction v orthogonal to the clipped sum of D's vectors of its
class, so that D adds nothing along v and the canary adds exactly C. DP-SGD's records are images
through a linear classifier without bias whose weights start (and, at learning rate 0, stay) at zero:
D's images have pixel 0 set to 0, so their gradients have no component on pixel 0's weights; the
canary is pixel 0 alone (its clipped gradient lies there, direction (-1, 1) / sqrt 2, norm C); its
zero-out neighbour is the all-zero image, whose gradient is 0. Every step's noised gradient is
observed (Opacus' ``step_hook``): the white-box view, more than the model a peer receives.

The distinguisher is the likelihood ratio of the released statistic where it is one, or close to
it: R . v (the noised count divides the whole R, so the peer sees the sum along v over a denominator
it does not know); (sums_c . v) / C + count_c for the per-class payload (two independent Gaussian
coordinates that each move by 1: their sum is the likelihood ratio, and the audit is tight for the
claimed multiplier sigma / sqrt 2); the sum over steps of the gradient along the canary's direction
for DP-SGD (each step's likelihood ratio is monotone in it). A trial of ``rounds`` releases (the
composition) scores the sum over its releases. The claim is tested by :mod:`mpicd.privacy.tradeoff`.

Positive controls: ``noise_scale`` s < 1 runs the mechanism at s sigma while the claim stays the
accountant's charge at sigma (what a release that forgot part of its noise would claim).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, replace

import numpy as np
import torch

from mpicd.algorithms import resolve
from mpicd.algorithms.base import Context
from mpicd.algorithms.codistill import CoDistillation
from mpicd.models.networks import FeatureHeadModel
from mpicd.privacy import dpsgd, tradeoff
from mpicd.privacy.budget import Budget, Settings
from mpicd.privacy.clip import clip_rows
from mpicd.privacy.streams import DPSGD_NOISE, DPSGD_SAMPLING

KINDS = ("codistill", "codistill-logits", "fedproto", "feddistill", "dpsgd")
DESCRIPTIONS = {
    "codistill": "co-distillation's R (share: features, counts: noised; the default)",
    "codistill-logits": "co-distillation's R (share: logits, counts: noised)",
    "fedproto": "FedProto's payload [sums ; counts] of features (counts noised)",
    "feddistill": "FedDistill's payload [sums ; counts] of logits (counts noised)",
    "dpsgd": "FedAvg's and FedAMP's DP-SGD local epoch (every step's noised gradient)",
}


@dataclass(frozen=True)
class Scores:
    """One audit's scores (``trials`` per neighbour, trial order) and the claim: the accountant's
    history of one trial at the claimed sigma (entries (q, multiplier, count))."""

    out: np.ndarray
    inside: np.ndarray
    claim: tuple


AUDIT_NONCE = "0" * 16


def audit_key(seed: int, kind: str, neighbour: int, noise_scale: float) -> bytes:
    """The secret stream's key of one neighbour's releases: derived from the audit's seed, so a table
    is repeatable (the audit is the auditor's experiment; a run's key is never derived)."""
    return hashlib.sha256(f"mpicd release audit {seed} {kind} {neighbour} {noise_scale!r}".encode()).digest()


def vector_model(width: int, num_classes: int) -> FeatureHeadModel:
    """Features = the input vectors, logits = the input vectors (``width`` = ``num_classes`` for the
    logit readings): the records are the vectors the release is computed from."""
    return FeatureHeadModel(torch.nn.Identity(), torch.nn.Identity(), width, num_classes)


def canary_direction(rows, clip: float, towards) -> np.ndarray:
    """The unit vector v: ``towards`` (a real held-out vector) less its component along the sum of
    ``rows`` clipped to ``clip`` (D's contribution to the release): D adds nothing along v."""
    total = clip_rows(np.asarray(rows, dtype=np.float64), clip).sum(axis=0)
    v = np.asarray(towards, dtype=np.float64).copy()
    norm = np.linalg.norm(total)
    if norm > 0:
        v -= (v @ total) / norm**2 * total
    length = np.linalg.norm(v)
    if not length > 1e-9:
        raise ValueError("privacy audit: the canary's direction is along D's sum; choose another held-out vector")
    return v / length


def _trial_budget(settings: Settings, seed: int, kind: str, neighbour: int, noise_scale: float) -> Budget:
    budget = Budget(settings, seed, neighbour)
    budget.key = audit_key(seed, kind, neighbour, noise_scale)
    budget.begin(AUDIT_NONCE, None)  # the key is the audit's own: one nonce for all its trials; nothing is sent
    return budget


def _claim(histories: list, noise_scale: float) -> tuple:
    first = histories[0]
    if any(h != first for h in histories):
        raise RuntimeError(f"privacy audit: the trials were charged differently: {sorted(set(histories))}")
    return tradeoff.scaled(first, 1.0 / noise_scale)


def representation_scores(
    kind: str,
    rows,
    labels,
    *,
    canary_class: int,
    towards,
    settings: Settings,
    trials: int,
    rounds: int = 1,
    seed: int = 0,
    noise_scale: float = 1.0,
) -> Scores:
    """Scores of ``trials`` trials of ``rounds`` releases each, on D = (``rows``, ``labels``) and on D
    plus the canary (class ``canary_class``, direction from ``towards``), for the representation
    releases (``kind`` codistill, codistill-logits, fedproto, feddistill; module docstring)."""
    if kind not in KINDS[:4]:
        raise ValueError(f"privacy audit: {kind!r} is not a representation release ({', '.join(KINDS[:4])})")
    rows = np.asarray(rows, dtype=np.float32)
    labels = np.asarray(labels, dtype=np.int64)
    num_classes = int(labels.max()) + 1 if kind.startswith("fed") else 2
    num_classes = max(num_classes, canary_class + 1, 2)
    width = rows.shape[1]
    if kind in ("codistill-logits", "feddistill") and width != num_classes:
        raise ValueError(f"privacy audit: {kind} releases logits: the vectors need {num_classes} columns, got {width}")
    clip = settings.clip
    v = canary_direction(rows[labels == canary_class], clip, towards)
    canary = (2.0 * clip * v).astype(np.float32)
    noisy = replace(settings, sigma=settings.sigma * noise_scale, budget=None)  # the charge is the claim
    model = vector_model(width, num_classes)
    scores, histories = np.zeros((2, int(trials))), []
    for b in (0, 1):
        x = np.vstack([rows, canary[None]]) if b else rows
        y = np.append(labels, canary_class) if b else labels
        expertise = np.array([canary_class, (canary_class + 1) % num_classes])
        ctx = Context(
            None, model, torch.device("cpu"), seed, num_classes, expertise, torch.from_numpy(x), torch.from_numpy(y),
            client=0, owner=np.zeros(2, dtype=np.int64),
        )  # fmt: skip
        if kind.startswith("codistill"):
            share = "logits" if kind == "codistill-logits" else "features"
            algorithm = CoDistillation(resolve({"name": "codistill", "share": share})[1], ctx)
        else:
            cls, params = resolve({"name": kind})
            algorithm = cls(params, ctx)
        for t in range(int(trials)):
            ctx.privacy = _trial_budget(noisy, seed, kind, b, noise_scale)
            for k in range(int(rounds)):
                round_index = t * int(rounds) + k
                if kind.startswith("codistill"):
                    scores[b, t] += float(algorithm.class_means(round_index)[0].astype(np.float64) @ v)
                else:
                    payload = algorithm.payload(round_index).astype(np.float64)
                    sums = payload[: num_classes * width].reshape(num_classes, width)
                    scores[b, t] += sums[canary_class] @ v / clip + payload[num_classes * width + canary_class]
            histories.append(tuple(ctx.privacy.accountant.history))
    return Scores(scores[0], scores[1], _claim(histories, noise_scale))


def dpsgd_images(images, labels) -> tuple[np.ndarray, np.ndarray]:
    """D for the DP-SGD audit: the images flattened to float32 rows with pixel 0 set to 0 (their
    gradients then have no component on pixel 0's weights), and their labels."""
    x = np.asarray(images, dtype=np.float32).reshape(len(images), -1).copy()
    x[:, 0] = 0.0
    return x, np.asarray(labels, dtype=np.int64)


def dpsgd_scores(
    images,
    labels,
    *,
    settings: Settings,
    batch_size: int,
    trials: int,
    seed: int = 0,
    noise_scale: float = 1.0,
) -> Scores:
    """Scores of ``trials`` DP-SGD local epochs (module docstring) on D = (``images``, ``labels``)
    plus the all-zero image, and on D plus the canary (pixel 0 alone, label 0), each epoch charged
    as ``mpicd.run.client`` charges a round: ``budget.request(round, steps, q, sigma)``."""
    x, y = dpsgd_images(images, labels)
    clip = settings.clip
    slot = np.zeros((2, x.shape[1]), dtype=np.float32)
    slot[1, 0] = 4.0 * clip  # its gradient at zero weights: (-1/2, 1/2) x 4C, norm 2 sqrt 2 C > C
    direction = torch.tensor([-1.0, 1.0], dtype=torch.float64) / math.sqrt(2.0)
    noisy = replace(settings, sigma=settings.sigma * noise_scale, budget=None)  # the charge is the claim
    q, steps = dpsgd.schedule(len(x) + 1, batch_size)
    scores, histories = np.zeros((2, int(trials))), []
    for b in (0, 1):
        data_x = torch.from_numpy(np.vstack([x, slot[b : b + 1]]))
        data_y = torch.from_numpy(np.append(y, 0))
        model = torch.nn.Linear(x.shape[1], 2, bias=False)
        torch.nn.init.zeros_(model.weight)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # the weights stay at zero
        for t in range(int(trials)):
            budget = _trial_budget(noisy, seed, "dpsgd", b, noise_scale)
            if not budget.request(t, steps, q, budget.settings.sigma):
                raise RuntimeError("privacy audit: the budget refused a DP-SGD epoch (audit settings carry no budget)")
            private = dpsgd.make_private(
                model, optimizer, data_x, data_y, batch_size=batch_size, noise_multiplier=noisy.sigma,
                max_grad_norm=clip, sampling=budget.stream(t, DPSGD_SAMPLING), noise=budget.stream(t, DPSGD_NOISE),
            )  # fmt: skip
            seen = []
            private.optimizer.step_hook = lambda _, seen=seen, w=model.weight: seen.append(
                float(w.grad[:, 0].double() @ direction)
            )
            try:
                dpsgd.train_epoch(private)
            finally:
                private.module.to_standard_module()
            private.check_charged(steps)  # as mpicd.run.client checks a round
            if len(seen) != steps:
                raise RuntimeError(f"privacy audit: {len(seen)} DP-SGD steps observed, {steps} charged")
            scores[b, t] = sum(seen)
            histories.append(tuple(budget.accountant.history))
    return Scores(scores[0], scores[1], _claim(histories, noise_scale))


@dataclass(frozen=True)
class Audit:
    """One audited release: the claim, its epsilon at ``delta``, the verdict, and the epsilon of the
    least multiplier the measured rates refute (:func:`mpicd.privacy.tradeoff.family_epsilon`)."""

    claim: tuple
    accounted: float
    verdict: tradeoff.Verdict
    family: float


def audit(scores: Scores, delta: float, alpha: float = 0.05, family: bool = True, region=None) -> Audit:
    """Test the claim of ``scores`` (:func:`mpicd.privacy.tradeoff.audit_claim`; ``region``: the
    claim's, when the caller has it already)."""
    region = tradeoff.Region(scores.claim) if region is None else region
    if region.history != tuple(scores.claim):
        raise ValueError("privacy audit: the region given is not the claim's")
    verdict = tradeoff.audit_claim(scores.out, scores.inside, region, alpha)
    accounted = tradeoff.composed_epsilon(scores.claim, delta)
    found = tradeoff.family_epsilon(scores.out, scores.inside, scores.claim, delta, alpha) if family else math.nan
    return Audit(scores.claim, accounted, verdict, found)
