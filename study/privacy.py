"""The privacy-utility table and plot, from the study's privacy stage (stage p).

    python study/privacy.py        # pneumoniamnist/report.sh runs it

Reads the stage's runs ledgers, pneumoniamnist/privacy-{off,shared,dpsgd}.runs.jsonl (report.sh
writes them from results/study/pneumoniamnist/privacy-*/*.h5; PneumoniaMNIST, 4 clients,
150 images per class, skew 0.8, seeds 0-4). Per run: test minority and balanced accuracy, the mean
over clients averaged over the last 10 rounds (mpicd.report's rule), the largest epsilon any
client had spent after the last round (/metrics/epsilon; local releases nothing: 0; privacy off:
infinity), the clients that stopped sharing (/metrics/privacy_stopped) and MPI bytes per round.
Per cell (method x epsilon): mean and sd over seeds, and the paired difference against local at
the same seed (mean, 95% t-interval, wins / ties / loses) for both metrics: local, which releases
nothing, is what a private method must beat to be worth its risk.
Writes pneumoniamnist/privacy.md, privacy.csv and privacy-utility.png.
"""

from __future__ import annotations

import csv
import math
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[0]
sys.path.insert(0, str(ROOT))

from mpicd.report.ledger import load, summaries  # noqa: E402
from mpicd.report.stats import t_quantile  # noqa: E402

LAST = 10
STAGES = ("privacy-off", "privacy-shared", "privacy-dpsgd")
METRICS = ("minority_acc", "balanced_acc")
ORDER = ("local", "codistill", "fedproto", "feddistill", "fedavg")
LABEL = {"fedavg": "fedavg (DP-SGD)"}


def run_rows(ledger: Path) -> list[dict]:
    """One row per finished run of a ledger: scores as mpicd.report scores them (last 10 rounds),
    the budget spent and the clients stopped at the last round (the ledger's ``final``)."""
    entries = load(ledger)
    rows = []
    for summary in summaries(ledger, LAST, "last", "test"):
        entry = entries[str(summary.path).rpartition("#")[2]]
        cell = summary.cell
        method = cell.method
        target = cell.get("privacy.epsilon")
        final = entry.get("final", {})
        spent_by_client = [v for v in final.get("metrics/epsilon", []) if v is not None]
        spent = max(spent_by_client) if spent_by_client else math.nan
        stopped_clients = sum(1 for v in final.get("metrics/privacy_stopped", []) if v is not None and v > 0)
        private = isinstance(target, (int, float)) and not isinstance(target, bool)
        epsilon = float(target) if private else (0.0 if method == "local" else math.inf)
        if not private:
            spent = epsilon
        rows.append(
            {
                "method": method,
                "epsilon": epsilon,
                "seed": summary.seed,
                "spent": spent,
                "stopped": stopped_clients,
                "bytes": summary.mpi_bytes_per_round,
                "collapsed": summary.collapsed,
                **{m: float(summary.scores[m]) for m in METRICS},
                "path": f"{ledger.name}#{entry['name']}",
            }
        )
    return rows


def paired(values: dict[int, float], reference: dict[int, float]) -> tuple[float, float, float, int]:
    seeds = sorted(set(values) & set(reference))
    diffs = [values[s] - reference[s] for s in seeds]
    if len(diffs) < 2:
        return (float(np.mean(diffs)) if diffs else math.nan, math.nan, math.nan, len(diffs))
    mean, sd = float(np.mean(diffs)), float(np.std(diffs, ddof=1))
    half = t_quantile(0.975, len(diffs) - 1) * sd / math.sqrt(len(diffs))
    return mean, mean - half, mean + half, len(diffs)


def verdict(lo: float, hi: float) -> str:
    return "–" if math.isnan(lo) else "wins" if lo > 0 else "loses" if hi < 0 else "ties"


def eps_text(e: float) -> str:
    return "∞" if math.isinf(e) else f"{e:g}"


def main() -> int:
    ledgers = [HERE / "pneumoniamnist" / f"{stage}.runs.jsonl" for stage in STAGES]
    rows = [r for ledger in ledgers if ledger.exists() for r in run_rows(ledger)]
    if not rows:
        print("privacy.py: no finished privacy-stage runs yet", file=sys.stderr)
        return 0
    local = {m: {r["seed"]: r[m] for r in rows if r["method"] == "local"} for m in METRICS}
    cells: dict[tuple[str, float], list[dict]] = {}
    for r in rows:
        cells.setdefault((r["method"], r["epsilon"]), []).append(r)
    keys = sorted(cells, key=lambda k: (ORDER.index(k[0]) if k[0] in ORDER else 99, -k[1] if k[0] != "local" else 0))
    out = []
    for method, eps in keys:
        runs = cells[method, eps]
        entry = {
            "method": LABEL.get(method, method) if math.isfinite(eps) and eps > 0 else method,
            "algorithm": method,
            "epsilon": eps_text(eps),
            "seeds": len(runs),
            "spent_max": max(r["spent"] for r in runs),
            "clients_stopped": sum(r["stopped"] for r in runs),
            "bytes_per_round": float(np.mean([r["bytes"] for r in runs])),
            "collapsed_runs": sum(r["collapsed"] for r in runs),
        }
        for m in METRICS:
            values = [r[m] for r in runs]
            entry[f"{m}_mean"] = float(np.mean(values))
            entry[f"{m}_sd"] = float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
            if method != "local":
                mean, lo, hi, n = paired({r["seed"]: r[m] for r in runs}, local[m])
                entry.update({f"{m}_vs_local": mean, f"{m}_vs_local_lo": lo, f"{m}_vs_local_hi": hi, f"{m}_pairs": n})
        out.append(entry)
    write(out, rows)
    return 0


