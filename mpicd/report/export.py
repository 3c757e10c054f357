"""The cell table and the --versus comparison as CSV files, and how every file ``mpicd report`` writes
lands at its path (:func:`write_replacing`)."""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from mpicd.core import exclusive
from mpicd.core.paths import refuse_link
from mpicd.report.runs import MISSING, Cell, distinguishing, fmt, RunSummary
from mpicd.report.stats import versus
from mpicd.report.tables import cell_rows


def write_replacing(
    path: str | Path, write: Callable[[BinaryIO], None], follow: bool = False, what: str = "the output file"
) -> None:
    """``write(fh)`` into a new file beside ``path`` (``O_EXCL | O_NOFOLLOW``, mode 0666 before the
    umask), then renamed onto it: a link at ``path`` is refused, and one planted after that check is
    replaced, never written through. ``follow`` (--follow-symlinks): the link's target gets the file."""
    if follow:
        path = os.path.realpath(path)
    else:
        refuse_link(path, what)
    path = Path(path)
    temporary, fh = exclusive.create(path.parent, f".{path.name}.", ".tmp")
    try:
        with fh:
            write(fh)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)  # a failed write (a full disk) leaves the path as it was


def _write_rows(path: str | Path, rows: list[list[Any]], follow: bool) -> None:
    """``rows`` as CSV (UTF-8, the csv module's line endings), written by :func:`write_replacing`."""

    def write(fh: BinaryIO) -> None:
        with io.TextIOWrapper(fh, encoding="utf-8", newline="") as text:
            csv.writer(text).writerows(rows)

    write_replacing(path, write, follow, "the CSV file")


def write_csv(cells: dict[Cell, list[RunSummary]], path: str | Path, *, follow: bool = False) -> None:
    """The cell table, machine-readable: one row per cell; an sd of a single seed, or a key the
    cell's config does not have, is empty."""
    header, rows = cell_rows(cells)
    _write_rows(path, [header] + [[_csv_value(v) for v in row] for row in rows], follow)


def _csv_value(v: Any) -> Any:
    """Numbers as they are, other values as the tables print them, absent ones empty."""
    return "" if v is None or v is MISSING else v if isinstance(v, (int, float)) else fmt(v)


def write_versus_csv(
    cells: dict[Cell, list[RunSummary]],
    reference: str,
    path: str | Path,
    metric: str = "minority_acc",
    *,
    follow: bool = False,
) -> None:
    """The paired comparison, machine-readable: one row per compared cell; the interval and verdict
    are empty where fewer than two seeds pair."""
    pairs = versus(cells, reference, metric)
    keys = [k for k in distinguishing(cells) if not k.startswith("algorithm.")]
    rows = [["method", "versus", *keys, "metric", "pairs", "seeds", "mean_diff", "ci_low", "ci_high", "verdict"]]
    for p in pairs:
        lo, hi = p.interval if p.interval else ("", "")
        rows.append(
            [p.method, p.reference]
            + [_csv_value(p.cell.get(k)) for k in keys]
            + [metric, len(p.diffs), " ".join(map(str, sorted(p.seeds))), "" if p.mean is None else p.mean]
            + [lo, hi, "" if p.interval is None else p.verdict]
        )
    _write_rows(path, rows, follow)
