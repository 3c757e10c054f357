"""Per-vector L2 clipping: the step that bounds one record's influence on a sum by C.

A row x becomes x * min(1, C / ||x||_2). Rows already within the bound are returned unchanged
(bit for bit); clipped rows are scaled in float64 and then nudged down by one ulp at a time until
their float64 norm is <= C, so the sensitivity bound the accountant assumes holds exactly for the
numbers that are summed, not only up to rounding.
"""

from __future__ import annotations

import math

import numpy as np


def check_bound(bound: float) -> float:
    bound = float(bound)
    if not (math.isfinite(bound) and bound > 0):
        raise ValueError(f"privacy: the clipping bound C must be a finite number > 0, got {bound!r}")
    return bound


def row_norms(rows: np.ndarray) -> np.ndarray:
    """float64 L2 norm of each row of a (n, W) array."""
    return np.sqrt(np.einsum("ij,ij->i", rows, rows))


def clip_rows(rows, bound: float) -> np.ndarray:
    """(n, W) float64 copy of ``rows`` with every row's L2 norm clipped to ``bound``.

    Non-finite values are an error: a NaN or infinity would pass through the noise unbounded.
    """
    bound = check_bound(bound)
    rows = np.array(rows, dtype=np.float64, copy=True)
    if rows.ndim != 2:
        raise ValueError(f"privacy: clip_rows needs a (records, width) array, got shape {rows.shape}")
    if not np.isfinite(rows).all():
        raise ValueError("privacy: a vector to clip has a non-finite value (NaN or infinity)")
    norms = row_norms(rows)
    over = norms > bound
    rows[over] *= (bound / norms[over])[:, None]
    while True:  # rounding can leave a clipped norm one ulp above the bound: scale those down
        still = over & (row_norms(rows) > bound)
        if not still.any():
            return rows
        rows[still] *= 1.0 - 2.0**-52
