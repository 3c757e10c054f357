"""Paper-style tables and plots from results files, with mean ± sd over seeds for every cell.

A *cell* is the whole resolved config a run stored (attr ``config``) minus the keys in
``OPERATIONAL``: two runs share a cell exactly when they differ only in seed (or in how they were
run), so runs with another λ, k, model, optimizer or learning rate are never averaged together.
Tables show the method plus every config key that tells the cells shown apart.

A run's *score* for a test metric is its mean over clients, either averaged over the last N
evaluated rounds (``select="last"``) or taken at the round with the highest validation minority
accuracy (``select="best-val"``; ties -> the earliest round), so the round reported is chosen on
the validation split, never on the test split. Rounds a run did not evaluate (``eval.every`` > 1:
NaN metrics) are never scored. A cell's sd is the sample sd (ddof=1) over seeds.
A run that stopped early (``completed_rounds < rounds``) is excluded unless asked for.

Besides those scores every run has one per class, ``recall:<class name>`` (e.g. ``recall:malignant``,
the names of the file's attr ``class_names``): the mean over clients of that class's test recall
(/metrics/recall), scored by the same rule, for ``--versus-metric``.

``personal_acc`` is the personalised-FL protocol's score (/metrics/personal_acc: each client's test
recalls weighted by its own training label distribution; docs/explanation/two-scoring-protocols.md),
scored by the same rule; a file or ledger line written before it has it NaN (``–`` in the tables,
empty in the CSV; no column where no run has it), and ``--versus-metric personal_acc`` refuses such
a run, naming it.

A runs ledger (``.jsonl``, :mod:`mpicd.report.ledger`) stands in for the results files it was
written from: it holds each finished run's scores in the views last 10 rounds and best-validation
round, so a report of those views needs no .h5 file.
"""

from __future__ import annotations

from mpicd.report.runs import (
    Cell,
    check_metric,
    DEGENERATE,
    distinguishing,
    fmt,
    group,
    HEADLINE,
    MISSING,
    OPERATIONAL,
    PER_CLASS,
    ReportError,
    RunSummary,
    SCORES,
    SELECT_METRIC,
    SPLITS,
    summarize,
)
from mpicd.report.export import write_csv, write_versus_csv
from mpicd.report.plots import plot, plot_bytes, plot_rounds
from mpicd.report.sources import collect
from mpicd.report.stats import mean_sd, Paired, t_quantile, versus
from mpicd.report.tables import cell_rows, cell_table, render, rule, Setting, settings, skew_table, versus_table

__all__ = [
    "Cell",
    "DEGENERATE",
    "HEADLINE",
    "MISSING",
    "OPERATIONAL",
    "PER_CLASS",
    "Paired",
    "ReportError",
    "RunSummary",
    "SCORES",
    "SELECT_METRIC",
    "SPLITS",
    "Setting",
    "cell_rows",
    "cell_table",
    "check_metric",
    "collect",
    "distinguishing",
    "fmt",
    "group",
    "mean_sd",
    "plot",
    "plot_bytes",
    "plot_rounds",
    "render",
    "rule",
    "settings",
    "skew_table",
    "summarize",
    "t_quantile",
    "versus",
    "versus_table",
    "write_csv",
    "write_versus_csv",
]
