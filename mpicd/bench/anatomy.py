"""Figures from the jobs' results files: the round's parts per algorithm, mpicd against the bare loop,
parallel against serial, the start-up phases, the network fit and the compute per round.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np

from mpicd.bench.harness import ALGORITHMS, ROOT, BenchError, run_job, Settings, stats
from mpicd.bench.net import fit
from mpicd.results.reader import Results
from mpicd.run.runner import STARTUP_PHASES


def _round_parts(path: Path) -> dict[str, np.ndarray]:
    """(rounds after the warm-up, ranks) seconds of each part of the round."""
    m = Results(path).metrics
    return {part: np.asarray(m[f"{part}_seconds"][1:], dtype=float) for part in ("train", "comm", "eval", "write")}


def anatomy(folder: Path, s: Settings) -> tuple[dict, dict, dict]:
    """Per algorithm: mean seconds per round and rank of each part, over repeats; the fractions.

    ``comm_io_fraction`` = (comm + write) / round, means over ranks: what a rank spends in MPI and
    in the results write, waiting for slower ranks included. ``comm_io_own_fraction`` takes, each
    round, the rank that waited least (the last to arrive: its comm and write seconds are the
    transfer and the writing themselves): the cost of communicating and writing without the
    imbalance between ranks that any synchronisation exposes.
    """
    parts, fractions, own = {}, {}, {}
    for name in ALGORITHMS:
        per = {p: [] for p in ("train", "comm", "eval", "write", "total", "comm_min", "write_min")}
        frac, frac_own = [], []
        for repeat in range(s.repeats):
            sec = _round_parts(folder / f"{name}_{repeat}.h5")
            means = {p: float(np.nanmean(v)) for p, v in sec.items()}
            total = sum(means.values())
            for p, v in means.items():
                per[p].append(v)
            per["total"].append(total)
            for p in ("comm", "write"):
                per[f"{p}_min"].append(float(np.nanmean(np.nanmin(sec[p], axis=1))))
            frac.append((means["comm"] + means["write"]) / total)
            frac_own.append((per["comm_min"][-1] + per["write_min"][-1]) / total)
        parts[name] = {p: stats(v) for p, v in per.items()}
        fractions[name], own[name] = stats(frac), stats(frac_own)
    return parts, fractions, own


def overhead(folder: Path, raw: dict, s: Settings) -> dict:
    ratio, mine, bare, mine_ips, bare_ips = [], [], [], [], []
    for repeat, alone in enumerate(raw["alone"]):
        t_mpicd = float(np.mean(_round_parts(folder / f"single_{repeat}.h5")["train"]))
        t_bare = float(np.mean(alone["bare"][1:]))
        images = alone["images"]
        mine.append(t_mpicd), bare.append(t_bare), ratio.append(t_mpicd / t_bare)
        mine_ips.append(images / t_mpicd), bare_ips.append(images / t_bare)
    return {
        "images_per_round": raw["alone"][0]["images"],
        "threads": raw["alone"][0]["threads"],
        "mpicd_train_seconds": stats(mine),
        "bare_train_seconds": stats(bare),
        "mpicd_images_per_second": stats(mine_ips),
        "bare_images_per_second": stats(bare_ips),
        "overhead_ratio": stats(ratio),
    }


def parallel(folder: Path, raw: dict, s: Settings) -> dict:
    par, ser, speed = [], [], []
    for repeat, alone in enumerate(raw["alone"]):
        sec = _round_parts(folder / f"local_{repeat}.h5")
        rounds = np.nan_to_num(sum(sec.values())).max(axis=1)  # the slowest rank sets the round
        t_par, t_ser = float(np.mean(rounds)), float(np.mean(alone["serial"][1:]))
        par.append(t_par), ser.append(t_ser), speed.append(t_ser / t_par)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return {
        "ranks": s.ranks,
        "cores": cores,
        "serial_threads": raw["alone"][0]["threads"],
        "parallel_round_seconds": stats(par),
        "serial_round_seconds": stats(ser),
        "speedup": stats(speed),
        "ideal": min(s.ranks, cores),
    }


def startup(s: Settings, folder: Path) -> dict:
    """Fresh launches of the quick start on ``s.ranks`` ranks: phases, and seconds to round 1."""
    import yaml

    config = ROOT / "configs" / "quickstart.yaml"
    totals, phases = [], {name: [] for name in (*STARTUP_PHASES, "model_build")}
    for repeat in range(s.repeats):
        out = folder / f"startup_{repeat}.h5"
        launched, lines = run_job(
            s.ranks,
            ["-m", "mpicd", "run", str(config), f"clients={s.ranks}", "rounds=2", "--out", str(out)],
            s.timeout,
            stamp=True,
        )
        first = next((t for t, text in lines if re.match(r"round\s+1/", text)), None)
        if first is None:
            raise BenchError("the quick start printed no 'round 1/' line:\n" + "\n".join(t for _, t in lines[-20:]))
        res = Results(out)
        recorded = yaml.safe_load(res.attrs["startup_seconds"])
        m = res.metrics
        round_one = float(
            m["train_seconds"][0, 0] + m["comm_seconds"][0, 0] + m["eval_seconds"][0, 0] + m["write_seconds"][0, 0]
        )
        total = first - launched - round_one
        totals.append(total)
        for name in STARTUP_PHASES:
            phases[name].append(recorded.get(name))
        phases["model_build"].append(total - sum(recorded.values()))
    return {
        "ranks": s.ranks,
        "config": "configs/quickstart.yaml",
        "total": stats(totals),
        "phases": {name: stats(v) for name, v in phases.items()},
    }


def network(raw: dict) -> dict:
    net = raw["network"]
    result = {"ranks": net["ranks"], "sizes": net["sizes"]}
    for name in ("pingpong", "allreduce"):
        medians = [float(np.median(v)) for v in net[name]]
        latency, bandwidth = fit(net["sizes"], medians)
        result[name] = {
            "seconds": [stats(v) for v in net[name]],
            "latency_seconds": latency,
            "bandwidth_bytes_per_second": bandwidth,
        }
    return result


def compute_per_round(folder: Path, s: Settings) -> dict:
    """Median over repeats of one rank's train + eval seconds per round (all cores), per model."""
    out = {}
    for model, prefix in (("lenet", "single"), ("resnet18", "resnet")):
        values = []
        for repeat in range(s.repeats):
            sec = _round_parts(folder / f"{prefix}_{repeat}.h5")
            values.append(float(np.mean(sec["train"] + sec["eval"])))
        out[model] = float(np.median(values))
    return out
