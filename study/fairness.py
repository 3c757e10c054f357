"""The fairness options: each option's effect, and local balancing against communication.

    python study/fairness.py          # report.sh runs it

Reads stage f's ledgers of each dataset (<dataset>/fairness-{reset,termmean,balanced}.runs.jsonl:
one option changed from its default, skew 0.8, seeds 0-4) and, as the defaults (optimizer state
kept, the co-distillation term averaged over the matching samples, cross-entropy), the main grid's
runs of the same methods at skew 0.8 and the same seeds (<dataset>/main-high.runs.jsonl). Test
minority and balanced accuracy, mean over clients, last 10 rounds; every difference is paired by
seed, with an unadjusted 95% t-interval (descriptive, outside the primary family). Two tables per
dataset: each option's effect on each method (option - default), and the question the balanced loss
asks, whether handling the imbalance locally does as well as communicating (each method, with
either loss, against local training with the balanced loss). A comparison enters only once both
sides hold every seed the fairness sweeps plan (else "pending"). Writes study/fairness.md
and rewrites the block between the fairness markers of study/README.md.
"""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[0]
sys.path.insert(0, str(ROOT))

from mpicd.report.ledger import load  # noqa: E402
from mpicd.report.stats import t_quantile  # noqa: E402
from mpicd.sweep.grid import load_sweep  # noqa: E402

DATASETS = {"retinamnist": "RetinaMNIST", "pneumoniamnist": "PneumoniaMNIST"}
STAGES = ("fairness-reset", "fairness-termmean", "fairness-balanced")
SKEW = 0.8
DEFAULT = {"optimizer_state": "keep", "term_mean": "matching", "loss": "ce"}
OPTIONS = (  # (the option, its non-default value, the column's title)
    ("optimizer_state", "reset", "optimizer reset − kept"),
    ("term_mean", "batch", "term over the batch − over matching"),
    ("loss", "balanced", "balanced loss − ce"),
)
METRICS = ("minority_acc", "balanced_acc")


def method(entry: dict) -> str:
    """The method with its tuned settings, without the three options: 'codistill (lambda=3, share=features)'."""
    algorithm = entry["config"]["algorithm"]
    extra = [f"{k}={algorithm[k]:g}" for k in ("lambda",) if k in algorithm]
    extra += [f"share={algorithm['share']}"] if "share" in algorithm else []
    return algorithm["name"] + (f" ({', '.join(extra)})" if extra else "")


def setting(entry: dict) -> dict[str, str]:
    """The three options' values in this run (term_mean only exists for codistill: its default elsewhere)."""
    config = entry["config"]
    return {
        "optimizer_state": config["train"].get("optimizer_state", DEFAULT["optimizer_state"]),
        "term_mean": config["algorithm"].get("term_mean", DEFAULT["term_mean"]),
        "loss": config["train"].get("loss", DEFAULT["loss"]),
    }


def planned(dataset: str) -> tuple[set[tuple[str, tuple]], list[int]]:
    """The cells stage f plans, (method, (optimizer_state, term_mean, loss)), with each of its methods'
    default cell (the main grid's runs), and the seeds it plans; from the committed sweep files."""
    cells: set[tuple[str, tuple]] = set()
    seeds: set[int] = set()
    for stage in STAGES:
        path = HERE / dataset / f"{stage}.yaml"
        if not path.exists():
            continue
        for run in load_sweep(path):
            entry = {"config": run.resolved}
            cells |= {(method(entry), tuple(setting(entry).values())), (method(entry), tuple(DEFAULT.values()))}
            seeds.add(int(run.resolved["seed"]))
    return cells, sorted(seeds)


def entries(dataset: str, seeds: list[int]) -> list[dict]:
    """Stage f's runs, and the main grid's runs at skew 0.8 on the same seeds (the defaults)."""
    out = []
    for stage in STAGES:
        path = HERE / dataset / f"{stage}.runs.jsonl"
        out += list(load(path).values()) if path.exists() else []
    main = HERE / dataset / "main-high.runs.jsonl"
    if main.exists():
        out += [
            e
            for e in load(main).values()
            if float(e["config"]["data"]["skew"]) == SKEW and int(e["seed"]) in seeds and setting(e) == DEFAULT
        ]
    return out


def score(entry: dict, metric: str) -> float:
    return entry["views"]["test"]["last10"]["scores"][metric]


def paired(a: dict[int, dict], b: dict[int, dict], metric: str, seeds: list[int]) -> str:
    """mean of (a - b) over the planned seeds with its 95% t-interval; 'pending' until both hold all of them."""
    if not seeds or any(s not in a or s not in b for s in seeds):
        return "pending"
    diffs = [score(a[s], metric) - score(b[s], metric) for s in seeds]
    if len(diffs) < 2:
        return "–"
    half = t_quantile(0.975, len(diffs) - 1) * float(np.std(diffs, ddof=1)) / math.sqrt(len(diffs))
    mean = float(np.mean(diffs))
    return f"{mean:+.3f} [{mean - half:+.3f}, {mean + half:+.3f}]"


