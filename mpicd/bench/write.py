"""``mpicd bench --write-ranks``: what writing the results file costs a round as the ranks grow.

For each N, two runs of the quick start (``configs/quickstart.yaml``, no checkpoints) on N ranks,
one after the other in the same invocation: the rows flushed every round
(``checkpoint.flush_every=1``: mpicd before buffering) and the default (``auto``: every
ceil(N / 4) rounds, :func:`mpicd.results.writer.flush_interval`). A round's write is, from
``/metrics/write_seconds``, that of the rank that waited least (the smallest: the last to arrive
at the collective flush, so the write itself, not the wait for slower ranks). Its mean over the
rounds after the first (a warm-up) is the amortised cost per round: buffered rounds cost almost
nothing, a flush round pays for the rows it writes and the flush. ``growth`` is the mean at the
largest N over the mean at the smallest, for each setting, measured in the same invocation.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from mpicd.results.reader import Results
from mpicd.results.writer import flush_interval

SETTINGS = {"every_round": "checkpoint.flush_every=1", "auto": "checkpoint.flush_every=auto"}


def least_waiting_write(path: Path) -> dict:
    """Per round (after the first), the smallest write seconds over the ranks: mean and median, in s."""
    seconds = np.asarray(Results(path).metrics["write_seconds"][1:], dtype=float)
    per_round = np.nanmin(seconds, axis=1)
    return {"mean": float(np.mean(per_round)), "median": float(np.median(per_round)), "rounds": len(per_round)}


def sweep(
    run_job: Callable, ranks: list[int], rounds: int, folder: Path, timeout: float, config: Path, log=print
) -> dict:
    """{"ranks": [...], setting: [{"ranks", "mean", "median", "flush_every"}...], "growth": {...}}.

    ``run_job(n, argv, timeout)``: launches ``n`` ranks of ``python ARGV`` (mpicd.bench.run_job).
    """
    out: dict = {"ranks": list(ranks), "rounds": rounds, "config": str(config)}
    for name in SETTINGS:
        out[name] = []
    for n in ranks:
        for name, override in SETTINGS.items():
            path = folder / f"write.{n}.{name}.h5"
            log(f"mpicd bench: results write, {n} ranks, flush {name} ...")
            argv = ["-m", "mpicd", "run", str(config), "--out", str(path)]
            argv += [f"clients={n}", f"rounds={rounds}", "checkpoint.every=0", override, "eval.every=1"]
            run_job(n, argv, timeout)
            every = 1 if name == "every_round" else flush_interval("auto", n)
            out[name].append({"ranks": n, "flush_every": every, **least_waiting_write(path)})
            path.unlink(missing_ok=True)
    out["growth"] = {name: out[name][-1]["mean"] / out[name][0]["mean"] for name in SETTINGS}
    return out


def render(r: dict) -> list[str]:
    """The table: ms per round (mean; median) of the least-waiting rank's write, per N and setting."""
    lines = [
        "",
        f"results write per round vs ranks (quick start, {r['rounds']} rounds, least-waiting rank, mean over "
        "rounds 2..; median in brackets)",
        f"{'ranks':>6}  {'flush every round':>24}  {'flush auto (every)':>28}",
    ]
    for before, after in zip(r["every_round"], r["auto"]):
        lines.append(
            f"{before['ranks']:>6}  {1e3 * before['mean']:>10.2f} ms ({1e3 * before['median']:6.2f})  "
            f"{1e3 * after['mean']:>10.2f} ms ({1e3 * after['median']:6.2f}) ({after['flush_every']:>2})"
        )
    g = r["growth"]
    lines.append(
        f"growth from {r['ranks'][0]} to {r['ranks'][-1]} ranks: every round {g['every_round']:.1f}x, "
        f"auto {g['auto']:.1f}x"
    )
    return lines