def write(out: list[dict], rows: list[dict]) -> None:
    lines = [
        "# Privacy-utility (study stage p): PneumoniaMNIST, 4 clients, 150 images per class, skew 0.8",
        "",
        f"Written by `study/privacy.py` from {len(rows)} finished runs. Test split, mean over clients, "
        f"last {LAST} rounds; mean ± sd over seeds; against local paired by seed (95% t-interval). ε is per client "
        "over the whole run at δ = 1e-5 (the largest any client had spent is the 'spent' column); local releases "
        "nothing (ε = 0); ∞ = privacy off. Clip C = 1, q = 1, counts noised (co-distillation, FedProto, FedDistill: "
        "σ derived for every planned release); FedAvg: DP-SGD, σ in pneumoniamnist/privacy-dpsgd.yaml.",
        "",
        "| method | ε | seeds | ε spent (max) | minority acc | balanced acc | minority − local [95%] | verdict |"
        " balanced − local [95%] | verdict | bytes/round/rank | clients stopped |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for e in out:
        spent = eps_text(e["spent_max"]) if math.isinf(e["spent_max"]) else f"{e['spent_max']:.3f}"
        cells = [e["method"], e["epsilon"], str(e["seeds"]), spent]
        cells += [f"{e[f'{m}_mean']:.3f} ± {e[f'{m}_sd']:.3f}" for m in METRICS]
        for m in METRICS:
            if f"{m}_vs_local" in e:
                lo, hi = e[f"{m}_vs_local_lo"], e[f"{m}_vs_local_hi"]
                cells += [f"{e[f'{m}_vs_local']:+.3f} [{lo:+.3f}, {hi:+.3f}]", verdict(lo, hi)]
            else:
                cells += ["(reference)", ""]
        cells += [f"{e['bytes_per_round']:,.0f}", str(e["clients_stopped"])]
        lines.append("| " + " | ".join(cells) + " |")
    collapsed = sum(e["collapsed_runs"] for e in out)
    if collapsed:
        note = "had every client predict a single class (degenerate: their scores carry no comparison)"
        lines += ["", f"{collapsed} run(s) {note}."]
    (HERE / "pneumoniamnist" / "privacy.md").write_text("\n".join(lines) + "\n")
    with open(HERE / "pneumoniamnist" / "privacy.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=sorted({k for e in out for k in e}))
        writer.writeheader()
        writer.writerows(out)
    plot(out)
    print("\n".join(lines))


def plot(out: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    finite = sorted({float(e["epsilon"]) for e in out if e["epsilon"] not in ("∞", "0")})
    where = {**{eps_text(x): x for x in finite}, "∞": (max(finite) * 4 if finite else 1.0)}
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, m in zip(axes, METRICS):
        for e in out:
            if e["algorithm"] == "local":
                ax.axhspan(e[f"{m}_mean"] - e[f"{m}_sd"], e[f"{m}_mean"] + e[f"{m}_sd"], color="grey", alpha=0.2)
                ax.axhline(e[f"{m}_mean"], color="grey", label="local (ε = 0)")
        for method in dict.fromkeys(e["algorithm"] for e in out if e["algorithm"] != "local"):
            points = sorted(
                (where[e["epsilon"]], e[f"{m}_mean"], e[f"{m}_sd"]) for e in out if e["algorithm"] == method
            )
            x, y, sd = (np.array(v) for v in zip(*points))
            ax.errorbar(x, y, yerr=sd, marker="o", capsize=3, label=LABEL.get(method, method))
        ax.set_xscale("log")
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.set_xticks(list(where.values()), list(where))
        ax.set_xlabel("ε per client over the run (δ = 1e-5)")
        ax.set_ylabel(f"test {m.replace('_', ' ')} (last {LAST} rounds)")
    axes[0].legend(fontsize=8)
    fig.suptitle("PneumoniaMNIST, 4 clients, skew 0.8, 5 seeds: privacy against utility")
    fig.tight_layout()
    fig.savefig(HERE / "pneumoniamnist" / "privacy-utility.png", dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