def mean_of(runs: dict[int, dict], metric: str, seeds: list[int]) -> str:
    if not seeds or any(s not in runs for s in seeds):
        return "pending"
    return f"{np.mean([score(runs[s], metric) for s in seeds]):.3f}"


def cells(dataset: str) -> tuple[dict[tuple[str, tuple], dict[int, dict]], set[tuple[str, tuple]], list[int]]:
    """{(method, (optimizer_state, term_mean, loss)): {seed: ledger entry}}, the planned cells, the planned seeds."""
    plan, seeds = planned(dataset)
    got: dict[tuple[str, tuple], dict[int, dict]] = {key: {} for key in plan}
    for e in entries(dataset, seeds):
        key = (method(e), tuple(setting(e).values()))
        if key in plan:
            got[key][int(e["seed"])] = e
    return got, plan, seeds


def changed(option: str, value: str) -> tuple:
    return tuple(value if k == option else v for k, v in DEFAULT.items())


def effects(dataset: str) -> list[str]:
    got, _, seeds = cells(dataset)
    base = tuple(DEFAULT.values())
    methods = sorted({m for m, s in got if s == base})
    if not methods:
        return ["pending"]
    head = ["method", "default: minority / balanced acc"]
    head += [f"{title}: {m.replace('_acc', '')}" for _, _, title in OPTIONS for m in METRICS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name in methods:
        ref = got[(name, base)]
        row = [name, f"{mean_of(ref, 'minority_acc', seeds)} / {mean_of(ref, 'balanced_acc', seeds)}"]
        for option, value, _ in OPTIONS:
            runs = got.get((name, changed(option, value)))
            row += ["–" if runs is None else paired(runs, ref, m, seeds) for m in METRICS]  # None: not planned
        lines.append("| " + " | ".join(row) + " |")
    return lines


def local_balancing(dataset: str) -> list[str]:
    got, _, seeds = cells(dataset)
    local = got.get(("local", changed("loss", "balanced")))
    if local is None:
        return ["pending"]
    lines = [
        "| method | ce: minority acc | ce − local balanced: minority | balanced loss: minority acc "
        "| balanced − local balanced: minority | balanced − local balanced: balanced acc |",
        "|---|---|---|---|---|---|",
    ]
    for name in sorted({m for m, _ in got}):
        ce, bal = got.get((name, tuple(DEFAULT.values()))), got.get((name, changed("loss", "balanced")))
        row = [
            name,
            "–" if ce is None else mean_of(ce, "minority_acc", seeds),
            "–" if ce is None else paired(ce, local, "minority_acc", seeds),
            "–" if bal is None else mean_of(bal, "minority_acc", seeds),
            "–" if name == "local" or bal is None else paired(bal, local, "minority_acc", seeds),
            "–" if name == "local" or bal is None else paired(bal, local, "balanced_acc", seeds),
        ]
        lines.append("| " + " | ".join(row) + " |")
    return lines


def main() -> int:
    blocks = []
    for dataset, title in DATASETS.items():
        blocks += [
            "",
            f"### {title}: each option's effect (option − default, paired by seed)",
            "",
            *effects(dataset),
            "",
            f"### {title}: local balancing against communication (− local training with the balanced loss)",
            "",
            *local_balancing(dataset),
        ]
    body = "\n".join(blocks).strip("\n")
    page = [
        "# The fairness options: written by fairness.py from the stage f ledgers",
        "",
        f"Skew {SKEW:g}, 4 clients, seeds 0-4 (the fairness sweeps' seeds); the defaults (optimizer state kept,",
        "the co-distillation term averaged over the matching samples, cross-entropy) are the main grid's runs",
        "of the same methods and seeds. Test split, mean over clients, last 10 rounds. Differences are paired",
        "by seed, mean with an unadjusted 95% t-interval; 'pending' until both sides hold every seed, '–'",
        "where the option does not apply (term_mean is co-distillation's) or was not run.",
        "",
        body,
        "",
    ]
    (HERE / "fairness.md").write_text("\n".join(page))
    readme = HERE / "README.md"
    text = readme.read_text()
    block = "<!-- fairness: begin (fairness.py) -->\n" + body + "\n<!-- fairness: end -->"
    new, n = re.subn(
        r"<!-- fairness: begin \(fairness\.py\) -->.*?<!-- fairness: end -->", lambda _: block, text, flags=re.S
    )
    if n == 1:
        readme.write_text(new)
    print(f"written: {HERE / 'fairness.md'}" + (f", {readme} (fairness tables)" if n == 1 else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
