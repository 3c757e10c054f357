"""The report's text: the paper's skew table, the cell table, the --versus table, and the whole page."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from collections.abc import Iterable

import numpy as np

from mpicd.report.runs import (
    ADDED_LATER,
    HEADLINE,
    MISSING,
    SCORES,
    _label,
    _order,
    Cell,
    distinguishing,
    fmt,
    RunSummary,
)
from mpicd.report.stats import _sd, mean_sd, versus


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


def shown_scores(cells: dict[Cell, list[RunSummary]]) -> tuple[str, ...]:
    """The scores the cell table and CSV show: every score of SCORES but one added later
    (``personal_acc``) that no run reported has, so that tables of older runs stay as they were."""
    runs = [r for group in cells.values() for r in group]
    return tuple(m for m in SCORES if m not in ADDED_LATER or any(not np.isnan(r.scores.get(m, np.nan)) for r in runs))


def cell_rows(cells: dict[Cell, list[RunSummary]]) -> tuple[list[str], list[list[Any]]]:
    """Every cell as one row of raw values: method, dataset and images per class as the runs
    resolved them, clients, skew, the other distinguishing keys, seeds, mean and sd of each score
    shown (:func:`shown_scores`; None where a run lacks it: a file older than personal_acc), bytes
    per round per rank."""
    scores = shown_scores(cells)
    keys = ["clients", "data.skew", *(k for k in distinguishing(cells) if k not in ("clients", "data.skew"))]
    header = [
        "method",
        "dataset",
        "images_per_class",
        *keys,
        "seeds",
        "seed_values",
        *(f"{m}_{s}" for m in scores for s in ("mean", "sd")),
        "bytes_per_round_rank",
    ]
    rows = []
    for cell, runs in cells.items():
        stats = []
        for m in scores:
            values = [r.scores[m] for r in runs]
            if np.isnan(values).any():  # a run older than the score (personal_acc): no mean for the cell
                stats += [None, None]
                continue
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
    scores = shown_scores(cells)
    header = ["method", *keys, "seeds", *scores, "bytes/round/rank"]
    header = [*header[:-1], "bytes/round/client", "MPI bytes/round/rank"] if packed else header
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for cell, runs in cells.items():
        row = [
            cell.method,
            *(fmt(cell.get(k)) for k in keys),
            str(len(runs)),
            *(_shown([r.scores[m] for r in runs]) for m in scores),
            f"{np.mean([r.bytes_per_round for r in runs]):,.0f}",
            *([f"{np.mean([r.mpi_bytes_per_round for r in runs]):,.0f}"] if packed else []),
        ]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def _shown(values: list[float]) -> str:
    """mean ± sd over seeds, or MISSING where a run lacks the score (a file older than personal_acc)."""
    return MISSING if np.isnan(values).any() else mean_sd(values)


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
