"""The Gaussian mechanism on a sum of clipped vectors.

Sum of rows clipped to L2 norm C, plus N(0, (sigma C)^2) independently on every coordinate:
under add/remove-one neighbours the sum's L2 sensitivity is C, so sigma is the noise multiplier
(noise std / sensitivity) the accountant takes. sigma = 0 releases the exact clipped sum (no
privacy; the audit's positive control and epsilon = infinity).

Counts: a count is a sum of 1s, L2 sensitivity 1. Released next to the sums with noise std sigma
(sensitivity 1 times the same multiplier), the pair (sums / C, counts) is one Gaussian mechanism
on the stacked vector, with L2 sensitivity sqrt(2) and std sigma: noise multiplier sigma / sqrt(2)
(:func:`release_multiplier`). That is what the accountant must be given for such a release.
"""

from __future__ import annotations

import math

import numpy as np

from mpicd.privacy.clip import check_bound, clip_rows


def check_multiplier(sigma: float) -> float:
    sigma = float(sigma)
    if not (math.isfinite(sigma) and sigma >= 0):
        raise ValueError(f"privacy: the noise multiplier sigma must be a finite number >= 0, got {sigma!r}")
    return sigma


def noise_std(clip: float, sigma: float) -> float:
    """The standard deviation of the noise on each coordinate of a sum: sigma * C."""
    return check_multiplier(sigma) * check_bound(clip)


def release_multiplier(sigma: float, noised_counts: bool, blocks: int = 1) -> float:
    """The noise multiplier of a whole release for the accountant: sigma for noised sums alone
    (public counts or a public denominator), sigma / sqrt(2) for noised sums plus noised counts.
    ``blocks``: blocks of sums, each noised at sigma times its own L2 sensitivity (CCVR's feature sums
    and sums of outer products: 2), so the stacked release has sensitivity sqrt(blocks + counts) at
    std sigma: multiplier sigma / sqrt(blocks + noised_counts)."""
    sigma = check_multiplier(sigma)
    return sigma / math.sqrt(blocks + int(bool(noised_counts)))


def gaussian_sum(rows, *, clip: float, sigma: float, generator: np.random.Generator) -> np.ndarray:
    """(W,) float64: the sum of the clipped rows plus N(0, (sigma C)^2 I_W).

    ``rows`` is (n, W), n >= 0 (an empty sample releases pure noise). Draws exactly W normals.
    """
    clipped = clip_rows(rows, clip)
    return clipped.sum(axis=0) + generator.normal(0.0, noise_std(clip, sigma), size=clipped.shape[1])
