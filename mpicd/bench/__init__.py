"""``mpicd bench``: what a round costs, where its time goes, how it compares, and how it would scale.

Started without mpirun: it launches its own MPI jobs (the command line from
:func:`mpicd.mpi.launch.command`: mpirun or mpiexec outside Slurm, srun inside an allocation) and
reads the results files they write. One job of N ranks (``--ranks``) measures,
repeat after repeat, in alternating order so that background load hits every side alike:

1. overhead: rank 0 alone (the others wait asleep) runs ``local`` on one client through mpicd's
   round loop and through a bare PyTorch loop written here (same model, data, batch size,
   optimizer, threads). mpicd's train seconds per round come from ``/metrics/train_seconds``, the
   bare loop's from ``time.perf_counter``; ``overhead_ratio`` = mpicd / bare.
2. anatomy: every algorithm on N ranks; train, comm (inside MPI, waiting included), eval and
   write seconds per round from the results file; ``comm_io_fraction`` = (comm + write) / round.
3. parallel vs serial: the N-rank ``local`` run of part 2 against rank 0 alone training the same
   N clients one after another (how single-process simulators run) with ``--threads`` threads
   (default: what mpicd gives one rank alone, all the cores), like part 1 and the ResNet-18 compute.

5. network: ping-pong and Allreduce over message sizes (:mod:`mpicd.bench.net`), fitted to
   latency + bytes / bandwidth.

Then 4. start-up: ``--repeats`` fresh launches of the quick start on N ranks, split into the
phases ``mpicd run`` records (attr ``startup_seconds``) plus the rest up to round 1.
The projection combines the fit, the bytes every algorithm declares (``payloads``) and the measured
compute into round times on 4 ... 1024 ranks (assumptions in :data:`ASSUMPTIONS`).

The first round of every run is a warm-up and left out. Every figure is min / median / max over
repeats. ``python -m mpicd.bench SPEC`` is the MPI job itself (the launcher starts it).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from mpicd.bench import clients as bench_clients
from mpicd.bench import write as bench_write
from mpicd.bench.anatomy import anatomy, compute_per_round, network, overhead, parallel, startup
from mpicd.bench.harness import ALGORITHMS, ROOT, BenchError, machine, run_job, Settings, settings_for
from mpicd.bench.plot import plot
from mpicd.bench.projection import comm_model, projection
from mpicd.bench.render import render
from mpicd.config.loading import load_config
from mpicd.config.sections import ConfigError


def bench(s: Settings, log=print) -> dict:
    """Run every part and return the figures (the JSON). Imports no torch: the jobs do the work."""
    cfg = load_config(s.config, [*s.overrides, f"clients={s.ranks}"])  # bad input fails here, not in MPI
    if cfg.data.path and not Path(cfg.data.path).exists():
        raise ConfigError("data.path", f"{cfg.data.path} does not exist (run from the project root, or --data)")
    started = time.perf_counter()
    folder = Path(tempfile.mkdtemp(prefix="mpicd-bench-"))
    try:
        info = machine()
        spec = {
            "config": s.config,
            "overrides": [*s.overrides, f"rounds={s.rounds}", "checkpoint.every=0"],
            "algorithms": list(ALGORITHMS),
            "repeats": s.repeats,
            "rounds": s.rounds,
            "ranks": s.ranks,
            "resnet_rounds": s.resnet_rounds,
            "sizes": list(s.sizes),
            "threads": s.threads,
            "net_budget": s.net_budget,
            "net_most": s.net_most,
            "out": str(folder),
        }
        (folder / "spec.json").write_text(json.dumps(spec))
        log(f"mpicd bench: one job of {s.ranks} ranks (parts 1, 2, 3, 5; {s.repeats} repeat(s)) ...")
        run_job(s.ranks, ["-m", "mpicd.bench", str(folder / "spec.json")], s.timeout, unbound=True)
        raw = json.loads((folder / "worker.json").read_text())
        info.update(torch=raw["torch"], gpu=raw["gpu"])
        log(f"mpicd bench: {s.repeats} launch(es) of the quick start on {s.ranks} ranks (part 4) ...")
        boot = startup(s, folder)
        parts, fractions, own = anatomy(folder, s)
        net = network(raw)
        compute = compute_per_round(folder, s)
        write = float(np.median(parts["codistill"]["write_min"]["values"]))  # the writing, not the wait
        info["load_average_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
        over = overhead(folder, raw, s)
        par = parallel(folder, raw, s)
        projected = projection(net, raw["models"], compute, write)
        written = None
        if s.write_ranks:
            quickstart = ROOT / "configs" / "quickstart.yaml"
            written = bench_write.sweep(
                run_job, list(s.write_ranks), s.write_rounds, folder, s.timeout, quickstart, log
            )
        packed = None
        if s.clients_sweep:
            packed = {
                "holding": bench_clients.holding(s.config, s.overrides, 16),
                "sweep": bench_clients.sweep(
                    s.config,
                    s.overrides,
                    list(s.clients_sweep),
                    s.clients_rounds,
                    folder,
                    s.timeout,
                    log,
                    repeats=s.repeats,
                ),
            }
        a, b = net["pingpong"]["latency_seconds"], net["pingpong"]["bandwidth_bytes_per_second"]
        projected["check_at_measured_ranks"] = {  # the model has no waiting for slower ranks; the measurement has
            name: {
                "ranks": s.ranks,
                "modelled_comm_seconds": comm_model(name, s.ranks, raw["models"]["lenet"], a, b),
                "measured_comm_seconds": parts[name]["comm"]["median"],
            }
            for name in ALGORITHMS
        }
        return {
            "machine": info,
            "settings": {**asdict(s), "sizes": list(s.sizes)},
            "seconds": time.perf_counter() - started,
            "overhead": over,
            "overhead_ratio": over["overhead_ratio"],
            "anatomy": parts,
            "comm_io_fraction": fractions,
            "comm_io_own_fraction": own,
            "parallel": par,
            "speedup": par["speedup"],
            "ideal": par["ideal"],
            "startup_seconds": boot,
            "network": net,
            "projection": projected,
            **({"write_vs_ranks": written} if written else {}),
            **({"clients_per_rank": packed} if packed else {}),
        }
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main(args) -> int:
    """``mpicd bench`` (see :func:`mpicd.cli.bench`): print the figures; --json / --plot write them."""
    try:
        s = settings_for(args)
        result = bench(s, log=lambda line: print(line, flush=True))
    except ConfigError as err:
        print(f"mpicd: {err}", file=sys.stderr)
        return 2
    except BenchError as err:
        print(f"mpicd bench: {err}", file=sys.stderr)
        return 2 if str(err).startswith("--") else 1
    print(render(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1, allow_nan=False))
        print(f"json: {args.json}")
    if args.plot:
        print(f"plot: {args.plot}" if plot(result, args.plot) else "plot: skipped (matplotlib is not installed)")
    return 0
