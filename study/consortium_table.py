"""The consortium's answer from the runs ledgers: which method protects the minority class, at what cost.

    python study/consortium_table.py      # report.sh runs it; writes consortium.md, consortium.csv,
                                          # consortium-pareto.png and README.md's consortium block

One table per dataset and skew (0.8, 0.9): per method, the bytes a client moves per round, (sent +
received) / 2 as every mpicd table counts them (the ledger's bytes_per_round: the mean over rounds and
clients of /metrics/bytes_*, which are per client however many clients share a rank), held-out minority
and balanced accuracy (test split, mean over clients of the last 10 rounds; mean over the 10 seeds with
its 95% t-interval), the personalised score (personal_acc: each client's test recalls weighted by its
training class mix), and the verdict against FedAvg and against local training with the balanced
sampler (0 bytes): paired by seed, two-sided t-test, Holm over the stage's whole family (every row
against both references in every cell; a comparison not measured yet counts as p = 1), wins / loses at
adjusted p < 0.05. The last round alone is a secondary table (CCVR recalibrates in the last round only,
so its last-10 mean is nine tenths FedAvg's), never counted in a verdict. The paragraph a hospital can
act on (advice: what holds in every cell, each clause read off the verdicts against FedAvg), the
cell-by-cell sentences and the moonshot's answer are generated from the same numbers, so they cannot
drift from the table; the block holding them is written into README.md and docs/explanation/study.md.

Rows come from the main grid's ledgers (main-high: FedAvg, local, co-distillation's two readings,
FedProto, FedDistill, FedAMP; the same configs and seeds) and the consortium stage's (consortium.py).
FedRoD's runs give two rows: its personalised prediction (generic + personal head, its /metrics) and its
generic model alone (/metrics/generic_*). FedNTD has no row: with two classes it is FedAvg bit for bit
(tests/algorithms/test_fedntd.py).
"""

from __future__ import annotations

import csv
import json
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml
from scipy import stats

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from summary import between, holm, pvalue  # noqa: E402  (the study's Holm and paired p, one copy)

DATASETS = {"retinamnist": "RetinaMNIST", "pneumoniamnist": "PneumoniaMNIST"}
SKEWS = (0.8, 0.9)
SEEDS = tuple(range(10))
ALPHA = 0.05
STAGES = ("main-high", "consortium", "consortium-sampler", "consortium-moonshot", "consortium-references")
REFERENCES = ("FedAvg", "local + balanced sampler")
MOONSHOT_BYTES = 1024
PENDING = "pending"  # a row missing some of its 10 seeds shows no score (summary.py's whole cells: no number
# read off a cell's first seeds)


@dataclass
class Row:
    """One method's runs in one cell (dataset, skew): seed -> the run's ledger line."""

    label: str
    runs: dict[int, dict] = field(default_factory=dict)
    generic: bool = False  # FedRoD's generic model (the body and balanced-softmax head, without the personal head)
    reruns: dict[int, dict] = field(default_factory=dict)  # seed -> its consortium-references re-run (k3)

    def scores(self, metric: str) -> np.ndarray:
        if metric == "personal_acc" and self.reruns:  # the main grid's ledgers predate personal_acc: k3's
            return np.array(
                [_nan(r["views"]["test"]["last10"]["scores"].get(metric)) for _, r in sorted(self.reruns.items())]
            )
        if self.generic:  # /metrics/generic_*: the ledger's last-10 mean over rounds and clients
            return np.array([_nan(r["last10"].get(f"metrics/generic_{metric}")) for _, r in sorted(self.runs.items())])
        return np.array(
            [_nan(r["views"]["test"]["last10"]["scores"].get(metric)) for _, r in sorted(self.runs.items())]
        )

    def last_round(self, metric: str) -> np.ndarray:
        if self.generic:  # the ledger keeps no per-round curve of the generic scores
            return np.full(len(self.runs), math.nan)
        return np.array([_nan(r["curves"][metric][-1]) for _, r in sorted(self.runs.items())])

    def bytes_per_client(self) -> float:
        """The ledger's bytes_per_round: the mean over rounds and clients of each client's (sent + received)
        / 2 in /metrics/bytes_* (per client, however many clients share a rank)."""
        return float(np.mean([r["bytes_per_round"] for r in self.runs.values()]))

    @property
    def whole(self) -> bool:
        return set(self.runs) == set(SEEDS)


