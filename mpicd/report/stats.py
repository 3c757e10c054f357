"""Statistics over seeds: mean ± sd, and the paired comparison of two methods by seed (Student's t)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from mpicd.report.runs import (
    ADDED_LATER,
    DEGENERATE,
    MISSING,
    _label,
    Cell,
    check_metric,
    distinguishing,
    ReportError,
    RunSummary,
)


def mean_sd(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{np.mean(values):.3f} ± {np.std(values, ddof=1):.3f}"


def _sd(values: list[float]) -> float:
    return float(np.std(values, ddof=1)) if len(values) > 1 else 0.0


def _t_central(t: float, df: int) -> float:
    """P(|T| < t) for Student's t with integer df, in closed form (Abramowitz & Stegun 26.7.3-4)."""
    theta = math.atan(t / math.sqrt(df))
    s, c2 = math.sin(theta), math.cos(theta) ** 2
    if df % 2 == 0:  # sin θ (1 + 1/2 cos²θ + 1·3/(2·4) cos⁴θ + ... up to cos^(df-2)θ)
        term = total = 1.0
        for j in range(1, df // 2):
            term *= (2 * j - 1) / (2 * j) * c2
            total += term
        return s * total
    if df == 1:
        return 2 * theta / math.pi
    term = total = math.cos(theta)  # 2/π (θ + sin θ (cos θ + 2/3 cos³θ + ... up to cos^(df-2)θ))
    for j in range(1, (df - 1) // 2):
        term *= (2 * j) / (2 * j + 1) * c2
        total += term
    return 2 / math.pi * (theta + s * total)


def t_quantile(p: float, df: int) -> float:
    """The p-quantile (p > 0.5) of Student's t with df degrees of freedom, by bisection on the exact CDF."""
    if not 0.5 < p < 1 or df < 1:
        raise ValueError(f"t_quantile needs 0.5 < p < 1 and df >= 1, got p={p}, df={df}")
    lo, hi = 0.0, 1.0
    while _t_central(hi, df) < 2 * p - 1:
        hi *= 2
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _t_central(mid, df) < 2 * p - 1 else (lo, mid)
    return (lo + hi) / 2


@dataclass
class Paired:
    method: str  # label of the compared cell
    reference: str  # label of the reference cell, or METHOD if none matched
    cell: Cell
    diffs: list[float]  # method - reference, per shared seed
    interval: tuple[float, float] | None
    seeds: list[int]  # the seeds of ``diffs``, in the same order
    collapsed: bool = False  # one of the two cells is made only of runs where every client predicts one class

    @property
    def mean(self) -> float | None:
        return float(np.mean(self.diffs)) if self.diffs else None

    @property
    def verdict(self) -> str:
        if self.collapsed:
            return DEGENERATE
        if self.interval is None:
            return MISSING
        lo, hi = self.interval
        return "wins" if lo > 0 else "loses" if hi < 0 else "ties"


def versus(cells: dict[Cell, list[RunSummary]], reference: str, metric: str = "minority_acc") -> list[Paired]:
    """Pair every other method's cell with the ``reference`` cell(s) equal but for the algorithm
    section, by seed; mean difference with a 95% t-interval over the paired seeds."""
    refs = [c for c in cells if c.method == reference]
    if not refs:
        methods = ", ".join(sorted({c.method for c in cells}))
        raise ReportError(f"--versus {reference}: no runs of {reference} among the runs reported (methods: {methods})")
    check_metric(metric)
    for run in (r for runs in cells.values() for r in runs):
        if metric in ADDED_LATER and math.isnan(run.scores.get(metric, math.nan)):
            raise ReportError(
                f"--versus-metric {metric}: {run.path} has no {metric} (written by an mpicd older than "
                f"/metrics/{metric}: run it again, or compare another score)"
            )
        if metric not in run.scores:  # a class name this file does not have
            known = ", ".join(run.class_names) if run.class_names else "none: the file has no /metrics/recall"
            raise ReportError(
                f"--versus-metric {metric}: {run.path} has no class {metric.partition(':')[2]!r} (its classes: {known})"
            )
    keys = distinguishing(cells)
    out = []
    for cell, runs in cells.items():
        if cell.method == reference:
            continue
        matches = [r for r in refs if r.drop("algorithm") == cell.drop("algorithm")]
        for ref in matches or [None]:
            by_seed = {r.seed: r.scores[metric] for r in cells[ref]} if ref else {}
            shared = [r for r in runs if r.seed in by_seed]
            diffs = [r.scores[metric] - by_seed[r.seed] for r in shared]
            interval = None
            if len(diffs) > 1:
                half = t_quantile(0.975, len(diffs) - 1) * np.std(diffs, ddof=1) / math.sqrt(len(diffs))
                interval = (float(np.mean(diffs) - half), float(np.mean(diffs) + half))
            label = _label(ref, keys) if ref else reference
            collapsed = all(r.collapsed for r in runs) or bool(ref and all(r.collapsed for r in cells[ref]))
            out.append(Paired(_label(cell, keys), label, cell, diffs, interval, [r.seed for r in shared], collapsed))
    return out
