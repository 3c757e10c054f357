"""The mechanism: co-distillation's two readings against its lambda-0 control.

    python study/mechanism.py          # report.sh runs it

Reads the stage m ledgers of PneumoniaMNIST and RetinaMNIST (<dataset>/mechanism.runs.jsonl: the
chosen features and logits settings at skew 0 and 0.8, seeds 0-4, eval.diagnostics on;
<dataset>/mechanism-control.runs.jsonl: the same with lambda 0, which trains as local training
does but still pairs each client with a random teacher, so its diagnostics are what two clients'
feature spaces do when nothing pulls them together). Per dataset, skew and reading: test minority
accuracy (mean over clients, last 10 rounds), its difference from the control paired by seed with
a 95% t-interval (unadjusted: descriptive, outside the primary family), the same on the training
split (the audit), and the diagnostics: linear CKA with the teacher at rounds 1, 10 and 100 (the
ledger's diag_curves) and over the last 10 rounds, ||m - R|| / ||R||, and the term's share of the
gradient norm and of the loss. Writes study/mechanism.md and rewrites the block between the
mechanism markers of study/README.md.
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

DATASETS = {"pneumoniamnist": "PneumoniaMNIST", "retinamnist": "RetinaMNIST"}
SKEWS = (0.0, 0.8)
AT = (1, 10, 100)
READINGS = ("features", "logits", "control")


def reading(entry: dict) -> str:
    algorithm = entry["config"]["algorithm"]
    return "control" if algorithm["lambda"] == 0 else algorithm["share"]


def entries(dataset: str) -> list[dict]:
    out = []
    for stage in ("mechanism", "mechanism-control"):
        path = HERE / dataset / f"{stage}.runs.jsonl"
        out += list(load(path).values()) if path.exists() else []
    return out


def score(entry: dict, split: str = "test") -> float | None:
    view = entry["views"].get(split)
    return None if view is None else view["last10"]["scores"].get("minority_acc")


def paired(runs: dict[int, dict], control: dict[int, dict], split: str = "test") -> str:
    """mean of (reading - control) over the shared seeds, with its 95% t-interval."""
    seeds = sorted(s for s in runs if s in control and score(runs[s], split) is not None)
    diffs = [score(runs[s], split) - score(control[s], split) for s in seeds]
    if len(diffs) < 2:
        return "–"
    half = t_quantile(0.975, len(diffs) - 1) * float(np.std(diffs, ddof=1)) / math.sqrt(len(diffs))
    mean = float(np.mean(diffs))
    return f"{mean:+.3f} [{mean - half:+.3f}, {mean + half:+.3f}]"


def mean_of(values: list[float | None], digits: int = 2) -> str:
    v = np.array([x for x in values if x is not None], dtype=float)
    return "–" if not len(v) else f"{v.mean():.{digits}f}" + (f" ± {v.std(ddof=1):.{digits}f}" if len(v) > 1 else "")


def at_round(entry: dict, r: int) -> float | None:
    curve = entry.get("diag_curves", {}).get("cka_teacher")
    return curve[r - 1] if curve is not None and len(curve) >= r else None


def table(dataset: str) -> list[str]:
    got: dict[tuple[float, str], dict[int, dict]] = {}
    lambdas: dict[str, float] = {}
    for e in entries(dataset):
        key = (float(e["config"]["data"]["skew"]), reading(e))
        got.setdefault(key, {})[int(e["seed"])] = e
        lambdas[reading(e)] = e["config"]["algorithm"]["lambda"]
    if not got:
        return ["pending"]
    lines = [
        "| skew | reading (λ) | n | test minority acc | − control, paired [95%] | train-split minority acc "
        "| − control, train split | "
        + " | ".join(f"CKA r{r}" for r in AT)
        + " | CKA last 10 | ‖m − R‖/‖R‖ | grad share | loss share |",
        "|---|---|---|---|---|---|---|" + "---|" * len(AT) + "---|---|---|---|",
    ]
    for skew in SKEWS:
        control = got.get((skew, "control"), {})
        for name in READINGS:
            runs = got.get((skew, name))
            if not runs:
                continue
            rs = list(runs.values())
            last = [r["last10"] for r in rs]
            cells = [
                f"{skew:g}",
                f"{name} ({lambdas[name]:g})",
                str(len(rs)),
                mean_of([score(r) for r in rs], 3),
                "–" if name == "control" else paired(runs, control),
                mean_of([score(r, "train") for r in rs], 3),
                "–" if name == "control" else paired(runs, control, "train"),
                *(mean_of([at_round(r, a) for r in rs]) for a in AT),
                mean_of([m.get("diag/cka_teacher") for m in last]),
                mean_of([m.get("diag/r_distance") for m in last]),
                mean_of([m.get("diag/term_grad_share") for m in last]),
                mean_of([m.get("metrics/train_extra_share") for m in last]),
            ]
            lines.append("| " + " | ".join(cells) + " |")
        feats, logits = got.get((skew, "features"), {}), got.get((skew, "logits"), {})
        if feats and logits:
            lines.append(
                f"| {skew:g} | logits − features | | | {paired(logits, feats)} | | {paired(logits, feats, 'train')} |"
                + " |" * (len(AT) + 4)
            )
    return lines


def main() -> int:
    blocks = []
    for dataset, title in DATASETS.items():
        blocks += ["", f"### {title}", "", *table(dataset)]
    body = "\n".join(blocks).strip("\n")
    page = [
        "# The mechanism: written by mechanism.py from the stage m ledgers",
        "",
        "Co-distillation's two readings (the chosen λ of each) against its λ = 0 control, which trains",
        "exactly as local training does but still pairs each client with a random teacher, so its",
        "diagnostics are two clients' alignment when nothing pulls their features together. Mean ± sd",
        "over seeds 0-4; differences paired by seed with an unadjusted 95% t-interval. CKA: linear CKA",
        "of the client's and its teacher's features on 64 validation images, mean over clients, at",
        "rounds 1, 10, 100 and over the last 10 rounds; grad share = ||g_term|| / (||g_ce|| + ||g_term||);",
        "loss share = train_extra / train_loss. The control's ‖m − R‖/‖R‖ is computed against the R it",
        "received (features) though it does not train on it.",
        "",
        body,
        "",
    ]
    (HERE / "mechanism.md").write_text("\n".join(page))
    readme = HERE / "README.md"
    text = readme.read_text()
    block = "<!-- mechanism: begin (mechanism.py) -->\n" + body + "\n<!-- mechanism: end -->"
    new, n = re.subn(
        r"<!-- mechanism: begin \(mechanism\.py\) -->.*?<!-- mechanism: end -->", lambda _: block, text, flags=re.S
    )
    if n == 1:
        readme.write_text(new)
    print(f"written: {HERE / 'mechanism.md'}" + (f", {readme} (mechanism table)" if n == 1 else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