def _nan(value) -> float:
    return math.nan if value is None else float(value)


def label(config: dict) -> str:
    """A method row's name from a run's config: the algorithm (and its reading), its tuned parameter,
    and the training options that differ from the main grid's (sampler, loss)."""
    algo, train = config["algorithm"], config["train"]
    name = {
        "fedavg": "FedAvg",
        "local": "local",
        "fedproto": "FedProto",
        "feddistill": "FedDistill",
        "fedamp": "FedAMP",
        "fedlc": f"FedLC (tau {algo.get('tau')})",
        "fedrs": f"FedRS (alpha {algo.get('alpha')})",
        "fedrod": "FedRoD",
        "ccvr": f"CCVR (lr {algo.get('calibration_lr')})",
        "centralized": "centralized",
    }.get(algo["name"])
    if algo["name"] == "codistill":
        name = f"co-distillation, {algo.get('share', 'features')}"
    options = [
        f"balanced {k}" for k, v in (("sampler", train.get("sampler")), ("loss", train.get("loss"))) if v == "balanced"
    ]
    return " + ".join([name, *options])


def load(dataset: str) -> dict[float, dict[str, Row]]:
    """skew -> label -> Row, from every stage's ledger that exists; FedAvg's and local's personal score
    from consortium-references (the main grid's ledgers predate personal_acc)."""
    cells: dict[float, dict[str, Row]] = {s: {} for s in SKEWS}
    reruns: dict[tuple[float, str], dict[int, dict]] = {}
    for stage in STAGES:
        path = HERE / dataset / f"{stage}.runs.jsonl"
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            run = json.loads(line)
            skew, seed = run["config"]["data"]["skew"], run["config"]["seed"]
            if skew not in cells or seed not in SEEDS or run["config"]["algorithm"]["name"] == "centralized":
                continue
            name = label(run["config"])
            if stage == "consortium-references":
                reruns.setdefault((skew, name), {})[seed] = run
                continue
            cells[skew].setdefault(name, Row(name)).runs[seed] = run
            if run["config"]["algorithm"]["name"] == "fedrod":  # its generic model is a row of its own
                generic = f"{name} (generic model)"
                cells[skew].setdefault(generic, Row(generic, generic=True)).runs[seed] = run
    for (skew, name), runs in reruns.items():
        row = cells[skew].get(name)
        if row is not None:
            row.reruns = runs
    return cells


def interval(values: np.ndarray) -> tuple[float, float, float]:
    """(mean, low, high): the 95% t-interval over seeds (NaN where fewer than two)."""
    values = values[~np.isnan(values)]
    if len(values) < 2:
        return (float(values.mean()) if len(values) else math.nan, math.nan, math.nan)
    half = stats.t.ppf(0.975, len(values) - 1) * values.std(ddof=1) / math.sqrt(len(values))
    return float(values.mean()), float(values.mean() - half), float(values.mean() + half)


def paired(
    row: Row, ref: Row, metric: str = "minority_acc", last_round: bool = False
) -> tuple[np.ndarray, float] | None:
    """Row minus reference, paired by seed, and the two-sided paired t-test's p; None unless both are whole."""
    if not (row.whole and ref.whole):
        return None
    get = (lambda r: r.last_round(metric)) if last_round else (lambda r: r.scores(metric))
    diffs = get(row) - get(ref)
    return diffs, pvalue(diffs)


def verdicts(all_cells: dict) -> dict[tuple[str, float, str, str], dict]:
    """(dataset, skew, row, reference) -> diff mean, interval, p, Holm p, verdict; over the whole family."""
    family = []
    for dataset, cells in all_cells.items():
        for skew, rows in cells.items():
            for ref in REFERENCES:
                for name, row in rows.items():
                    if name == ref:
                        continue
                    got = paired(row, rows[ref]) if ref in rows else None
                    family.append(((dataset, skew, name, ref), got))
    adjusted = holm([1.0 if got is None else got[1] for _, got in family])
    out = {}
    for (key, got), p_holm in zip(family, adjusted):
        if got is None:
            out[key] = {"verdict": "pending"}
            continue
        diffs, p = got
        mean, low, high = interval(diffs)
        verdict = "ties" if p_holm >= ALPHA else "wins" if mean > 0 else "loses"
        out[key] = {"diff": mean, "low": low, "high": high, "p": p, "p_holm": p_holm, "verdict": verdict}
    out["_family"] = len(family)
    return out


