"""Poisson subsampling: each of n records is taken independently with probability q.

This is the sampling scheme under which the accountant's amplification by subsampling holds
(the PLD/RDP analyses of the Poisson-subsampled Gaussian, add/remove-one neighbours). A fixed-size
draw of k records without replacement is a different scheme (its amplification holds under
substitution neighbours) and is not what the accountant assumes, so co-distillation's ``k``
images become, on the private path, a Poisson sample with q = k / n: k images on average.
"""

from __future__ import annotations

import math

import numpy as np


def check_rate(q: float) -> float:
    q = float(q)
    if not (math.isfinite(q) and 0.0 < q <= 1.0):
        raise ValueError(f"privacy: the sampling rate q must be in (0, 1], got {q!r}")
    return q


def poisson_subset(n: int, q: float, generator: np.random.Generator) -> np.ndarray:
    """Sorted int64 indices of the records taken: record i is in iff ``u_i < q``, u_i uniform.

    Always draws exactly n uniforms from ``generator`` (also when q = 1), so what is drawn
    after it does not depend on q or on which records were taken.
    """
    q = check_rate(q)
    if n < 0:
        raise ValueError(f"privacy: the number of records must be >= 0, got {n}")
    return np.flatnonzero(generator.random(int(n)) < q).astype(np.int64)
