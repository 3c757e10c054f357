"""A run's scores and the cells runs are grouped into (the rules in :mod:`mpicd.report`)."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from collections.abc import Iterable

import numpy as np

from mpicd.config.sections import OPERATIONAL_KEYS, with_added_keys
from mpicd.evaluation import degenerate
from mpicd.results.reader import open_file, Results


SCORES = ("minority_acc", "balanced_acc", "test_acc", "personal_acc")

ADDED_LATER = ("personal_acc",)
"""Scores a file (or ledger line) written before them lacks: NaN there, never an error, except where
a comparison is asked of them (``--versus-metric``)."""

DEGENERATE = "degenerate (every client predicts one class: no verdict)"

# --split train: the same scores read from each client's own training images (eval.train_split),
# the paper's suspected scoring; an audit of memorisation, never a held-out score
SPLITS = {
    "test": {m: m for m in SCORES},
    "train": {
        "minority_acc": "train_minority_acc",
        "balanced_acc": "train_balanced_acc",
        "test_acc": "train_acc",
        "personal_acc": "train_personal_acc",
    },
}

SELECT_METRIC = "val_minority_acc"

PER_CLASS = {"test": "recall", "train": "train_recall"}  # recall:<class name> reads these (round, client, class)

OPERATIONAL = ("seed", *OPERATIONAL_KEYS)
"""Config keys, or whole sections, left out of a cell: the seed (what the sd is taken over) and
the keys that say how a run was executed, not what it computes (``config.OPERATIONAL_KEYS``:
output, device, checkpoint, debug, timeout, eval, train.eval_batch_size)."""

HEADLINE = ("data.name", "clients", "data.images_per_class", "data.skew")

MISSING = "–"


class ReportError(ValueError):
    """Runs that cannot be reported as asked; the message names the file(s)."""


def _operational(key: str) -> bool:
    return any(key == k or key.startswith(k + ".") for k in OPERATIONAL)


def _flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
    """Nested mapping -> {dotted.key: hashable value}."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, dotted + "."))
        else:
            flat[dotted] = tuple(value) if isinstance(value, list) else value
    return flat


def _order(value: Any) -> tuple:
    """Sort numbers numerically, then strings, with missing values last."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (0, value, "")
    return (1, 0, str(value)) if value is not MISSING else (2, 0, "")


def fmt(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, tuple):
        return ",".join(map(fmt, value))
    return str(value)


@dataclass(frozen=True)
class Cell:
    """What makes runs comparable: the sorted (dotted key, value) pairs of the config, minus OPERATIONAL."""

    items: tuple[tuple[str, Any], ...]

    @classmethod
    def of(cls, config: dict) -> "Cell":
        flat = with_added_keys(_flatten(config))  # a file older than a key counts as its older behaviour
        return cls(tuple(sorted((k, v) for k, v in flat.items() if not _operational(k))))

    def get(self, key: str) -> Any:
        return dict(self.items).get(key, MISSING)

    @property
    def method(self) -> str:
        return str(self.get("algorithm.name"))

    def drop(self, *prefixes: str) -> "Cell":
        """The cell without the given keys or sections (e.g. "algorithm", "data.skew")."""
        return Cell(tuple((k, v) for k, v in self.items if not any(k == p or k.startswith(p + ".") for p in prefixes)))

    def sort_key(self) -> tuple:
        return (*(_order(self.get(k)) for k in HEADLINE), self.method, tuple((k, _order(v)) for k, v in self.items))


@dataclass
class RunSummary:
    path: Path
    cell: Cell
    seed: int
    rounds: int  # completed rounds
    planned_rounds: int
    scores: dict  # metric -> the run's score
    bytes_per_round: float  # sent + received over 2, per rank and round
    curves: dict  # metric -> (completed rounds,) mean over clients
    headline: dict  # dataset, clients, images_per_class as the run resolved them
    selected_round: int | None = None  # 0-based, with select="best-val"
    single_class: tuple[
        int, ...
    ] = ()  # clients that predicted one class for the whole split (mpicd.evaluation.degenerate)
    clients: int = 0
    class_names: tuple[str, ...] = ()  # the file's classes, in label order: scores["recall:<name>"]
    ranks: int = 0  # MPI ranks of the (last) job (attr ranks; 0: an older file, one client per rank)
    mpi_bytes_per_round: float = math.nan  # what crossed MPI, sent + received over 2, per rank and round

    @property
    def collapsed(self) -> bool:
        """Every client predicted a single class: the run's scores carry no comparison."""
        return bool(self.clients) and len(self.single_class) == self.clients