def fmt(mean: float, low: float, high: float) -> str:
    if math.isnan(mean):
        return "–"
    return f"{mean:.3f}" if math.isnan(low) else f"{mean:.3f} [{low:.3f}, {high:.3f}]"


def fmt_verdict(v: dict) -> str:
    if v["verdict"] == "pending":
        return "pending"
    return f"{v['verdict']} ({v['diff']:+.3f} [{v['low']:+.3f}, {v['high']:+.3f}], Holm p {v['p_holm']:.2g})"


def order(rows: dict[str, Row]) -> list[str]:
    """References first, then by bytes per client, then name."""
    return sorted(
        rows,
        key=lambda n: (
            n not in REFERENCES,
            REFERENCES.index(n) if n in REFERENCES else 0,
            rows[n].bytes_per_client(),
            n,
        ),
    )


def table(dataset: str, skew: float, rows: dict[str, Row], v: dict) -> list[str]:
    lines = [
        f"### {DATASETS[dataset]}, skew {skew}",
        "",
        "| method | bytes / client / round | minority acc | balanced acc | personalised acc | vs FedAvg "
        "| vs local + balanced sampler | seeds |",
        "|---|---:|---|---|---|---|---|---:|",
    ]
    for name in order(rows):
        row = rows[name]
        cols = [
            name,
            f"{row.bytes_per_client():,.0f}",
            *(
                fmt(*interval(row.scores(m))) if row.whole else PENDING
                for m in ("minority_acc", "balanced_acc", "personal_acc")
            ),
            *("(reference)" if name == ref else fmt_verdict(v[(dataset, skew, name, ref)]) for ref in REFERENCES),
            str(len(row.runs)),
        ]
        lines.append("| " + " | ".join(cols) + " |")
    return lines


def last_round_table(dataset: str, skew: float, rows: dict[str, Row]) -> list[str]:
    lines = [
        f"| method ({DATASETS[dataset]}, skew {skew}) | minority acc, last round | − FedAvg, last round (unadjusted) |",
        "|---|---|---|",
    ]
    for name in order(rows):
        got = paired(rows[name], rows["FedAvg"], last_round=True) if "FedAvg" in rows and name != "FedAvg" else None
        diff = "–" if got is None else "{:+.3f} [{:+.3f}, {:+.3f}]".format(*interval(got[0]))
        score = fmt(*interval(rows[name].last_round("minority_acc"))) if rows[name].whole else PENDING
        lines.append(f"| {name} | {score} | {diff} |")
    return lines


def paragraph(all_cells: dict, v: dict) -> list[str]:
    """The sentences a hospital can act on, each read off the table."""
    out = []
    for dataset, cells in all_cells.items():
        for skew, rows in cells.items():
            if "FedAvg" not in rows or not rows["FedAvg"].whole:
                out.append(f"- {DATASETS[dataset]}, skew {skew}: pending.")
                continue
            fedavg = interval(rows["FedAvg"].scores("minority_acc"))[0]
            keep = [n for n in rows if n != "FedAvg" and v[(dataset, skew, n, "FedAvg")]["verdict"] in ("ties", "wins")]
            beat = [n for n in keep if v[(dataset, skew, n, "FedAvg")]["verdict"] == "wins"]
            pending = [n for n in rows if n != "FedAvg" and v[(dataset, skew, n, "FedAvg")]["verdict"] == "pending"]
            lose = len(rows) - 1 - len(keep) - len(pending)
            if keep:
                cheapest = min(keep, key=lambda n: rows[n].bytes_per_client())
                said = (
                    (f"{len(beat)} beat it ({', '.join(beat)}), " if beat else "none beats it, ")
                    + f"{len(keep) - len(beat)} tie it ({', '.join(n for n in keep if n not in beat)}); the cheapest of those is "
                )
                said += f"{cheapest} at {rows[cheapest].bytes_per_client():,.0f} bytes a client a round"
            else:
                said = "no method ties or beats it"
            out.append(
                f"- {DATASETS[dataset]}, skew {skew}: FedAvg keeps {fedavg:.3f} held-out minority accuracy "
                f"({rows['FedAvg'].bytes_per_client():,.0f} bytes a client a round); after Holm, {said}; "
                f"{lose} lose to it" + (f"; {len(pending)} pending" if pending else "") + "."
            )
    return out


