"""How far the study is, from what is committed: per stage and sweep, the runs its ledger holds of
those the sweep plans, and the CPU models they ran on (the ledger's ``cpu``: results are bit for bit
only on one CPU model, so a table that mixes models should say so).

    python study/progress.py        # report.sh runs it; rewrites the progress block of README.md
                                           # and the status block of each dataset's README.md

Read from the sweep files and runs ledgers only, never from results files: a new machine, with no
results files, prints the same table as the machine that ran the runs.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[0]
sys.path.insert(0, str(ROOT))

from mpicd.core.schema import ConfigError  # noqa: E402
from mpicd.sweep.grid import load_sweep  # noqa: E402

# run.sh's stages, in its order: (letter, dataset, sweeps)
STAGES = (
    ("a1", "pneumoniamnist", ("tune",)),
    ("p", "pneumoniamnist", ("privacy-off", "privacy-shared", "privacy-dpsgd")),
    ("a2", "retinamnist", ("tune",)),
    ("m", "pneumoniamnist", ("mechanism", "mechanism-control")),
    ("m", "retinamnist", ("mechanism", "mechanism-control")),
    ("c", "retinamnist", ("main-low", "main-high")),
    ("d", "pneumoniamnist", ("main-low", "main-high")),
    ("b", "breastmnist", ("lowdata",)),
    ("b", "pneumoniamnist", ("lowdata",)),
    ("b", "retinamnist", ("lowdata",)),
    ("f", "retinamnist", ("fairness-reset", "fairness-termmean", "fairness-balanced")),
    ("f", "pneumoniamnist", ("fairness-reset", "fairness-termmean", "fairness-balanced")),
    ("e", "retinamnist", ("six-low", "six-high")),
    ("e", "pneumoniamnist", ("six-clients",)),
    ("k1", "retinamnist", ("consortium-tune", "consortium-tune-sampler", "consortium-tune-loss")),
    ("k1", "pneumoniamnist", ("consortium-tune", "consortium-tune-sampler", "consortium-tune-loss")),
    ("k2", "retinamnist", ("consortium", "consortium-sampler", "consortium-moonshot")),
    ("k2", "pneumoniamnist", ("consortium", "consortium-sampler", "consortium-moonshot")),
    ("k3", "retinamnist", ("consortium-references",)),
    ("k3", "pneumoniamnist", ("consortium-references",)),
)
# sweeps that consortium.py choose writes once k1's tuning is done (the moonshot's only where validation
# picked a candidate that consortium-sampler does not already run)
LATER = {
    "consortium": "written when k1 ends",
    "consortium-sampler": "written when k1 ends",
    "consortium-moonshot": "written when k1 ends, if its pick is not in consortium-sampler",
    "consortium-references": "written when k1 ends",
}
# a1's runs were lost with a replaced machine before the ledgers existed (README: its chosen.yaml is what they decided)
LOST = {("pneumoniamnist", "tune"): "done before the ledgers existed; chosen.yaml is what it decided"}


def tally(planned: list[str], entries: list[dict]) -> tuple[int, Counter]:
    """(how many planned runs the ledger holds, a Counter of the CPU models of those runs); a run
    resumed on another machine counts under each model it ran on, joined with ' + '."""
    wanted = set(planned)
    held = [e for e in entries if e.get("name") in wanted]
    cpus = Counter(" + ".join(e.get("cpu") or ["unknown"]) for e in held)
    return len({e["name"] for e in held}), cpus


def read_ledger(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def rows() -> list[dict]:
    """One row per sweep of every stage, in run.sh's order: what its ledger holds of what it plans."""
    out = []
    for letter, dataset, sweeps in STAGES:
        for sweep in sweeps:
            path = HERE / dataset / f"{sweep}.yaml"
            if sweep in LATER and not path.exists():
                out.append(
                    dict(stage=letter, dataset=dataset, sweep=sweep, held=0, planned=None, cpus=Counter(), lost=None)
                )
                continue
            try:
                planned = [run.output.stem for run in load_sweep(path)]
            except ConfigError as err:
                raise SystemExit(f"progress.py: {path}: {err}") from None
            held, cpus = tally(planned, read_ledger(HERE / dataset / f"{sweep}.runs.jsonl"))
            lost = LOST.get((dataset, sweep)) if not held else None
            out.append(
                dict(stage=letter, dataset=dataset, sweep=sweep, held=held, planned=len(planned), cpus=cpus, lost=lost)
            )
    return out


def count(row: dict) -> str:
    """'held / planned', or '– / planned' for a sweep whose runs were lost before the ledgers, or
    '0 / –' for one not written yet."""
    if row["planned"] is None:
        return "0 / –"
    return f"– / {row['planned']}" if row["lost"] else f"{row['held']} / {row['planned']}"


def state(row: dict) -> str:
    """done / under way / not started, from the counts alone (a lost stage says what decided it)."""
    if row["lost"]:
        return row["lost"]
    if row["planned"] is None:
        return LATER[row["sweep"]]
    if row["held"] == row["planned"]:
        return "done"
    return "under way" if row["held"] else "not started"


def table(every: list[dict] | None = None) -> list[str]:
    lines = [
        "| stage | dataset | sweep | runs in the ledger / planned | CPU models (runs) |",
        "|---|---|---|---|---|",
    ]
    held_all = planned_all = 0
    for row in rows() if every is None else every:
        machines = ", ".join(f"{cpu} ({n})" for cpu, n in sorted(row["cpus"].items())) or "–"
        if row["lost"]:
            machines = row["lost"]
        elif row["planned"] is None:
            machines = LATER[row["sweep"]]
        else:
            held_all, planned_all = held_all + row["held"], planned_all + row["planned"]
        lines.append(f"| {row['stage']} | {row['dataset']} | {row['sweep']} | {count(row)} | {machines} |")
    lines += ["", f"In all (stage a1 aside): {held_all} of {planned_all} planned runs are in the committed ledgers."]
    return lines


def dataset_status(dataset: str, every: list[dict]) -> list[str]:
    """The status block of ``<dataset>/README.md``: its sweeps' rows, so that page never says less than the ledgers."""
    lines = ["| stage | sweep | runs in the ledger / planned | state |", "|---|---|---|---|"]
    for row in every:
        if row["dataset"] == dataset:
            lines.append(f"| {row['stage']} | {row['sweep']} | {count(row)} | {state(row)} |")
    return lines


def main() -> int:
    from summary import between  # the same marker rewrite as the claims table

    every = rows()
    pages = [(HERE / "README.md", "progress", table(every))]
    pages += [
        (HERE / d / "README.md", "status", dataset_status(d, every)) for d in sorted({r["dataset"] for r in every})
    ]
    for readme, name, body in pages:
        try:
            readme.write_text(between(readme.read_text(), name, "\n".join(body), "progress.py"))
        except ValueError as err:
            print(f"progress.py: {readme}: {err}", file=sys.stderr)
            return 2
        print(f"written: {readme} ({name} table)")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    sys.exit(main())
