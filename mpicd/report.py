"""Paper-style tables from results files: one cell per (method, dataset, skew, clients, images
per class), mean ± sd over seeds of the final-round metrics, and the bytes each method moved.

A run's score is the mean over clients of the metric, averaged over its last ``last`` completed
rounds; the cell's sd is the sample standard deviation (ddof=1) of those scores over seeds.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import numpy as np

from .results import Results

SCORES = ("minority_acc", "balanced_acc", "test_acc")


@dataclass(frozen=True)
class Cell:
    """What makes runs comparable; runs that differ only in seed share a cell."""

    algorithm: str
    dataset: str
    skew: float
    clients: int
    images_per_class: int


@dataclass
class RunSummary:
    path: Path
    cell: Cell
    seed: int
    rounds: int
    scores: dict            # metric -> the run's score
    bytes_per_round: float  # sent + received, per rank and round, averaged over both


def summarize(path: str | Path, last: int = 1) -> RunSummary:
    res = Results(path)
    if res.completed_rounds == 0:
        raise ValueError(f"{path}: no completed round")
    window = slice(max(0, res.completed_rounds - last), res.completed_rounds)
    attrs = res.attrs
    cell = Cell(str(attrs["algorithm"]), str(attrs["dataset"]), float(attrs["skew"]), int(attrs["clients"]),
                int(attrs["images_per_class"]))
    scores = {m: float(np.mean(res.metrics[m][window])) for m in SCORES}
    moved = (res.metrics["bytes_sent"] + res.metrics["bytes_recv"]) / 2
    return RunSummary(Path(path), cell, int(attrs["seed"]), res.completed_rounds, scores, float(moved.mean()))


def mean_sd(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{np.mean(values):.3f} ± {np.std(values, ddof=1):.3f}"


def group(summaries: Iterable[RunSummary]) -> dict[Cell, list[RunSummary]]:
    cells: dict[Cell, list[RunSummary]] = defaultdict(list)
    for s in summaries:
        cells[s.cell].append(s)
    for cell, runs in cells.items():
        seeds = [r.seed for r in runs]
        if len(set(seeds)) != len(seeds):
            dupes = sorted({str(r.path) for r in runs if seeds.count(r.seed) > 1})
            raise ValueError(f"the same seed appears twice in one cell ({cell}): {', '.join(dupes)}")
    return dict(sorted(cells.items(), key=lambda kv: (kv[0].dataset, kv[0].clients, kv[0].images_per_class,
                                                      kv[0].skew, kv[0].algorithm)))


def cell_table(cells: dict[Cell, list[RunSummary]]) -> str:
    """Every cell on one line (markdown)."""
    header = ["dataset", "clients", "images/class", "skew", "method", "seeds", *SCORES, "bytes/round/rank"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for cell, runs in cells.items():
        row = [cell.dataset, str(cell.clients), str(cell.images_per_class), f"{cell.skew:g}", cell.algorithm,
               str(len(runs)), *(mean_sd([r.scores[m] for r in runs]) for m in SCORES),
               f"{np.mean([r.bytes_per_round for r in runs]):,.0f}"]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def skew_table(cells: dict[Cell, list[RunSummary]], metric: str = "minority_acc") -> str:
    """The paper's view: methods down, skew across, mean ± sd over seeds; one block per setting."""
    blocks = []
    settings = sorted({(c.dataset, c.clients, c.images_per_class) for c in cells})
    for dataset, clients, ipc in settings:
        here = {c: runs for c, runs in cells.items() if (c.dataset, c.clients, c.images_per_class) == (dataset, clients, ipc)}
        skews = sorted({c.skew for c in here})
        methods = sorted({c.algorithm for c in here})
        lines = [f"{metric} on {dataset}, {clients} clients, {ipc} images/class (mean ± sd over seeds)", "",
                 "| method | " + " | ".join(f"s={s:g}" for s in skews) + " | sd across skews |",
                 "|" + "---|" * (len(skews) + 2)]
        for method in methods:
            means, row = [], []
            for s in skews:
                runs = here.get(Cell(method, dataset, s, clients, ipc), [])
                row.append(mean_sd([r.scores[metric] for r in runs]) if runs else "–")
                if runs:
                    means.append(float(np.mean([r.scores[metric] for r in runs])))
            spread = f"{np.std(means, ddof=1):.3f}" if len(means) > 1 else "–"
            lines.append(f"| {method} | " + " | ".join(row) + f" | {spread} |")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def plot(cells: dict[Cell, list[RunSummary]], path: str | Path, metric: str = "minority_acc") -> None:
    """Metric against skew, one line per method with ±sd error bars, one panel per setting."""
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("mpicd report --plot needs matplotlib: pip install 'mpicd[report]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    settings = sorted({(c.dataset, c.clients, c.images_per_class) for c in cells})
    fig, axes = plt.subplots(1, len(settings), figsize=(5 * len(settings), 4), squeeze=False)
    for ax, (dataset, clients, ipc) in zip(axes[0], settings):
        for method in sorted({c.algorithm for c in cells}):
            points = sorted((c.skew, [r.scores[metric] for r in runs]) for c, runs in cells.items()
                            if (c.algorithm, c.dataset, c.clients, c.images_per_class) == (method, dataset, clients, ipc))
            if points:
                ax.errorbar([p[0] for p in points], [np.mean(p[1]) for p in points],
                            yerr=[np.std(p[1], ddof=1) if len(p[1]) > 1 else 0 for p in points],
                            marker="o", capsize=3, label=method)
        ax.set(title=f"{dataset}, {clients} clients, {ipc}/class", xlabel="skew", ylabel=metric)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def render(cells: dict[Cell, list[RunSummary]], last: int) -> str:
    rounds = sorted({r.rounds for runs in cells.values() for r in runs})
    note = (f"{sum(len(v) for v in cells.values())} runs; score = mean over clients of the last "
            f"{last} completed round(s); rounds per run: {', '.join(map(str, rounds))}")
    return "\n".join([note, "", skew_table(cells), "", cell_table(cells)])