def method(name: str) -> str:
    """A row's method without its tuned value: 'FedLC (tau 10.0) + balanced sampler' -> 'FedLC + balanced sampler'."""
    return re.sub(r" \((?:tau|alpha|lr) [^)]*\)", "", name)


def span(values) -> str:
    low, high = min(values), max(values)
    return f"{low:.3f}" if f"{low:.3f}" == f"{high:.3f}" else f"{low:.3f} to {high:.3f}"


def advice(all_cells: dict, v: dict) -> list[str]:
    """One paragraph over every cell (dataset, skew), each clause read off the verdicts against FedAvg."""
    cells = [(d, s, rows) for d, by_skew in all_cells.items() for s, rows in by_skew.items()]
    if any(
        "FedAvg" not in rows or any(v[(d, s, n, "FedAvg")]["verdict"] == "pending" for n in rows if n != "FedAvg")
        for d, s, rows in cells
    ):
        return ["The paragraph is written once every cell holds all its seeds."]
    got: dict[str, list] = {}  # method -> [(cell, verdict against FedAvg, bytes a client a round)]
    for d, s, rows in cells:
        for n in rows:
            if n != "FedAvg":
                got.setdefault(method(n), []).append(((d, s), v[(d, s, n, "FedAvg")], rows[n].bytes_per_client()))
    fedavg_bytes = [rows["FedAvg"].bytes_per_client() for _, _, rows in cells]
    every = [m for m, g in got.items() if len(g) == len(cells)]
    wins = [m for m, g in got.items() if any(x["verdict"] == "wins" for _, x, _ in g)]
    ties = [m for m in every if all(x["verdict"] == "ties" for _, x, _ in got[m])]
    mixed = [m for m in every if m not in ties and m not in wins and any(x["verdict"] == "ties" for _, x, _ in got[m])]
    cheap = [m for m, g in got.items() if max(b for *_, b in g) <= MOONSHOT_BYTES]
    costly_losers = [m for m in every if m not in cheap and all(x["verdict"] == "loses" for _, x, _ in got[m])]
    where = " and ".join(sorted({DATASETS[d] for d, _, _ in cells}))
    skews = " and ".join(str(s) for s in sorted({s for _, s, _ in cells}))

    def behind(ms):
        return span([-x["diff"] for m in ms for _, x, _ in got[m]])

    text = f"Over {where} at skew {skews} ({len(cells)} cells, 10 seeds each, Holm over the stage's family), "
    text += (
        "no method beats FedAvg's held-out minority accuracy in any cell. "
        if not wins
        else f"{'; '.join(wins)} {'beats' if len(wins) == 1 else 'beat'} FedAvg's held-out minority accuracy in "
        "at least one cell. "
    )
    if ties:
        tie_bytes = [b for m in ties for *_, b in got[m]]
        text += (
            f"Tied with it in every cell: {'; '.join(ties)}, at {min(tie_bytes):,.0f} to {max(tie_bytes):,.0f} bytes "
            f"a client a round against FedAvg's {min(fedavg_bytes):,.0f} to {max(fedavg_bytes):,.0f}"
        )
        text += (
            ": none sends less than FedAvg, so none is a reason on this measure to move from it. "
            if min(tie_bytes) >= min(fedavg_bytes)
            else ". "
        )
    if mixed:
        parts = [
            f"{m} (loses at {', '.join(f'{DATASETS[d]} {s}' for (d, s), x, _ in got[m] if x['verdict'] == 'loses')})"
            for m in mixed
        ]
        text += f"Tied in some cells, behind in the others: {'; '.join(parts)}. "
    if cheap and all(x["verdict"] == "loses" for m in cheap for _, x, _ in got[m]):
        text += (
            f"Every method that sends at most {MOONSHOT_BYTES:,} bytes a client a round loses to it in every cell it "
            f"ran in ({'; '.join(cheap)}), behind by {behind(cheap)} in minority accuracy"
        )
        if "local + balanced sampler" in cheap:
            text += f" (local training with the balanced sampler: {behind(['local + balanced sampler'])})"
        text += ". "
    elif cheap:
        held = sorted({m for m in cheap for _, x, _ in got[m] if x["verdict"] != "loses"})
        text += (
            f"Of the methods that send at most {MOONSHOT_BYTES:,} bytes a client a round, {'; '.join(held)} tie or "
            "beat it in some cell. "
        )
    if costly_losers:
        text += f"Costlier and behind in every cell: {'; '.join(costly_losers)} (by {behind(costly_losers)}). "
    best = []
    for d, s, rows in cells:
        scored = {n: interval(r.scores("personal_acc"))[0] for n, r in rows.items()}
        scored = {n: x for n, x in scored.items() if x == x}
        top = max(scored, key=scored.get)
        best.append(f"{DATASETS[d]} {s}: {top} {scored[top]:.3f} (FedAvg {scored['FedAvg']:.3f})")
    text += (
        "On the personalised score (each client's test recalls weighted by its own training mix; descriptive, "
        "no test) the highest is " + "; ".join(best) + "."
    )
    return [text]


