"""Where co-distillation wins, ties or loses: codistill minus each other method, paired by seed.

    python study/archive/pneumoniamnist-unofficial/verdict.py       # report.sh runs it

For every stage (main = main-high + main-low, cnn, six-clients, authors-skew), both scoring rules
(mean of the last 10 rounds; the round of best validation minority accuracy) and two scores
(minority accuracy, balanced accuracy), the paired difference codistill - reference per cell with its 95% t-interval,
computed by mpicd.report.versus (the same code as `mpicd report --versus`). Writes verdict.csv
(every comparison) and verdict.md (tables: a row per reference, a column per skew). A stage with no
results files yet is left out and said so.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT))

from mpicd.report import collect, group, ReportError, versus  # noqa: E402

RESULTS = ROOT / "results" / "pneumoniamnist-study"
STAGES = {
    "main": ("main-high", "main-low"),
    "cnn": ("cnn",),
    "six-clients": ("six-clients",),
    "authors-skew": ("authors-skew",),
}
TITLES = {
    "main": "4 clients, authors' LeNet5 + Adam (skew 0-0.4: 5 seeds; 0.6-0.9: 10 seeds)",
    "cnn": "4 clients, FedAvgCNN + SGD lr 0.1, 3 seeds",
    "six-clients": "6 clients, authors' LeNet5 + Adam, 3 seeds",
    "authors-skew": "4 clients, authors' LeNet5 + Adam, the authors' skew (only expertise-0 clients skewed), 5 seeds",
}
RULES = {"last10": {"last": 10, "select": "last"}, "best-val": {"last": 1, "select": "best-val"}}
METRICS = ("minority_acc", "balanced_acc")
REFERENCES = ("local", "fedavg", "fedproto", "feddistill", "fedamp", "centralized")
METHOD = "codistill"


def comparisons(stage: str):
    """Yield one dict per (rule, metric, reference, skew) comparison of codistill in ``stage``."""
    paths = sorted(p for folder in STAGES[stage] for p in (RESULTS / folder).glob("*.h5"))
    if not paths:
        print(f"verdict.py: {stage}: no results files yet under {RESULTS}", file=sys.stderr)
        return
    for i, (rule, how) in enumerate(RULES.items()):
        runs, notes = collect(paths, how["last"], how["select"])
        for note in notes if i == 0 else ():  # the same files under every rule
            print(f"verdict.py: {stage}: {note}", file=sys.stderr)
        cells = group(runs)
        methods = {c.method for c in cells}
        for ref in REFERENCES:
            if ref not in methods or METHOD not in methods:
                continue
            for metric in METRICS:
                for p in versus(cells, ref, metric):
                    if p.cell.method != METHOD:
                        continue
                    yield {
                        "stage": stage,
                        "rule": rule,
                        "metric": metric,
                        "versus": ref,
                        "skew": p.cell.get("data.skew"),
                        "pairs": len(p.diffs),
                        "mean_diff": p.mean,
                        "ci_low": p.interval[0] if p.interval else None,
                        "ci_high": p.interval[1] if p.interval else None,
                        "verdict": p.verdict if p.interval else "",
                    }


def entry(row: dict) -> str:
    if row["ci_low"] is None:
        return "–" if row["mean_diff"] is None else f"{row['mean_diff']:+.3f} (n={row['pairs']})"
    return f"{row['verdict']} {row['mean_diff']:+.3f} [{row['ci_low']:+.3f}, {row['ci_high']:+.3f}]"


def table(rows: list[dict]) -> list[str]:
    skews = sorted({r["skew"] for r in rows})
    pairs = sorted({r["pairs"] for r in rows if r["pairs"]})
    out = [
        f"| codistill minus | {' | '.join(f's={s:g}' for s in skews)} |",
        "|---|" + "---|" * len(skews),
    ]
    for ref in REFERENCES:
        by_skew = {r["skew"]: r for r in rows if r["versus"] == ref}
        if by_skew:
            out.append(f"| {ref} | " + " | ".join(entry(by_skew[s]) if s in by_skew else "–" for s in skews) + " |")
    out.append("")
    out.append(f"(paired seeds per comparison: {', '.join(map(str, pairs))})")
    return out


def main() -> int:
    try:
        rows = [row for stage in STAGES for row in comparisons(stage)]
    except ReportError as err:
        print(f"verdict.py: {err}", file=sys.stderr)
        return 2
    with open(HERE / "verdict.csv", "w", newline="") as f:
        out = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["stage"])
        out.writeheader()
        for row in rows:
            out.writerow({k: "" if v is None else v for k, v in row.items()})
    lines = [
        "# Co-distillation against each method, paired by seed",
        "",
        "Each entry: verdict, mean of (codistill - method) over the paired seeds, 95% t-interval.",
        "wins / ties / loses: the interval lies above / contains / lies below 0. Written by verdict.py.",
    ]
    for stage in STAGES:
        for rule in RULES:
            for metric in METRICS:
                chosen = [r for r in rows if (r["stage"], r["rule"], r["metric"]) == (stage, rule, metric)]
                if not chosen:
                    continue
                score = "mean of the last 10 rounds" if rule == "last10" else "at the best-validation round"
                lines += ["", f"## {stage}: {metric}, {score}", "", TITLES[stage], "", *table(chosen)]
    (HERE / "verdict.md").write_text("\n".join(lines) + "\n")
    print(f"written: {HERE / 'verdict.md'}, {HERE / 'verdict.csv'} ({len(rows)} comparisons)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
