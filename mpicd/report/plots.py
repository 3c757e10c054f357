"""Plots: minority accuracy against skew and against round (mean ± sd bands), bytes per round."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mpicd.report.export import write_replacing
from mpicd.report.runs import _order, Cell, fmt, RunSummary
from mpicd.report.stats import _sd
from mpicd.report.tables import Setting, settings


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


def _save(fig, plt, path: str | Path, follow: bool) -> None:
    """The figure in the format its path's suffix names (matplotlib's default without one), written
    by :func:`write_replacing`: never through a link at ``path`` unless ``follow``."""
    fig.tight_layout()
    kind = Path(path).suffix[1:] or None
    try:
        write_replacing(path, lambda fh: fig.savefig(fh, format=kind, dpi=120), follow, "the plot file")
    finally:
        plt.close(fig)


def plot(
    cells: dict[Cell, list[RunSummary]], path: str | Path, metric: str = "minority_acc", *, follow: bool = False
) -> None:
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
    _save(fig, plt, path, follow)


def plot_rounds(
    cells: dict[Cell, list[RunSummary]], path: str | Path, metric: str = "minority_acc", *, follow: bool = False
) -> None:
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
    _save(fig, plt, path, follow)


def plot_bytes(cells: dict[Cell, list[RunSummary]], path: str | Path, *, follow: bool = False) -> None:
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
    _save(fig, plt, path, follow)
