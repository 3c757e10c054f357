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
"""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from collections.abc import Iterable

import numpy as np

from . import degenerate
from .config import OPERATIONAL_KEYS, with_added_keys
from .results import Results, ResultsFileError

SCORES = ("minority_acc", "balanced_acc", "test_acc")
DEGENERATE = "degenerate (every client predicts one class: no verdict)"
# --split train: the same scores read from each client's own training images (eval.train_split),
# the paper's suspected scoring; an audit of memorisation, never a held-out score
SPLITS = {
    "test": {m: m for m in SCORES},
    "train": {"minority_acc": "train_minority_acc", "balanced_acc": "train_balanced_acc", "test_acc": "train_acc"},
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
    single_class: tuple[int, ...] = ()  # clients that predicted one class for the whole split (mpicd.degenerate)
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
    """A score's name: one of SCORES or ``recall:<class name>``; which classes exist is only known
    per file (:func:`versus` names them)."""
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
        if names.get(m, m) not in res.metrics
    ]
    if absent:
        raise ReportError(f"{path}: no {', '.join(absent)}")
    curves = {m: res.metrics[names[m]].mean(axis=1) for m in SCORES}
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
    (``/comm/bytes_mpi_*``, mpicd.layout); with one client per rank, per client is per rank."""
    import h5py

    ranks = int(res.attrs.get("ranks", 0) or 0)
    with h5py.File(res.path, "r") as f:
        if not ranks or "comm/bytes_mpi_sent" not in f:
            return ranks, math.nan
        done = res.completed_rounds
        moved = f["comm/bytes_mpi_sent"][:done].sum() + f["comm/bytes_mpi_recv"][:done].sum()
    return ranks, float(moved / 2 / ranks / max(done, 1))


def collect(
    paths: Iterable[str | Path],
    last: int = 1,
    select: str = "last",
    include_incomplete: bool = False,
    split: str = "test",
) -> tuple[list[RunSummary], list[str]]:
    """Score every file; returns (runs kept, one line per incomplete run excluded or included)."""
    kept, notes = [], []
    for path in paths:
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
                continue
            notes.append(f"included although incomplete: {path} ({res.completed_rounds}/{planned} rounds)")
        try:
            kept.append(summarize(res, last, select, split))
            if kept[-1].single_class:
                notes.append(
                    f"warning: {path}: "
                    + degenerate.warning(list(kept[-1].single_class), kept[-1].clients, degenerate.LAST_ROUNDS)
                )
        except ReportError:
            raise
        except (KeyError, ValueError, TypeError, IndexError, AttributeError) as err:  # a foreign layout
            raise ReportError(f"{path}: not a readable mpicd results file ({type(err).__name__}: {err})") from None
    return kept, notes


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


