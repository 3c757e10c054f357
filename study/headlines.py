"""The study's headline sentences, written from the runs ledgers, so the prose that states them cannot drift.

    python study/headlines.py        # report.sh runs it after summary.py

summary.py writes the tables; the sentences that summarised them were typed by hand and had drifted
from them (ties said where Holm finds losses, "never beats" where only Holm removes six unadjusted wins, a
"bit for bit" that holds for 7 runs of 60). This writes those sentences with summary.py's own
arithmetic (its family, pairs and Holm, imported, not copied) between the ``headline`` markers of
study/README.md and docs/explanation/study.md: the Holm verdicts per reference and dataset, the
gaps to FedAvg at skew 0 and 0.9, the comparisons won before Holm, the best-validation round's
reversal against FedAvg, and how many mechanism-stage runs equal their main-grid twin bit for bit.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[0]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

import summary  # noqa: E402
from mpicd.report import ReportError  # noqa: E402
from mpicd.report.ledger import load as load_ledger  # noqa: E402
from mpicd.report.runs import Cell  # noqa: E402

PAGES = (HERE / "README.md", ROOT / "docs" / "explanation" / "study.md")
NAME = {"fedavg": "FedAvg", "fedproto": "FedProto", "feddistill": "FedDistill", "fedamp": "FedAMP", "local": "local"}
SHORT = {"retinamnist": "RetinaMNIST", "pneumoniamnist": "PneumoniaMNIST"}
MAIN = ("main-low", "main-high")


def signed(x: float) -> str:
    """+0.012 / −0.012 (a typographic minus, as the hand-written prose has it)."""
    return f"{x:+.3f}".replace("-", "−")


def bound(x: float) -> str:
    """An interval's end: 3 decimals, 4 where 3 would round it to 0 and hide on which side of 0 it lies."""
    return f"{x:+.4f}".replace("-", "−") if round(x, 3) == 0 and x != 0 else signed(x)


def pair(entry) -> str:
    """A paired comparison as the prose writes it: mean [95% interval]."""
    diffs, ci, _ = entry
    return f"{signed(diffs.mean())} [{bound(ci[0])}, {bound(ci[1])}]"


def skews(values) -> str:
    values = [f"{v:g}" for v in values]
    return values[0] if len(values) == 1 else ", ".join(values[:-1]) + " and " + values[-1]


def holm_verdicts(family: list) -> str:
    """Wins, ties and losses after Holm, in all and per dataset and reference, with the skews lost at."""
    total = {v: sum(row[-1] == v for row in family) for v in ("wins", "ties", "loses")}
    out = [
        f"**Primary family, Holm over its {len(family)} comparisons** (co-distillation as proposed, shared "
        "features, minus each reference; test minority accuracy, last 10 rounds, paired by seed): "
        f"wins {total['wins']}, ties {total['ties']}, loses {total['loses']}."
    ]
    for dataset in summary.PRIMARY:
        parts = []
        for ref in summary.REFS:
            rows = [r for r in family if r[0] == dataset and r[2] == ref]
            counts = {v: [r[1] for r in rows if r[-1] == v] for v in ("wins", "ties", "loses")}
            said = [
                f"{v} {len(at)}" + (f" (skew {skews(at)})" if v != "ties" and 0 < len(at) < len(rows) else "")
                for v, at in counts.items()
                if at
            ]
            parts.append(f"{NAME[ref]} {', '.join(said)}")
        out.append(f"{SHORT[dataset]}: against {'; '.join(parts)}.")
    return " ".join(out)


def fedavg_gaps(family: list) -> str:
    got = {(r[0], r[1]): r[3] for r in family if r[2] == "fedavg"}
    at = [
        f"{SHORT[d]} {pair(got[(d, 0.0)])} at skew 0 and {pair(got[(d, 0.9)])} at 0.9"
        for d in summary.PRIMARY
        if got.get((d, 0.0)) is not None and got.get((d, 0.9)) is not None
    ]
    return "Co-distillation − FedAvg (unadjusted 95% paired t-intervals): " + "; ".join(at) + "."


def unadjusted_wins(family: list) -> str:
    """The comparisons whose unadjusted interval lies above 0, and what Holm makes of them."""
    won = [r for r in family if r[3] is not None and summary.unadjusted(r[3]) == "wins"]
    if not won:
        return "No comparison of the family is won even before Holm (no unadjusted interval above 0)."
    cells = []
    for dataset in summary.PRIMARY:
        mine = [r for r in won if r[0] == dataset]
        if mine:
            cells.append(f"{SHORT[dataset]} " + ", ".join(f"{NAME[r[2]]} at {r[1]:g} {pair(r[3])}" for r in mine))
    after = sorted({r[-1] for r in won})
    ps = [r[4] for r in won]
    return (
        f"Before Holm co-distillation wins {len(won)} of the {len(family)} (interval above 0): {'; '.join(cells)}. "
        f"After Holm (adjusted p {min(ps):.3g} to {max(ps):.3g}) they are {' or '.join(after)}."
    )


def by_skew(runs: list) -> dict:
    """(method row, skew) -> {seed: run}."""
    out: dict = {}
    for r in runs:
        out.setdefault((summary.label(r.cell), r.cell.get("data.skew")), {})[r.seed] = r
    return out


