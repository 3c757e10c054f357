"""Testing a privacy claim with measured error rates: the accountant's whole profile, not one delta.

The accountant's claim for a client's releases is a privacy profile, delta(epsilon) for every
epsilon (its privacy loss distribution, :func:`.accountant.privacy_loss`). Any test telling the
neighbouring datasets apart -- say "the canary is in" when a score exceeds a threshold -- then has
rates inside the region

    TPR <= e^eps FPR + delta(eps)   and   1 - FPR <= e^eps (1 - TPR) + delta(eps)   for every eps,

so :meth:`Region.max_tpr` is the most power the claim allows at a false-positive rate (for one
Gaussian release at multiplier sigma it is Dong, Roth and Su's Gaussian trade-off curve,
Phi(Phi^-1(FPR) + 1/sigma)). Why the whole profile: an audit at the accountant's delta = 1e-5 must
measure false-positive rates near 1e-4 and needs about a million releases to tell epsilon from twice
it; in the middle of the curve (FPR about 0.3) a few thousand do (Nasr et al. 2023, "Tight auditing
of differentially private machine learning", audit in the same trade-off terms).

:func:`audit_claim`: the threshold is chosen on the first half of each neighbour's scores (the one
that most exceeds the region there), the rates measured on the second half; the claim is refuted
("flagged") if the second half's TPR lower and FPR upper Clopper-Pearson bounds (each one-sided at
alpha / 2, so together at confidence 1 - alpha) lie outside the region. A mechanism that keeps its
claim is flagged with probability at most alpha, whatever its scores' distribution.

:func:`family_epsilon` puts the measurement in epsilon terms under one assumption, said where it is
printed: that the mechanism is the accountant's mechanism with some multiplier. It is the
accountant's epsilon at delta of the least noise the measured rates refute (every multiplier at or
above it is refuted), so a correct mechanism shows one below the accounted epsilon and one with half
the claimed noise one above it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from mpicd.privacy.accountant import SMALLEST_SIGMA, _check_delta, Accountant, privacy_loss

EPSILON_GRID = np.linspace(0.0, 40.0, 4001)  # the profile is read at these epsilons (step 0.01)
THRESHOLDS = 201  # quantiles of the calibration scores tried as thresholds


class Region:
    """The (FPR, TPR) pairs the accountant's ``history`` allows (module docstring)."""

    def __init__(self, history):
        self.history = tuple((float(q), float(sigma), int(count)) for q, sigma, count in history)
        self.delta = np.asarray(privacy_loss(self.history).get_delta_for_epsilon(EPSILON_GRID), dtype=np.float64)
        self.scale = np.exp(EPSILON_GRID)

    def max_tpr(self, fpr) -> np.ndarray:
        """The largest TPR the claim allows at each false-positive rate ``fpr`` (array or float)."""
        fpr = np.clip(np.asarray(fpr, dtype=np.float64), 0.0, 1.0)[..., None]
        first = self.scale * fpr + self.delta
        second = 1.0 - (1.0 - fpr - self.delta) / self.scale
        return np.clip(np.minimum(first, second).min(axis=-1), 0.0, 1.0)