def reproduction(all_cells: dict) -> list[str]:
    """k3's re-runs against their main-grid twins (same config and seed): how many equal it in every stored
    curve and last-10 score the two ledgers share, and by how much the others differ, per method. A layout
    changes no result of local training; FedAvg's float32 Allreduce (reduction: mpi) sums in another order
    on 2 ranks than on 4, so it agrees to float32 rounding only (docs/explanation/clients-per-rank.md)."""
    out = []
    for dataset, cells in all_cells.items():
        parts, models, layouts = [], set(), set()
        for name in sorted({n for rows in cells.values() for n, r in rows.items() if r.reruns}):
            equal = pairs = 0
            largest = 0.0
            for rows in cells.values():
                row = rows.get(name)
                for seed, again in sorted(row.reruns.items()) if row else ():
                    twin = row.runs.get(seed)
                    if twin is None or twin.get("cpu") != again.get("cpu"):
                        continue
                    pairs += 1
                    models.update(twin.get("cpu") or ["an unrecorded CPU"])
                    layouts.add((twin.get("ranks"), again.get("ranks")))
                    a, b = twin["views"]["test"]["last10"]["scores"], again["views"]["test"]["last10"]["scores"]
                    shared = set(a) & set(b)
                    curves = set(twin["curves"]) & set(again["curves"])
                    same = all(a[k] == b[k] for k in shared) and all(
                        twin["curves"][k] == again["curves"][k] for k in curves
                    )
                    equal += same
                    largest = max(largest, abs(_nan(a.get("minority_acc")) - _nan(b.get("minority_acc"))))
            said = f"{name} {equal} of {pairs} equal bit for bit"
            parts.append(
                said + (f" (largest difference in last-10 minority accuracy {largest:.4f})" if equal < pairs else "")
            )
        if parts:
            ranks = "; ".join(f"twin on {t} ranks, re-run on {r}" for t, r in sorted(layouts, key=str))
            out.append(
                f"- {DATASETS[dataset]}: {'; '.join(parts)}. Every pair on one CPU model "
                f"({', '.join(sorted(models))}); {ranks}."
            )
    return out


def moonshot(all_cells: dict, v: dict) -> list[str]:
    """Does a method of at most 1 KB per client per round tie or beat FedAvg's minority accuracy at skew 0.8?"""
    out = []
    for dataset, cells in all_cells.items():
        rows = cells[0.8]
        chosen_path = HERE / dataset / "consortium-chosen.yaml"
        pick = yaml.safe_load(chosen_path.read_text())["moonshot"]["pick"] if chosen_path.exists() else None
        line = f"- {DATASETS[dataset]}: validation's pick was {pick or 'not made yet'}. "
        if "FedAvg" not in rows or not rows["FedAvg"].whole:
            out.append(line + "Not measured yet.")
            continue
        cheap = [n for n in rows if n != "FedAvg" and rows[n].whole and rows[n].bytes_per_client() <= MOONSHOT_BYTES]
        held = [n for n in cheap if v[(dataset, 0.8, n, "FedAvg")]["verdict"] in ("ties", "wins")]
        closest = max(cheap, key=lambda n: v[(dataset, 0.8, n, "FedAvg")]["diff"], default=None)
        if not cheap:
            line += "Not measured yet."
        elif held:
            line += (
                "Tie or beat FedAvg after Holm: "
                + "; ".join(
                    f"{n} ({fmt_verdict(v[(dataset, 0.8, n, 'FedAvg')])}, {rows[n].bytes_per_client():,.0f} bytes)"
                    for n in held
                )
                + "."
            )
        else:
            line += (
                f"None of the {len(cheap)} methods at or under {MOONSHOT_BYTES} bytes ties or beats FedAvg after Holm; "
                f"the closest is {closest}: {fmt_verdict(v[(dataset, 0.8, closest, 'FedAvg')])}."
            )
        out.append(line)
    return out


