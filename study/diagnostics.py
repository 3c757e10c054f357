"""The mechanism diagnostics (eval.diagnostics) of one dataset's study, per stage and cell.

    python study/diagnostics.py DATASET      # DATASET/report.sh runs it

For every run: the mean over its last 10 completed rounds and over clients (NaN entries left out)
of /diag/term_grad_share (the extra term's share of the gradient norm), /diag/r_distance
(||m - R|| / ||R||, co-distillation: the student's own class mean against the R it received) and
/diag/cka_teacher (linear CKA with its teacher's features on 64 validation images); then mean and
sd over the seeds of each cell (a cell as in `mpicd report`: the config minus seed and operational
keys). The share of the *loss* (train_extra / train_loss, from /metrics) is given beside it.
Read from the stages' runs ledgers (DATASET/<stage>.runs.jsonl: report.sh writes them from the
results files), so the table outlives the machine the runs were made on.
Writes DATASET/diagnostics.md and DATASET/diagnostics.csv.
"""

from __future__ import annotations

import csv
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[0]
sys.path.insert(0, str(ROOT))

from mpicd.report.ledger import load  # noqa: E402
from mpicd.report.runs import _label, Cell, distinguishing, fmt  # noqa: E402

LAST = 10
OVER_RUN = (1, 2, 5, 10, 20, 50, 100)
"""The rounds at which the over-the-run table shows each diagnostic (from the ledger's diag_curves)."""
DIAG = ("term_grad_share", "r_distance", "cka_teacher")
STAGES = (
    "tune",  # stage a: diagnostics on, lambda varies
    "mechanism",  # the only stage with eval.diagnostics on after the tuning
    "mechanism-control",  # lambda 0: local training's alignment, the baseline
    "lowdata",
    "main-low",
    "main-high",
    "six-low",
    "six-high",
    "six-clients",
    "fairness-reset",
    "fairness-termmean",
    "fairness-balanced",
)


def run_values(entry: dict) -> tuple[Cell, int, dict[str, float]]:
    """One ledger entry's diagnostics: the ledger's last-10 means (NaN entries left out)."""
    means = entry.get("last10", {})
    values = {k: means.get(f"diag/{k}") for k in DIAG}
    values["loss_share"] = means.get("metrics/train_extra_share")
    return (
        Cell.of(entry["config"]),
        int(entry["seed"]),
        {k: float("nan") if v is None else v for k, v in values.items()},
    )


def label(cell: Cell, keys: list[str]) -> str:
    """The method with its algorithm keys, then the other keys that set the cell apart (the skew)."""
    rest = [f"{k.split('.')[-1]}={fmt(cell.get(k))}" for k in keys if not k.startswith("algorithm.")]
    return _label(cell, keys) + (f", {', '.join(rest)}" if rest else "")


def over_the_run(entries: list[dict], name: str) -> list[str]:
    """One cell's diagnostic ``name`` at the OVER_RUN rounds: mean ± sd over the seeds whose ledger
    entry has diag_curves (written from the results file; "–" where none has a value)."""
    curves = [e["diag_curves"][name] for e in entries if name in e.get("diag_curves", {})]
    shown = []
    for r in OVER_RUN:
        v = np.array([c[r - 1] for c in curves if len(c) >= r and c[r - 1] is not None], dtype=float)
        if not len(v):
            shown.append("–")
        else:
            sd = f"{v.std(ddof=1):.2f}" if len(v) > 1 else "–"
            shown.append(f"{v.mean():.2f} ± {sd}")
    return shown


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    dataset = argv[0]
    lines = [
        f"# {dataset}: mechanism diagnostics (eval.diagnostics), written by diagnostics.py",
        "",
        f"Per run: mean over the last {LAST} rounds and the clients; per cell: mean ± sd over seeds (n).",
        "term_grad_share: ||g_term|| / (||g_ce|| + ||g_term||); loss_share: train_extra / train_loss;",
        "r_distance: ||m - R|| / ||R|| (co-distillation); cka_teacher: linear CKA with the teacher (co-distillation).",
        "Methods without an extra term (local, fedavg, centralized) have none of these: left out.",
    ]
    rows = []
    for stage in STAGES:
        ledger = HERE / dataset / f"{stage}.runs.jsonl"
        if not ledger.exists():
            continue
        by_cell: dict[Cell, list[dict]] = defaultdict(list)
        entries_of: dict[Cell, list[dict]] = defaultdict(list)
        for entry in load(ledger).values():
            got = run_values(entry)
            by_cell[got[0]].append(got[2])
            entries_of[got[0]].append(entry)
        cells = [c for c in by_cell if c.method not in ("local", "fedavg", "centralized")]
        if not cells:
            continue
        keys = distinguishing(list(by_cell))
        lines += [
            "",
            f"## {stage}",
            "",
            "| cell | n | " + " | ".join((*DIAG, "loss_share")) + " |",
            "|---|---|" + "---|" * (len(DIAG) + 1),
        ]
        for cell in sorted(cells, key=Cell.sort_key):
            runs = by_cell[cell]
            entry = {"stage": stage, "cell": label(cell, keys), "n": len(runs)}
            shown = []
            for k in (*DIAG, "loss_share"):
                v = np.array([r[k] for r in runs])
                v = v[np.isfinite(v)]
                mean, sd = (
                    (float(v.mean()), float(v.std(ddof=1)) if len(v) > 1 else float("nan")) if len(v) else (None, None)
                )
                entry[k], entry[k + "_sd"] = mean, sd
                shown.append("–" if mean is None else f"{mean:.3f} ± {sd:.3f}")
            rows.append(entry)
            lines.append(f"| {entry['cell']} | {len(runs)} | " + " | ".join(shown) + " |")
        with_curves = [c for c in sorted(cells, key=Cell.sort_key) if any("diag_curves" in e for e in entries_of[c])]
        for name in DIAG if with_curves else ():
            lines += [
                "",
                f"{stage}: {name} over the run (mean ± sd over seeds, at round):",
                "",
                "| cell | n | " + " | ".join(str(r) for r in OVER_RUN) + " |",
                "|---|---|" + "---|" * len(OVER_RUN),
            ]
            for cell in with_curves:
                entries = [e for e in entries_of[cell] if "diag_curves" in e]
                lines.append(
                    f"| {label(cell, keys)} | {len(entries)} | " + " | ".join(over_the_run(entries, name)) + " |"
                )
    if not rows:
        print(
            f"diagnostics.py: {dataset}: no finished runs with an extra term yet in {HERE / dataset}/*.runs.jsonl",
            file=sys.stderr,
        )
        return 0
    (HERE / dataset / "diagnostics.md").write_text("\n".join(lines) + "\n")
    with open(HERE / dataset / "diagnostics.csv", "w", newline="") as f:
        out = csv.DictWriter(f, fieldnames=list(rows[0]))
        out.writeheader()
        out.writerows({k: "" if v is None else v for k, v in r.items()} for r in rows)
    print(f"written: {HERE / dataset / 'diagnostics.md'}, diagnostics.csv ({len(rows)} cells)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
