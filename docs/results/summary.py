"""The summary page's claims table: the paper's claim cell by cell against what mpicd measured.

    python docs/results/summary.py          # report.sh runs it; rewrites the tables in README.md

Primary family (carries the overall verdict, Holm-corrected): co-distillation as the paper
proposes it (share: features) minus each of FedAvg, FedProto, FedDistill, FedAMP and local
training, test minority accuracy (mean over clients, mean of the last 10 rounds), paired by seed,
at each of the six skews of the 4-client main grid of RetinaMNIST and of PneumoniaMNIST:
5 references x 6 skews x 2 datasets = 60 two-sided paired t-tests. Holm's step-down correction at
family-wise alpha 0.05 over all 60, whether measured or not (a comparison not yet measured counts
as p = 1, which can only make the others' adjusted p larger): wins / loses = Holm-adjusted p < 0.05
with the mean difference above / below 0, ties otherwise. The interval shown is the unadjusted 95%
paired t-interval. Everything else (the logit reading, 6 clients, low data, best-validation
round, balanced accuracy, the training-split audit, the fairness options) is secondary: reported
with its unadjusted interval and verdict in claims-secondary.md, never counted in the verdict.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
from scipy import stats

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))

from mpicd.report import ReportError, collect, group, versus  # noqa: E402

ALPHA = 0.05
SKEWS = (0.0, 0.2, 0.4, 0.6, 0.8, 0.9)
REFS = ("fedavg", "fedproto", "feddistill", "fedamp", "local")
PRIMARY = ("retinamnist", "pneumoniamnist")
TITLE = {
    "retinamnist": "RetinaMNIST (~APTOS)",
    "pneumoniamnist": "PneumoniaMNIST (~COVID)",
    "breastmnist": "BreastMNIST",
}
PENDING = "pending"


def pairs(
    dataset: str,
    stages: tuple[str, ...],
    share: str,
    split: str = "test",
    select: str = "last",
    metric: str = "minority_acc",
    key: str = "data.skew",
) -> dict:
    """(reference, value of key) -> diffs of codistill(share) minus reference, paired by seed."""
    paths = [p for s in stages if (p := HERE / dataset / f"{s}.runs.jsonl").exists()]  # the runs ledgers
    if not paths:
        return {}
    runs, _ = collect(paths, 1 if select == "best-val" else 10, select, split=split)
    cells = group(runs)
    out = {}
    for ref in REFS + ("centralized",):
        if not any(c.method == ref for c in cells) or not any(c.method == "codistill" for c in cells):
            continue
        for p in versus(cells, ref, metric):
            if p.cell.method == "codistill" and p.cell.get("algorithm.share") == share and len(p.diffs) > 1:
                out[(ref, p.cell.get(key))] = (np.array(p.diffs), p.interval, p.collapsed)
    return out


def pvalue(diffs: np.ndarray) -> float:
    if np.allclose(diffs, diffs[0]):
        return 1.0 if diffs[0] == 0 else 0.0
    return float(stats.ttest_1samp(diffs, 0.0).pvalue)


def holm(ps: list[float]) -> list[float]:
    m, order = len(ps), sorted(range(len(ps)), key=lambda i: ps[i])
    adjusted, running = [1.0] * m, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * ps[i]))
        adjusted[i] = running
    return adjusted


def fmt_pair(entry) -> tuple[str, str]:
    diffs, ci, _ = entry
    return f"{diffs.mean():+.3f} (n={len(diffs)})", f"[{ci[0]:+.3f}, {ci[1]:+.3f}]"


def unadjusted(entry) -> str:
    diffs, ci, collapsed = entry
    return "degenerate" if collapsed else "wins" if ci[0] > 0 else "loses" if ci[1] < 0 else "ties"


def primary() -> tuple[list[str], str]:
    family = []
    for dataset in PRIMARY:
        got = pairs(dataset, ("main-low", "main-high"), "features")
        for skew in SKEWS:
            for ref in REFS:
                family.append((dataset, skew, ref, got.get((ref, skew))))
    adjusted = holm([pvalue(e[0]) if e is not None else 1.0 for *_, e in family])
    lines = [
        "| dataset | skew | paper's claim | mpicd measured (codistill − ref, mean over seeds) "
        "| paired interval (95%, unadjusted) | Holm-adjusted p | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    tally = {"wins": 0, "ties": 0, "loses": 0, PENDING: 0, "degenerate": 0}
    for (dataset, skew, ref, entry), p in zip(family, adjusted):
        claim = f"codistill's minority accuracy above {ref}'s"
        if entry is None:
            verdict, measured, ci, padj = PENDING, PENDING, PENDING, PENDING
        else:
            measured, ci = fmt_pair(entry)
            diffs, _, collapsed = entry
            verdict = "degenerate" if collapsed else ("wins" if diffs.mean() > 0 else "loses") if p < ALPHA else "ties"
            padj = f"{p:.3g}"
        tally[verdict] += 1
        lines.append(f"| {TITLE[dataset]} | {skew:g} | {claim} | {measured} | {ci} | {padj} | {verdict} |")
    counts = ", ".join(f"{k} {v}" for k, v in tally.items() if v)
    return lines, f"Primary family: {len(family)} comparisons; {counts}."


def secondary() -> list[str]:
    out = [
        "# Secondary comparisons (unadjusted 95% intervals; not counted in the overall verdict)",
        "",
        "Written by summary.py. codistill (features unless said) minus each method, paired by seed, minority",
        "accuracy unless said. `pending`: not measured yet.",
    ]
    blocks = []
    for dataset in PRIMARY:
        main = ("main-low", "main-high")
        blocks += [
            (dataset, "4 clients, the logit reading (share: logits), last 10", main, "logits", {}),
            (dataset, "4 clients, best-validation round", main, "features", {"select": "best-val"}),
            (dataset, "4 clients, balanced accuracy, last 10", main, "features", {"metric": "balanced_acc"}),
            (
                dataset,
                "4 clients, TRAINING split (audit), last 10: does codistill's standing change?",
                main,
                "features",
                {"split": "train"},
            ),
            (dataset, "6 clients, last 10", ("six-low", "six-high", "six-clients"), "features", {}),
            (dataset, "6 clients, the logit reading, last 10", ("six-low", "six-high", "six-clients"), "logits", {}),
            (
                dataset,
                "low data (skew 0.6), by images per class, last 10",
                ("lowdata",),
                "features",
                {"key": "data.images_per_class"},
            ),
        ]
    blocks.append(
        ("breastmnist", "low data at its maximum (36 per class, skew 0.6), last 10", ("lowdata",), "features", {})
    )
    for dataset, what, stages, share, kw in blocks:
        got = pairs(dataset, stages, share, **kw)
        values = sorted({v for (_, v) in got}, key=float) if got else []
        out += ["", f"## {TITLE[dataset]}: {what}", ""]
        if not got:
            out.append(PENDING)
            continue
        key = kw.get("key", "data.skew")
        out += [
            "| codistill minus | " + " | ".join(f"{key.split('.')[-1]}={v:g}" for v in values) + " |",
            "|---|" + "---|" * len(values),
        ]
        for ref in REFS + ("centralized",):
            cells = [got.get((ref, v)) for v in values]
            if any(cells):
                out.append(
                    f"| {ref} | "
                    + " | ".join(
                        "–" if e is None else f"{unadjusted(e)} {fmt_pair(e)[0]} {fmt_pair(e)[1]}" for e in cells
                    )
                    + " |"
                )
    out += audit()
    return out


def audit() -> list[str]:
    """The memorisation question in one table: each codistill-minus-reference comparison's
    unadjusted verdict on the test split next to the same pair scored on the clients' own training
    images (eval.train_split), and how many comparisons change verdict."""
    out = [
        "",
        "## Does scoring on the training images (the paper's suspected way) change codistill's standing?",
        "",
    ]
    rows, changed, total = [], 0, 0
    for dataset in PRIMARY:
        main = ("main-low", "main-high")
        for share in ("features", "logits"):
            test, train = pairs(dataset, main, share), pairs(dataset, main, share, split="train")
            for key in sorted(set(test) & set(train), key=lambda k: (REFS + ("centralized",)).index(k[0]) * 10 + k[1]):
                a, b = unadjusted(test[key]), unadjusted(train[key])
                total += 1
                changed += a != b
                rows.append(
                    f"| {TITLE[dataset]} | {share} | {key[1]:g} | {key[0]} | {a} {fmt_pair(test[key])[0]} "
                    f"| {b} {fmt_pair(train[key])[0]} | {'**changes**' if a != b else 'same'} |"
                )
    if not rows:
        return [*out, PENDING]
    return [
        *out,
        "| dataset | reading | skew | codistill minus | test split (held out) | training split (audit) | verdict |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
        f"{changed} of {total} comparisons change their unadjusted verdict when scored on the training images.",
    ]


def main() -> int:
    try:
        lines, tally = primary()
        (HERE / "claims-secondary.md").write_text("\n".join(secondary()) + "\n")
    except ReportError as err:
        print(f"summary.py: {err}", file=sys.stderr)
        return 2
    readme = HERE / "README.md"
    text = readme.read_text()
    block = "<!-- claims: begin (summary.py) -->\n" + "\n".join(lines) + f"\n\n{tally}\n<!-- claims: end -->"
    new, n = re.subn(
        r"<!-- claims: begin \(summary\.py\) -->.*?<!-- claims: end -->", lambda _: block, text, flags=re.S
    )
    if n != 1:
        print("summary.py: README.md has no claims markers", file=sys.stderr)
        return 2
    readme.write_text(new)
    print(f"written: {readme} (claims table), {HERE / 'claims-secondary.md'}; {tally}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