def mean_sd(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{np.mean(values):.3f} ± {np.std(values, ddof=1):.3f}"


def _sd(values: list[float]) -> float:
    return float(np.std(values, ddof=1)) if len(values) > 1 else 0.0


@dataclass
class Setting:
    """One block of the paper's view: cells equal but for method and skew."""

    name: str  # e.g. "toy, 2 clients, 50 images/class"
    extra: str  # the other keys that set this block apart, e.g. "model.name=lenet"
    rows: dict = field(default_factory=dict)  # method label -> {skew: runs}

    def title(self, metric: str) -> str:
        return f"{metric} on {self.name}" + (f", {self.extra}" if self.extra else "")


def settings(cells: dict[Cell, list[RunSummary]]) -> list[Setting]:
    setting_keys = distinguishing([c.drop("algorithm", "data.skew") for c in cells])
    blocks: dict[Cell, Setting] = {}
    for cell, runs in cells.items():
        where = cell.drop("algorithm", "data.skew")
        if where not in blocks:
            h = runs[0].headline
            extra = ", ".join(f"{k}={fmt(where.get(k))}" for k in setting_keys if k not in HEADLINE)
            blocks[where] = Setting(
                f"{h['dataset']}, {h['clients']} clients, " + h.get("sizes", f"{h['images_per_class']} images/class"),
                extra,
            )
    method_keys = distinguishing(cells)  # the same labels in every block, e.g. codistill (lambda=0.5)
    for where, block in blocks.items():
        here = [c for c in cells if c.drop("algorithm", "data.skew") == where]
        for c in sorted(here, key=lambda c: (c.method, c.sort_key())):
            block.rows.setdefault(_label(c, method_keys), {})[c.get("data.skew")] = cells[c]
    return list(blocks.values())


def skew_table(cells: dict[Cell, list[RunSummary]], metric: str = "minority_acc") -> str:
    """The paper's view: methods down, skew across, mean ± sd over seeds, sd across skews; one block per setting."""
    out = []
    for block in settings(cells):
        skews = sorted({s for row in block.rows.values() for s in row}, key=_order)
        lines = [
            f"{block.title(metric)} (mean ± sd over seeds)",
            "",
            "| method | " + " | ".join(f"s={fmt(s)}" for s in skews) + " | sd across skews |",
            "|" + "---|" * (len(skews) + 2),
        ]
        for label, row in block.rows.items():
            means = [float(np.mean([r.scores[metric] for r in row[s]])) for s in skews if s in row]
            cols = [mean_sd([r.scores[metric] for r in row[s]]) if s in row else MISSING for s in skews]
            spread = f"{np.std(means, ddof=1):.3f}" if len(means) > 1 else MISSING
            lines.append(f"| {label} | " + " | ".join(cols) + f" | {spread} |")
        out.append("\n".join(lines))
    return "\n\n".join(out)


def cell_rows(cells: dict[Cell, list[RunSummary]]) -> tuple[list[str], list[list[Any]]]:
    """Every cell as one row of raw values: method, dataset and images per class as the runs
    resolved them, clients, skew, the other distinguishing keys, seeds, mean and sd of each score,
    bytes per round per rank."""
    keys = ["clients", "data.skew", *(k for k in distinguishing(cells) if k not in ("clients", "data.skew"))]
    header = [
        "method",
        "dataset",
        "images_per_class",
        *keys,
        "seeds",
        "seed_values",
        *(f"{m}_{s}" for m in SCORES for s in ("mean", "sd")),
        "bytes_per_round_rank",
    ]
    rows = []
    for cell, runs in cells.items():
        stats = []
        for m in SCORES:
            values = [r.scores[m] for r in runs]
            stats += [float(np.mean(values)), _sd(values) if len(values) > 1 else None]
        rows.append(
            [
                cell.method,
                runs[0].headline["dataset"],
                runs[0].headline["images_per_class"],
                *(cell.get(k) for k in keys),
                len(runs),
                " ".join(str(r.seed) for r in runs),
                *stats,
                float(np.mean([r.bytes_per_round for r in runs])),
            ]
        )
    return header, rows


def cell_table(cells: dict[Cell, list[RunSummary]]) -> str:
    """Every cell on one line (markdown)."""
    keys = distinguishing(cells)
    # with several clients on a rank the second byte figure: what crossed MPI per rank
    packed = any(0 < r.ranks < r.clients for runs in cells.values() for r in runs)
    header = ["method", *keys, "seeds", *SCORES, "bytes/round/rank"]
    header = [*header[:-1], "bytes/round/client", "MPI bytes/round/rank"] if packed else header
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for cell, runs in cells.items():
        row = [
            cell.method,
            *(fmt(cell.get(k)) for k in keys),
            str(len(runs)),
            *(mean_sd([r.scores[m] for r in runs]) for m in SCORES),
            f"{np.mean([r.bytes_per_round for r in runs]):,.0f}",
            *([f"{np.mean([r.mpi_bytes_per_round for r in runs]):,.0f}"] if packed else []),
        ]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


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


# --------------------------------------------------------------------------- paired comparison


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


def versus_table(cells: dict[Cell, list[RunSummary]], reference: str, metric: str = "minority_acc") -> str:
    pairs = versus(cells, reference, metric)
    keys = [k for k in distinguishing(cells) if not k.startswith("algorithm.")]
    lines = [
        f"{metric}: each method minus {reference} on the same seeds (mean difference, 95% t-interval "
        f"over the paired seeds; wins / ties / loses: interval above / containing / below 0)",
        "",
        "| method | versus | " + "".join(f"{k} | " for k in keys) + f"pairs | Δ {metric} | 95% interval | verdict |",
        "|" + "---|" * (len(keys) + 6),
    ]
    for p in pairs:
        ci = f"[{p.interval[0]:+.3f}, {p.interval[1]:+.3f}]" if p.interval else MISSING
        mean = f"{p.mean:+.3f}" if p.mean is not None else MISSING
        lines.append(
            f"| {p.method} | {p.reference} | "
            + "".join(f"{fmt(p.cell.get(k))} | " for k in keys)
            + f"{len(p.diffs)} | {mean} | {ci} | {p.verdict} |"
        )
    return "\n".join(lines)


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


# --------------------------------------------------------------------------- plots


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("mpicd report's plots need matplotlib: pip install 'mpicd[report]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _panels(plt, blocks: list[Setting], ylabel: str):
    """One panel per setting, titled by it."""
    fig, axes = plt.subplots(1, len(blocks), figsize=(5.5 * len(blocks), 4.4), squeeze=False)
    for ax, block in zip(axes[0], blocks):
        ax.set_title(block.name + (f"\n{block.extra}" if block.extra else ""), fontsize="medium")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    return fig, axes[0]


def _band(ax, x, mean: np.ndarray, sd: np.ndarray, label: str) -> None:
    """A mean line with a shaded ±sd band in the line's colour."""
    (line,) = ax.plot(x, mean, marker="o" if len(x) < 20 else None, label=label)
    ax.fill_between(x, mean - sd, mean + sd, color=line.get_color(), alpha=0.2)


def _save(fig, plt, path: str | Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot(cells: dict[Cell, list[RunSummary]], path: str | Path, metric: str = "minority_acc") -> None:
    """Metric against skew, one line per method with a ±sd band over seeds, one panel per setting."""
    plt = _pyplot()
    blocks = settings(cells)
    fig, axes = _panels(plt, blocks, metric)
    for ax, block in zip(axes, blocks):
        for label, row in block.rows.items():
            skews = sorted(row, key=_order)
            mean = np.array([np.mean([r.scores[metric] for r in row[s]]) for s in skews])
            sd = np.array([_sd([r.scores[metric] for r in row[s]]) for s in skews])
            _band(ax, skews, mean, sd, label)
        ax.set_xlabel("skew")
        ax.legend(fontsize="small")
    _save(fig, plt, path)


def plot_rounds(cells: dict[Cell, list[RunSummary]], path: str | Path, metric: str = "minority_acc") -> None:
    """Metric against round, one line per method and skew (mean over seeds, ±sd band), one panel per setting."""
    plt = _pyplot()
    blocks = settings(cells)
    fig, axes = _panels(plt, blocks, metric)
    for ax, block in zip(axes, blocks):
        for label, row in block.rows.items():
            for s in sorted(row, key=_order):
                curves = [r.curves[metric] for r in row[s]]
                table = np.full((len(curves), max(map(len, curves))), np.nan)
                for i, c in enumerate(curves):
                    table[i, : len(c)] = c
                evaluated = ~np.isnan(table).all(axis=0)  # eval.every > 1: the other rounds are gaps
                x = np.arange(1, table.shape[1] + 1)[evaluated]
                table = table[:, evaluated]
                mean = np.nanmean(table, axis=0)
                sd = np.array([_sd(list(col[~np.isnan(col)])) for col in table.T])
                _band(ax, x, mean, sd, f"{label}, s={fmt(s)}")
        ax.set_xlabel("round")
        ax.legend(fontsize="small")
    _save(fig, plt, path)


def plot_bytes(cells: dict[Cell, list[RunSummary]], path: str | Path) -> None:
    """Bytes per round per rank (sent + received over 2) of each method, log scale, one panel per setting."""
    plt = _pyplot()
    blocks = settings(cells)
    fig, axes = _panels(plt, blocks, "bytes per round per rank")
    for ax, block in zip(axes, blocks):
        labels = list(block.rows)
        values = [float(np.mean([r.bytes_per_round for runs in block.rows[m].values() for r in runs])) for m in labels]
        positive = [v if v > 0 else np.nan for v in values]  # a log axis cannot show 0: say it instead
        bars = ax.bar(range(len(labels)), positive, color=[f"C{i}" for i in range(len(labels))])
        ax.bar_label(bars, [f"{v:,.0f}" for v in values], fontsize="small")
        for i, v in enumerate(values):
            if v == 0:
                ax.annotate("0", (i, 0), xycoords=("data", "axes fraction"), ha="center", va="bottom", fontsize="small")
        if any(v > 0 for v in values):
            ax.set_yscale("log")
        ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right")
        ax.set_xlim(-0.6, len(labels) - 0.4)
    _save(fig, plt, path)


# --------------------------------------------------------------------------- text


def rule(select: str, last: int) -> str:
    if select == "best-val":
        return (
            "score = mean over clients of each test metric at the round with the highest validation "
            "minority accuracy (mean over clients; ties -> the earliest round)"
        )
    return f"score = mean over clients of each test metric, averaged over the last {last} evaluated round(s)"


def render(
    cells: dict[Cell, list[RunSummary]],
    last: int = 1,
    select: str = "last",
    notes: Iterable[str] = (),
    versus_method: str | None = None,
    versus_metric: str = "minority_acc",
    versus_only: bool = False,
) -> str:
    runs = [r for v in cells.values() for r in v]
    rounds = sorted({r.rounds for r in runs})
    head = [
        f"{len(runs)} runs in {len(cells)} cells; {rule(select, last)}; rounds per run: {', '.join(map(str, rounds))}"
    ]
    chosen = [r.selected_round + 1 for r in runs if r.selected_round is not None]
    if chosen:
        head.append(f"rounds chosen on validation: {min(chosen)}..{max(chosen)} (median {np.median(chosen):g})")
    parts = ["\n".join([*head, *notes])]
    if not (versus_method and versus_only):
        parts += [skew_table(cells), cell_table(cells)]
    if versus_method:
        parts.append(versus_table(cells, versus_method, versus_metric))
    return "\n\n".join(parts)
