"""The cell table and the --versus comparison as CSV files."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from mpicd.report.runs import MISSING, Cell, distinguishing, fmt, RunSummary
from mpicd.report.stats import versus
from mpicd.report.tables import cell_rows


def write_csv(cells: dict[Cell, list[RunSummary]], path: str | Path) -> None:
    """The cell table, machine-readable: one row per cell; an sd of a single seed, or a key the
    cell's config does not have, is empty."""
    header, rows = cell_rows(cells)
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(header)
        for row in rows:
            out.writerow([_csv_value(v) for v in row])


def _csv_value(v: Any) -> Any:
    """Numbers as they are, other values as the tables print them, absent ones empty."""
    return "" if v is None or v is MISSING else v if isinstance(v, (int, float)) else fmt(v)


def write_versus_csv(
    cells: dict[Cell, list[RunSummary]], reference: str, path: str | Path, metric: str = "minority_acc"
) -> None:
    """The paired comparison, machine-readable: one row per compared cell; the interval and verdict
    are empty where fewer than two seeds pair."""
    pairs = versus(cells, reference, metric)
    keys = [k for k in distinguishing(cells) if not k.startswith("algorithm.")]
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(
            ["method", "versus", *keys, "metric", "pairs", "seeds", "mean_diff", "ci_low", "ci_high", "verdict"]
        )
        for p in pairs:
            lo, hi = p.interval if p.interval else ("", "")
            out.writerow(
                [p.method, p.reference]
                + [_csv_value(p.cell.get(k)) for k in keys]
                + [metric, len(p.diffs), " ".join(map(str, sorted(p.seeds))), "" if p.mean is None else p.mean]
                + [lo, hi, "" if p.interval is None else p.verdict]
            )