def reversal(dataset: str) -> str | None:
    """codistill − FedAvg where the best-validation round turns it into an unadjusted win, and what
    the chosen rounds do to each side: minority and balanced accuracy against the last 10 rounds."""
    last = summary.pairs(dataset, MAIN, "features")
    best = summary.pairs(dataset, MAIN, "features", select="best-val")
    balanced = summary.pairs(dataset, MAIN, "features", select="best-val", metric="balanced_acc")
    at = [
        s
        for s in summary.SKEWS
        if ("fedavg", s) in best
        and ("fedavg", s) in last
        and summary.unadjusted(best[("fedavg", s)]) == "wins"
        and summary.unadjusted(last[("fedavg", s)]) != "wins"
    ]
    if not at:
        return None
    chosen = by_skew(summary.scored(dataset, MAIN, 1, "best-val"))
    tail = by_skew(summary.scored(dataset, MAIN, 10, "last"))

    def gain(method: str, s: float, metric: str) -> str:
        runs, before = chosen[(method, s)], tail[(method, s)]
        return signed(float(np.mean([runs[k].scores[metric] - before[k].scores[metric] for k in runs])))

    def median_round(method: str, s: float) -> str:
        return f"{np.median([r.selected_round + 1 for r in chosen[(method, s)].values()]):g}"

    def each(f) -> str:
        return ", ".join(f(s) for s in at)

    me = summary.CODISTILL
    return (
        f"on {SHORT[dataset]} at skew {skews(at)} it becomes {each(lambda s: pair(best[('fedavg', s)]))} "
        f"(last 10 rounds: {each(lambda s: pair(last[('fedavg', s)]))}); at the chosen rounds (median round: "
        f"co-distillation {each(lambda s: median_round(me, s))}, FedAvg {each(lambda s: median_round('fedavg', s))}) "
        f"co-distillation's minority accuracy is {each(lambda s: gain(me, s, 'minority_acc'))} above its last 10 "
        f"rounds' and its balanced accuracy {each(lambda s: gain(me, s, 'balanced_acc'))}, FedAvg's minority "
        f"accuracy {each(lambda s: gain('fedavg', s, 'minority_acc'))} (balanced "
        f"{each(lambda s: gain('fedavg', s, 'balanced_acc'))}), and in balanced accuracy co-distillation − FedAvg "
        f"at the chosen rounds is {each(lambda s: pair(balanced[('fedavg', s)]))}"
    )


def best_val() -> str:
    cells = [c for c in map(reversal, summary.PRIMARY) if c is not None]
    if not cells:
        return "At the best-validation round co-distillation − FedAvg is an unadjusted win nowhere."
    return (
        "**Best-validation round** (secondary, unadjusted; each run scored at its round of highest validation "
        "minority accuracy) against FedAvg: " + "; ".join(cells) + "."
    )


def twin(entry: dict) -> tuple:
    """What a mechanism-stage run shares with its main-grid twin: the cell (the config less the
    operational keys, eval.diagnostics among them) and the seed. The λ = 0 control's twin is local
    training's run: it trains as local training does (tests/test_codistill.py)."""
    config = entry["config"]
    algorithm = config["algorithm"]
    if algorithm["name"] == "codistill" and algorithm["lambda"] == 0:
        config = {**config, "algorithm": {"name": "local"}}
    return Cell.of(config), entry["seed"]


def bit_for_bit() -> str:
    """How many mechanism-stage runs equal their main-grid twin in every stored score and curve, and
    how that lines up with the CPU model each ran on (the ledger's ``cpu``)."""
    rows = []  # (stage, equal, same cpu, its cpu, the twin's cpu)
    for dataset in summary.PRIMARY:
        main = {}
        for stage in MAIN:
            for entry in load_ledger(HERE / dataset / f"{stage}.runs.jsonl").values():
                main[twin(entry)] = entry
        for stage in ("mechanism", "mechanism-control"):
            for entry in load_ledger(HERE / dataset / f"{stage}.runs.jsonl").values():
                other = main[twin(entry)]
                equal = entry["views"] == other["views"] and entry["curves"] == other["curves"]
                cpu, its = " + ".join(entry["cpu"]), " + ".join(other["cpu"])
                rows.append((stage, equal, cpu == its, cpu, its))
    equal = [r for r in rows if r[1]]
    same = [r for r in rows if r[2]]
    apart = [r for r in rows if not r[2]]

    def of(stage: str) -> str:
        mine = [r for r in rows if r[0] == stage]
        return f"{sum(r[1] for r in mine)} of {len(mine)}"

    cpus = sorted({(r[3], r[4]) for r in apart})
    return (
        f"**Mechanism stage against the main grid** (the same config and seed, stored scores and curves compared "
        f"exactly): {len(equal)} of its {len(rows)} runs equal their main-grid twin bit for bit "
        f"({of('mechanism')} co-distillation runs, {of('mechanism-control')} λ = 0 controls against local "
        f"training's runs). Equal: {sum(r[1] for r in same)} of the {len(same)} pairs that ran on one CPU model "
        f"({', '.join(sorted({r[3] for r in same})) or 'none'}), {sum(r[1] for r in apart)} of the {len(apart)} "
        f"that ran on two ({'; '.join(f'{a} against {b}' for a, b in cpus) or 'none'}): mpicd's runs are "
        "reproducible bit for bit only on the same CPU model, threads per rank and library versions."
    )


def headline() -> str:
    family = summary.family()
    return "\n\n".join([holm_verdicts(family), fedavg_gaps(family), unadjusted_wins(family), best_val(), bit_for_bit()])


def main() -> int:
    try:
        body = headline()
    except ReportError as err:
        print(f"headlines.py: {err}", file=sys.stderr)
        return 2
    for page in PAGES:
        try:
            page.write_text(summary.between(page.read_text(), "headline", body, "headlines.py"))
        except ValueError as err:
            print(f"headlines.py: {page}: {err}", file=sys.stderr)
            return 2
    print(f"written: the headline blocks of {', '.join(str(p) for p in PAGES)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
