"""The runs one report reads: results files (.h5) and runs ledgers (.jsonl), each run once."""

from __future__ import annotations

from pathlib import Path
from collections.abc import Iterable

from mpicd.evaluation import degenerate
from mpicd.report.ledger import summaries
from mpicd.report.runs import _planned, ReportError, RunSummary, summarize
from mpicd.results.reader import Results, ResultsFileError


def _name(run: RunSummary) -> str:
    """The run's name: its results file's stem, also for a ledger's ``<ledger>#<name>``."""
    text = str(run.path)
    return text.rpartition("#")[2] if "#" in text else run.path.stem


def collect(
    paths: Iterable[str | Path],
    last: int = 1,
    select: str = "last",
    include_incomplete: bool = False,
    split: str = "test",
) -> tuple[list[RunSummary], list[str]]:
    """Score every file (a ``.jsonl`` one: every run of that ledger); returns (runs kept, one line
    per incomplete run excluded or included, and per run that predicted one class).

    One run from two sources (a ledger and the results file it was written from, or two ledgers:
    the same name, config and seed) raises ReportError naming both. Runs of one name but another
    config are other runs (sweeps number their outputs alike, e.g. ``0000_seed=0``)."""
    kept, notes, seen = [], [], {}
    for path in paths:
        if str(path).endswith(".jsonl"):
            runs = summaries(path, last, select, split)
        else:
            run = _summary(path, last, select, include_incomplete, split, notes)
            runs = [] if run is None else [run]
        for run in runs:
            key = (_name(run), run.cell, run.seed)
            if key in seen:
                raise ReportError(
                    f"run {key[0]} is both {seen[key]} and {run.path}: report it once "
                    "(a ledger holds the runs it was written from)"
                )
            seen[key] = run.path
            kept.append(run)
            if run.cell.get("privacy.noise") == "seeded":
                notes.append(
                    f"NOT PRIVATE: {run.path}: privacy.noise seeded (its noise is redrawn from the seed by any "
                    "peer): its epsilon holds against no one"
                )
            if run.single_class:
                notes.append(
                    f"warning: {run.path}: "
                    + degenerate.warning(list(run.single_class), run.clients, degenerate.LAST_ROUNDS)
                )
    return kept, notes


def _summary(path, last: int, select: str, include_incomplete: bool, split: str, notes: list) -> RunSummary | None:
    """One results file scored, or None where it is incomplete and excluded (noted)."""
    try:
        res = Results(path)
        planned = _planned(res)
    except ResultsFileError as err:
        raise ReportError(str(err)) from None
    except (KeyError, ValueError, TypeError) as err:  # the attribute rounds is not a number
        raise ReportError(f"{path}: not a readable mpicd results file ({err})") from None
    if res.completed_rounds < planned:
        if not include_incomplete:
            notes.append(f"excluded: {path} ({res.completed_rounds}/{planned} rounds)")
            return None
        notes.append(f"included although incomplete: {path} ({res.completed_rounds}/{planned} rounds)")
    try:
        return summarize(res, last, select, split)
    except ReportError:
        raise
    except (KeyError, ValueError, TypeError, IndexError, AttributeError) as err:  # a foreign layout
        raise ReportError(f"{path}: not a readable mpicd results file ({type(err).__name__}: {err})") from None