def _planned(res: Results) -> int:
    config = res.config if isinstance(res.config, dict) else {}
    return int(res.attrs["rounds"]) if "rounds" in res.attrs else int(config.get("rounds", res.completed_rounds))


def check_metric(metric: str) -> None:
    """A score's name: one of SCORES (``personal_acc`` among them) or ``recall:<class name>``; which
    classes exist, and whether a file is older than ``personal_acc``, is only known per file
    (:func:`versus` names them)."""
    kind, colon, name = metric.partition(":")
    if metric in SCORES or (colon and kind == "recall" and name):
        return
    raise ReportError(
        f"--versus-metric {metric}: not a score; one of {', '.join(SCORES)}, or recall:CLASS for one class's "
        "recall by name (e.g. recall:malignant)"
    )


def summarize(source: str | Path | Results, last: int = 1, select: str = "last", split: str = "test") -> RunSummary:
    """Read one results file (or take it read) and score it (see the module docstring); ``split``
    "train" scores the training-split audit metrics under the same names."""
    res = source if isinstance(source, Results) else Results(source)
    path = res.path
    names = SPLITS[split]
    if not isinstance(res.config, dict) or "algorithm" not in res.config:
        raise ReportError(f"{path}: the attr config holds no resolved config (no algorithm section)")
    if res.completed_rounds == 0:
        raise ReportError(f"{path}: no completed round")
    absent = [
        f"/metrics/{names.get(m, m)}"
        for m in (*SCORES, "bytes_sent", "bytes_recv")
        if names.get(m, m) not in res.metrics and m not in ADDED_LATER
    ]
    if absent:
        raise ReportError(f"{path}: no {', '.join(absent)}")
    nothing = np.full(res.completed_rounds, np.nan)  # a score the file is older than
    curves = {m: res.metrics[names[m]].mean(axis=1) if names[m] in res.metrics else nothing for m in SCORES}
    # evaluated rounds: every client has test metrics (eval.every leaves the others NaN)
    evaluated = np.flatnonzero(~np.isnan(res.metrics[names["minority_acc"]]).any(axis=1))
    if len(evaluated) == 0 and split == "train":
        raise ReportError(
            f"{path}: no training-split scores (--split train needs runs made with eval.train_split=true)"
        )
    if len(evaluated) == 0:
        raise ReportError(f"{path}: no evaluated round among the {res.completed_rounds} completed")
    selected = None
    if select == "last":
        window = evaluated[-last:]
    elif select == "best-val":
        if SELECT_METRIC not in res.metrics:
            raise ReportError(
                f"{path}: no /metrics/{SELECT_METRIC}, which --select best-val needs "
                "(a file written before validation metrics existed?)"
            )
        val = res.metrics[SELECT_METRIC].mean(axis=1)[evaluated]
        if np.isnan(val).any():
            raise ReportError(f"{path}: /metrics/{SELECT_METRIC} has missing values in evaluated rounds")
        selected = int(evaluated[np.argmax(val)])  # the first maximum: ties -> the earliest round
        window = np.array([selected])
    else:
        raise ValueError(f"unknown selection rule {select!r}")
    attrs, data = res.attrs, res.config.get("data", {})
    moved = (res.metrics["bytes_sent"] + res.metrics["bytes_recv"]) / 2
    recall = res.metrics.get(PER_CLASS[split])
    single = (
        tuple(degenerate.single_class_clients(recall, evaluated[evaluated <= window[-1]])) if recall is not None else ()
    )
    names = res.class_names if recall is not None and recall.ndim == 3 else ()  # attr class_names, else "0", "1"...
    per_class = {f"recall:{n}": float(recall[window, :, c].mean(axis=1).mean()) for c, n in enumerate(names)}
    headline = {
        "dataset": str(attrs.get("dataset", data.get("name"))),
        "clients": int(attrs.get("clients", res.config.get("clients"))),
        "images_per_class": attrs.get("images_per_class", data.get("images_per_class")),
    }
    if data.get("partition", "expertise") != "expertise":  # natural, dirichlet: sized per client, not per class
        counts = res.partition.get("train_counts")
        alpha = f" (alpha {fmt(data.get('dirichlet_alpha'))})" if data["partition"] == "dirichlet" else ""
        per_client = int(counts.sum(axis=1).max()) if counts is not None and counts.size else MISSING
        headline["images_per_class"] = None
        headline["sizes"] = f"{data['partition']} partition{alpha}, {per_client} images/client"
    return RunSummary(
        Path(path),
        Cell.of(res.config),
        int(attrs.get("seed", res.config.get("seed"))),
        res.completed_rounds,
        _planned(res),
        {**{m: float(curves[m][window].mean()) for m in SCORES}, **per_class},
        float(moved.mean()),
        curves,
        headline,
        selected,
        single,
        int(res.metrics["minority_acc"].shape[1]),
        names,
        *_mpi_bytes(res),
    )