def clopper_pearson_bounds(successes, trials: int, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """Elementwise (lower, upper) two-sided (1 - alpha) Clopper-Pearson bounds of successes / trials."""
    from scipy.stats import beta

    k = np.asarray(successes, dtype=np.float64)
    n = float(trials)
    with np.errstate(invalid="ignore"):
        lo = np.where(k > 0, beta.ppf(alpha / 2, k, n - k + 1), 0.0)
        hi = np.where(k < n, beta.ppf(1 - alpha / 2, k + 1, n - k), 1.0)
    return np.nan_to_num(lo, nan=0.0), np.nan_to_num(hi, nan=1.0)


def _bounds(out_scores: np.ndarray, in_scores: np.ndarray, thresholds: np.ndarray, alpha: float):
    """(TPR lower, FPR upper, TPR, FPR) of the tests 'score > threshold', one per threshold."""
    hits = (in_scores[None, :] > thresholds[:, None]).sum(axis=1)
    false = (out_scores[None, :] > thresholds[:, None]).sum(axis=1)
    tpr_lo, _ = clopper_pearson_bounds(hits, len(in_scores), alpha)
    _, fpr_hi = clopper_pearson_bounds(false, len(out_scores), alpha)
    return tpr_lo, fpr_hi, hits / len(in_scores), false / len(out_scores)


@dataclass(frozen=True)
class Verdict:
    """One audit's outcome on the test halves (``trials`` scores per neighbour there): the rates at
    the chosen threshold, their bounds, the claim's largest TPR at the FPR bound, flagged or not."""

    flagged: bool
    threshold: float
    tpr: float
    fpr: float
    tpr_lower: float
    fpr_upper: float
    allowed_tpr: float
    trials: int


def split(out_scores, in_scores) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(calibration out, calibration in, test out, test in): each neighbour's scores halved in trial order."""
    out_scores = np.asarray(out_scores, dtype=np.float64).reshape(-1)
    in_scores = np.asarray(in_scores, dtype=np.float64).reshape(-1)
    half = min(len(out_scores), len(in_scores)) // 2
    if half < 1:
        raise ValueError("privacy: the audit needs at least 2 releases per neighbouring dataset")
    return out_scores[:half], in_scores[:half], out_scores[half : 2 * half], in_scores[half : 2 * half]


def audit_claim(out_scores, in_scores, region: Region, alpha: float = 0.05) -> Verdict:
    """Does the distinguisher 'score > threshold' refute the claim ``region``? (module docstring)."""
    cal_out, cal_in, test_out, test_in = split(out_scores, in_scores)
    candidates = np.unique(np.quantile(np.concatenate([cal_out, cal_in]), np.linspace(0.0, 1.0, THRESHOLDS)))
    tpr_lo, fpr_hi, _, _ = _bounds(cal_out, cal_in, candidates, alpha)
    best = candidates[int(np.argmax(tpr_lo - region.max_tpr(fpr_hi)))]
    tpr_lo, fpr_hi, tpr, fpr = (float(v[0]) for v in _bounds(test_out, test_in, np.array([best]), alpha))
    allowed = float(region.max_tpr(fpr_hi))
    return Verdict(tpr_lo > allowed, float(best), tpr, fpr, tpr_lo, fpr_hi, allowed, len(test_out))


def scaled(history, factor: float) -> tuple:
    """``history`` with every multiplier times ``factor``."""
    return tuple((q, sigma * factor, count) for q, sigma, count in history)


def family_epsilon(out_scores, in_scores, history, delta: float, alpha: float = 0.05, steps: int = 12) -> float:
    """The accountant's epsilon at ``delta`` of ``history`` with its multipliers scaled to the least
    that the test half's bounds refute (every larger scale is refuted too; bisection on a log scale
    between 1/16 and 16, not below the accountant's smallest sigma; module docstring). The threshold
    is the calibration half's with the largest separation Phi^-1(TPR lower) - Phi^-1(FPR upper) (the
    Gaussian trade-off's mu). 0 when even 16 times the noise is not refuted."""
    from scipy.stats import norm

    delta = _check_delta(delta)
    cal_out, cal_in, test_out, test_in = split(out_scores, in_scores)
    candidates = np.unique(np.quantile(np.concatenate([cal_out, cal_in]), np.linspace(0.0, 1.0, THRESHOLDS)))
    tpr_lo, fpr_hi, _, _ = _bounds(cal_out, cal_in, candidates, alpha)
    with np.errstate(divide="ignore"):
        separation = norm.ppf(np.clip(tpr_lo, 1e-12, 1 - 1e-12)) - norm.ppf(np.clip(fpr_hi, 1e-12, 1 - 1e-12))
    best = candidates[int(np.argmax(separation))]
    tpr_lo, fpr_hi, _, _ = (float(v[0]) for v in _bounds(test_out, test_in, np.array([best]), alpha))

    def refuted(factor: float) -> bool:
        return tpr_lo > float(Region(scaled(history, factor)).max_tpr(fpr_hi))

    smallest = min(sigma for _, sigma, _ in history)
    lo, hi = max(math.log(1 / 16), math.log(SMALLEST_SIGMA / smallest)), math.log(16)
    if not refuted(math.exp(hi)):
        return 0.0
    if refuted(math.exp(lo)):
        return composed_epsilon(scaled(history, math.exp(lo)), delta)
    for _ in range(steps):  # not refuted at lo, refuted at hi
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if not refuted(math.exp(mid)) else (lo, mid)
    return composed_epsilon(scaled(history, math.exp(hi)), delta)


def composed_epsilon(history, delta: float) -> float:
    """The accountant's epsilon at ``delta`` of ``history`` (entries (q, sigma, count))."""
    ledger = Accountant()
    for q, sigma, count in history:
        ledger.spend(q, sigma, count)
    return ledger.epsilon(delta)