def pareto(all_cells: dict, path: Path) -> None:
    """One panel per dataset and skew: each method at its bytes per client per round (log) against its
    held-out minority accuracy with the 95% interval. A method keeps one colour and marker in every panel
    (the legend names it without its tuned value, which the tables give); methods at the same cost (within
    5%) are drawn side by side, a few points apart, so that ties stay visible."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import transforms

    families = []
    for cells in all_cells.values():
        for skew in SKEWS:
            for name in order(cells[skew]):
                if method(name) not in families:
                    families.append(method(name))
    palette = plt.get_cmap("tab20")
    markers = "osD^vP*X<>hp"
    style = {m: (palette(k % 20), markers[k % len(markers)]) for k, m in enumerate(families)}
    fig, axes = plt.subplots(
        len(all_cells), len(SKEWS), figsize=(6 * len(SKEWS), 4.4 * len(all_cells) + 1.6), squeeze=False
    )
    floor = 1.0  # 0 bytes (local training) drawn at 1 byte on the log axis, labelled 0
    handles = {}
    for i, (dataset, cells) in enumerate(all_cells.items()):
        for j, skew in enumerate(SKEWS):
            ax = axes[i][j]
            shown = [n for n in order(cells[skew]) if cells[skew][n].whole]
            at = {n: max(cells[skew][n].bytes_per_client(), floor) for n in shown}
            spans = [interval(cells[skew][n].scores("minority_acc")) for n in shown]
            if spans:  # drawn through an offset transform, the points do not move the axis limits
                low, high = min(sp[1] for sp in spans), max(sp[2] for sp in spans)
                ax.set_ylim(low - 0.05 * (high - low), high + 0.05 * (high - low))
            for name in shown:
                x = at[name]
                group = [n for n in shown if abs(math.log(at[n] / x)) < math.log(1.05)]
                dodge = (group.index(name) - (len(group) - 1) / 2) * 3.0  # points
                where = transforms.offset_copy(ax.transData, fig=fig, x=dodge, y=0, units="points")
                mean, low, high = interval(cells[skew][name].scores("minority_acc"))
                colour, marker = style[method(name)]
                drawn = ax.errorbar(
                    [x],
                    [mean],
                    yerr=[[mean - low], [high - mean]],
                    fmt=marker,
                    color=colour,
                    ms=5,
                    capsize=2,
                    lw=1,
                    transform=where,
                )
                handles.setdefault(method(name), drawn)
            ax.set_xscale("log")
            ax.set_xlim(0.5, 2e6)
            ticks = [1, 10, 100, 1e3, 1e4, 1e5, 1e6]
            ax.set_xticks(ticks, ["0"] + [f"{t:g}" for t in ticks[1:]])
            ax.axvline(MOONSHOT_BYTES, color="grey", lw=0.6, ls=":")
            ax.set_title(f"{DATASETS[dataset]}, skew {skew}")
            ax.set_xlabel("bytes per client per round (log; 0 drawn at 1; dotted: 1 KB)")
            ax.set_ylabel("held-out minority accuracy (95% CI, 10 seeds)")
    fig.legend(
        [handles[m] for m in families if m in handles],
        [m for m in families if m in handles],
        loc="lower center",
        ncol=4,
        fontsize=8,
        frameon=False,
    )
    fig.text(
        0.5,
        0.005,
        "methods at the same cost (within 5%) are drawn 3 points apart, left to right in the tables' order",
        ha="center",
        fontsize=7,
        color="grey",
    )
    fig.tight_layout(rect=(0, 1.5 / (4.4 * len(all_cells) + 1.6), 1, 1))
    fig.savefig(path, dpi=130)
    plt.close(fig)


def write_csv(all_cells: dict, v: dict, path: Path) -> None:
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(
            [
                "dataset",
                "skew",
                "method",
                "seeds",
                "bytes_per_client_round",
                "minority_acc",
                "minority_low",
                "minority_high",
                "balanced_acc",
                "personal_acc",
                "vs_fedavg",
                "vs_fedavg_diff",
                "vs_fedavg_p_holm",
                "vs_local_balanced",
                "vs_local_balanced_diff",
                "vs_local_balanced_p_holm",
            ]
        )
        for dataset, cells in all_cells.items():
            for skew, rows in cells.items():
                for name in order(rows):
                    row = rows[name]
                    if not row.whole:  # no score off a cell's first seeds
                        continue
                    m = interval(row.scores("minority_acc"))
                    refs = []
                    for ref in REFERENCES:
                        got = {"verdict": "reference"} if name == ref else v[(dataset, skew, name, ref)]
                        refs += [got["verdict"], got.get("diff", ""), got.get("p_holm", "")]
                    out.writerow(
                        [
                            dataset,
                            skew,
                            name,
                            len(row.runs),
                            round(row.bytes_per_client(), 1),
                            *m,
                            interval(row.scores("balanced_acc"))[0],
                            interval(row.scores("personal_acc"))[0],
                            *refs,
                        ]
                    )


def page(all_cells: dict, v: dict) -> tuple[str, list[str]]:
    summary = [
        "**What a hospital consortium can act on** (generated from the stage's tables, study/consortium.md):",
        "",
        *advice(all_cells, v),
        "",
        "Cell by cell:",
        "",
        *paragraph(all_cells, v),
        "",
        "**The moonshot** (at most 1 KB per client per round, skew 0.8):",
        "",
        *moonshot(all_cells, v),
    ]
    lines = [
        "# The consortium's answer: which method protects the minority class, at what cost",
        "",
        "Written by `study/consortium_table.py` from the runs ledgers (do not edit by hand); its docstring says",
        "how every column is computed. Plot: [consortium-pareto.png](consortium-pareto.png); numbers:",
        "[consortium.csv](consortium.csv).",
        "",
        *summary,
        "",
        f"Holm over the whole family of {v['_family']} comparisons (every row against both references in every cell).",
        "FedRoD gives two rows: its personalised prediction (generic + personal head) and its generic model alone.",
        "FedNTD has no row: with two classes its not-true distribution has one class, so its term is 0 and it is",
        "FedAvg bit for bit (tests/algorithms/test_fedntd.py); both datasets here are binary.",
        "",
        "**k3's re-runs against the main grid** (FedAvg and local training re-run for the personalised score, same",
        "config and seed as their main-grid twin; pairs on different CPU models are not compared). A layout changes",
        "no result of local training; FedAvg's float32 Allreduce sums in another order on another layout, so there",
        "it agrees to float32 rounding only (docs/explanation/clients-per-rank.md):",
        "",
        *reproduction(all_cells),
        "",
    ]
    for dataset, cells in all_cells.items():
        for skew, rows in cells.items():
            lines += [*table(dataset, skew, rows, v), ""]
    lines += ["## The last round alone (secondary: CCVR recalibrates in it; no verdict)", ""]
    for dataset, cells in all_cells.items():
        for skew, rows in cells.items():
            lines += [*last_round_table(dataset, skew, rows), ""]
    return "\n".join(lines), summary


def main() -> int:
    all_cells = {d: load(d) for d in DATASETS}
    v = verdicts(all_cells)
    text, summary = page(all_cells, v)
    (HERE / "consortium.md").write_text(text)
    write_csv(all_cells, v, HERE / "consortium.csv")
    pareto(all_cells, HERE / "consortium-pareto.png")
    findings = HERE.parent / "docs" / "explanation" / "study.md"  # the docs' findings page: the same block
    for page_with_block in (HERE / "README.md", findings):
        if page_with_block == findings and not findings.exists():
            continue  # a copy of study/ alone (the tests') has no docs page
        try:
            text = between(page_with_block.read_text(), "consortium", "\n".join(summary), "consortium_table.py")
        except ValueError as err:
            print(f"consortium_table.py: {page_with_block}: {err}", file=sys.stderr)
            return 2
        page_with_block.write_text(text)
    print(
        f"written: {HERE / 'consortium.md'}, consortium.csv, consortium-pareto.png, the consortium blocks of "
        f"README.md and {findings}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