def _mpi_bytes(res) -> tuple[int, float]:
    """(ranks, bytes per round per rank that crossed MPI) of a file with clients per rank
    (``/comm/bytes_mpi_*``, mpicd.mpi.assignment); with one client per rank, per client is per rank."""
    ranks = int(res.attrs.get("ranks", 0) or 0)
    with open_file(res.path) as f:  # /comm/bytes_mpi_*: not among what Results loads
        if not ranks or "comm/bytes_mpi_sent" not in f:
            return ranks, math.nan
        done = res.completed_rounds
        moved = f["comm/bytes_mpi_sent"][:done].sum() + f["comm/bytes_mpi_recv"][:done].sum()
    return ranks, float(moved / 2 / ranks / max(done, 1))


def group(summaries: Iterable[RunSummary]) -> dict[Cell, list[RunSummary]]:
    """Runs by cell, cells sorted by dataset, clients, images per class, skew, method."""
    cells: dict[Cell, list[RunSummary]] = defaultdict(list)
    for s in summaries:
        for other in cells[s.cell]:
            if other.seed == s.seed:
                raise ReportError(
                    f"{other.path} and {s.path} are the same cell with the same seed "
                    f"{s.seed} (the same run twice?): report only one of them"
                )
        cells[s.cell].append(s)
    return {c: sorted(runs, key=lambda r: r.seed) for c, runs in sorted(cells.items(), key=lambda kv: kv[0].sort_key())}


def distinguishing(cells: Iterable[Cell], skip: tuple[str, ...] = ("algorithm.name",)) -> list[str]:
    """The config keys whose value differs between the given cells.

    An ``algorithm.*`` key counts only if it differs between cells of the same method: that
    FedAvg has no λ while co-distillation has one is already said by the method column.
    """
    cells = list(cells)
    keys = sorted({k for c in cells for k, _ in c.items} - set(skip))
    shown = []
    for key in keys:
        if key.startswith("algorithm."):
            by_method = defaultdict(set)
            for c in cells:
                by_method[c.method].add(c.get(key))
            differs = any(len(values) > 1 for values in by_method.values())
        else:
            differs = len({c.get(key) for c in cells}) > 1
        if differs:
            shown.append(key)
    return shown


def _label(cell: Cell, keys: list[str]) -> str:
    """The method, with the algorithm keys that set it apart, e.g. ``codistill (lambda=0.5)``."""
    own = [
        f"{k.removeprefix('algorithm.')}={fmt(cell.get(k))}"
        for k in keys
        if k.startswith("algorithm.") and cell.get(k) is not MISSING
    ]
    return cell.method + (f" ({', '.join(own)})" if own else "")
