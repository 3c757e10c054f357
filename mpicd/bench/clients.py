"""Clients per rank, measured: how to hold a rank's clients, and when packing them pays.

Two measurements (``mpicd bench --clients-per-rank``, or ``python -m mpicd.bench.clients``):

* :func:`holding`: in one process, K clients of a config held as one model each (what
  :mod:`mpicd.run.client` does) against one model whose parameters and optimizer state are swapped in
  for each client (Apple's pfl-research): resident memory per added client (VmRSS after one
  round of every client, so gradients and Adam's moments exist) and seconds per round of the K
  clients' local epochs, the swap included.
* :func:`sweep`: the same FedAvg and co-distillation work at N clients on 2 ranks
  (``clients_per_rank: balanced``) and on N ranks where memory allows: wall time of the job,
  start-up (the attr ``startup_seconds`` plus launch), seconds per round (the median over rounds
  after the first of the slowest rank's round), the job's memory (summed PSS of its processes,
  sampled every second, the peak), and the pure compute: each client's train and eval seconds
  summed over the clients, divided by the cores.
* in the same :func:`sweep`, each packed job twice: every client's model evaluated itself
  (``eval.shared_models: per_client``, how mpicd evaluated before) and each distinct model once
  (``once``, the default), alternating, against the pure compute of what differs, timed alone
  (:func:`alone`): each client's local epochs and each distinct model's evaluation, no MPI, no loop;
  :func:`before_after` pairs them.
"""

from __future__ import annotations

import copy
import json
import os
import re
import sys
import threading
import time
from pathlib import Path

import numpy as np

from mpicd.bench.harness import BenchError, launcher
from mpicd.config.loading import load_config
from mpicd.mpi.accounting import ByteLedger
from mpicd.mpi.assignment import Assignment
from mpicd.results.reader import Results

ROOT = Path(__file__).resolve().parents[2]


def _rss_bytes() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def holding(config: str, overrides: list[str], clients: int = 16, rounds: int = 3) -> dict:
    """One model per client against one model with each client's state swapped in (see the module
    docstring), each in a fresh process (freed memory is not given back to the system, so the
    second would reuse the first's); both train the same clients the same epochs, so the numbers
    differ only by how the state is held."""
    import subprocess

    found = {}
    for mode in ("one_model_per_client", "one_model_swapped"):
        argv = ["--config", config, "--holding", str(clients), "--rounds", str(rounds), "--mode", mode, *overrides]
        done = subprocess.run(
            [sys.executable, "-m", "mpicd.bench.clients", *argv], capture_output=True, text=True, timeout=3600
        )
        if done.returncode != 0:
            raise RuntimeError(f"holding ({mode}) failed:\n{done.stderr[-2000:]}")
        found.update(json.loads(done.stdout.strip().splitlines()[-1]))
    return found


def holding_one(config: str, overrides: list[str], clients: int, rounds: int, mode: str) -> dict:
    """One of :func:`holding`'s two measurements, in this process. Without MPI (a stand-in
    communicator: ``local`` needs no exchange), torch on one thread."""
    import types

    import torch

    # torch (1.4 s): this measurement's own process needs it, not mpicd bench, which imports this module
    from mpicd.run.client import Client
    from mpicd.run.plan import prepare

    torch.set_num_threads(1)
    cfg = load_config(config, [*overrides, f"clients={clients}", "algorithm={name: local}"])
    plan = prepare(cfg)
    comm = types.SimpleNamespace(rank=0, size=1, ledger=ByteLedger())
    shared: dict = {}
    owner = np.zeros(clients, dtype=np.int64)

    marks: dict[str, int] = {}

    def epoch_all(train) -> float:
        """Rounds of every client, each built at its first turn; the memory after the first
        client's first round (everything allocated once is there) and after the last round: their
        difference / (K - 1) is the memory each further client adds (data, model, state)."""
        start = time.perf_counter()
        for r in range(rounds):
            for c in range(clients):
                train(c, r)
                if r == 0 and c == 0:
                    marks["first"] = _rss_bytes()
        marks["last"] = _rss_bytes()
        return (time.perf_counter() - start) / rounds

    def held(tensors) -> int:
        return sum(t.numel() * t.element_size() for t in tensors if t is not None)

    def optimizer_tensors(state) -> list:
        return [v for s in state["state"].values() for v in s.values() if torch.is_tensor(v)]

    info = {"config": config, "model": cfg.model.name, "parameters": plan.num_parameters, "clients": clients}
    info["rounds"] = rounds
    plan.dataset.train.x.sum(), plan.dataset.test.x.sum()  # the data resident before the baseline
    if mode == "one_model_per_client":
        resident: dict = {}

        def own_model(c: int, r: int) -> None:
            if c not in resident:
                resident[c] = Client(plan, comm, "cpu", c, owner, shared)
            resident[c].local_epochs(r)

        seconds = epoch_all(own_model)
        model = resident[1].model  # a client's model, gradients and optimizer state
        tensors = [*model.parameters(), *model.buffers(), *(p.grad for p in model.parameters())]
        tensors += optimizer_tensors(resident[1].optimizer.state_dict())
        return {**info, mode: {
            "rss_per_added_client": (marks["last"] - marks["first"]) / (clients - 1),
            "state_bytes_per_client": held(tensors),
            "seconds_per_round": seconds,
        }}  # fmt: skip

    worker = Client(plan, comm, "cpu", 0, owner, shared)
    states: dict = {}
    data: dict = {}
    swap_seconds = [0.0]

    def swapped(c: int, r: int) -> None:
        if c not in states:  # its data and initial state; its model and optimizer are dropped
            h = Client(plan, comm, "cpu", c, owner, shared)
            states[c] = (copy.deepcopy(h.model.state_dict()), h.optimizer.state_dict())
            data[c] = (h.train_x, h.train_y, h.index)
            del h
        start = time.perf_counter()
        worker.model.load_state_dict(states[c][0])
        worker.optimizer.load_state_dict(states[c][1])
        worker.train_x, worker.train_y, worker.index = data[c]
        swap_seconds[0] += time.perf_counter() - start
        worker.local_epochs(r)
        start = time.perf_counter()
        states[c] = (
            {k: v.detach().clone() for k, v in worker.model.state_dict().items()},
            worker.optimizer.state_dict(),
        )
        worker.model.zero_grad(set_to_none=True)
        swap_seconds[0] += time.perf_counter() - start

    seconds = epoch_all(swapped)
    return {**info, mode: {
        "rss_per_added_client": (marks["last"] - marks["first"]) / (clients - 1),
        "state_bytes_per_client": held(states[1][0].values()) + held(optimizer_tensors(states[1][1])),
        "seconds_per_round": seconds,
        "swap_seconds_per_round": swap_seconds[0] / rounds,
    }}  # fmt: skip


# ----------------------------------------------------------------------------- the sweep


def _pss_of_tree(root_pid: int) -> int:
    """Summed PSS (bytes) of ``root_pid`` and its descendants (/proc/<pid>/smaps_rollup)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                parent = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(entry))
    total, todo = 0, [root_pid]
    while todo:
        pid = todo.pop()
        todo.extend(children.get(pid, []))
        try:
            with open(f"/proc/{pid}/smaps_rollup") as fh:
                for line in fh:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1]) * 1024
                        break
        except OSError:
            pass
    return total


def _launch(n: int, argv: list[str], timeout: float) -> dict:
    """One job of ``n`` ranks; wall seconds, peak summed PSS, output lines (killed after ``timeout``)."""
    import signal
    import subprocess

    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    launched = time.time()
    env["MPICD_LAUNCHED_AT"] = repr(launched)
    proc = subprocess.Popen(
        [*launcher(n), sys.executable, *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )
    peak, done = [0], threading.Event()

    def sample() -> None:
        while not done.wait(1.0):  # each sample reads /proc: more often would load the job it measures
            peak[0] = max(peak[0], _pss_of_tree(proc.pid))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    timer = threading.Timer(timeout, lambda: os.killpg(proc.pid, signal.SIGKILL))
    timer.start()
    try:
        lines = [(time.time(), line.rstrip("\n")) for line in proc.stdout]
        code = proc.wait()
    finally:
        timer.cancel()
        done.set()
        sampler.join()
    if code != 0:
        raise BenchError(f"{n} ranks {' '.join(argv)}: exit status {code}\n" + "\n".join(t for _, t in lines[-30:]))
    return {"launched": launched, "wall": time.time() - launched, "pss_peak": peak[0], "lines": lines}


def one_run(config: str, overrides: list[str], algorithm: str, clients: int, ranks: int, rounds: int, out: Path,
            timeout: float) -> dict:  # fmt: skip
    """One ``mpicd run`` of ``clients`` clients on ``ranks`` ranks: the sweep's figures for it.
    ``round_seconds``: the median over rounds after the first of the time between two progress
    lines (rank 0 prints one after each round's row is written): a round as the user waits for it."""
    import yaml

    argv = ["-m", "mpicd", "run", config, *overrides, f"clients={clients}", "clients_per_rank=balanced",
            f"rounds={rounds}", f"algorithm={{name: {algorithm}}}", "checkpoint.every=0", "--out", str(out)]  # fmt: skip
    job = _launch(ranks, argv, timeout)
    first = next((t for t, text in job["lines"] if re.match(r"round\s+1/", text)), None)
    stamps = [t for t, text in job["lines"] if re.match(r"round\s+\d+/", text)]
    res = Results(out)
    m = res.metrics
    owner = np.asarray(res.attrs["client_rank"])
    # a rank's round: its clients' train + eval + comm (the comm split evenly among them), and its
    # write once (write_seconds is the rank's, repeated on each of its clients)
    per_client = m["train_seconds"] + m["eval_seconds"] + m["comm_seconds"]
    per_rank = np.stack(
        [per_client[:, owner == r].sum(axis=1) + m["write_seconds"][:, owner == r][:, 0] for r in range(ranks)], axis=1
    )
    later = per_rank[1:] if rounds > 1 else per_rank
    compute = (m["train_seconds"] + m["eval_seconds"])[1:] if rounds > 1 else m["train_seconds"] + m["eval_seconds"]
    cores = os.cpu_count() or 1
    recorded = yaml.safe_load(res.attrs["startup_seconds"])
    round_one = float(per_rank[0].max())
    return {
        "algorithm": algorithm,
        "clients": clients,
        "ranks": ranks,
        "wall_seconds": job["wall"],
        "startup_seconds": (first - job["launched"] - round_one) if first else float("nan"),
        "startup_recorded": recorded,
        "seconds_per_round": float(np.median(later.max(axis=1))),
        "round_seconds": float(np.median(np.diff(stamps))) if len(stamps) > 1 else float("nan"),
        "pure_compute_per_round": float(np.median(compute.sum(axis=1))) / cores,
        "memory_pss_bytes": job["pss_peak"],
    }


def sweep(config: str, overrides: list[str], clients: list[int], rounds: int, folder: Path, timeout: float,
          log=print, packed_ranks: int = 2, one_per_client_up_to: int = 16,
          algorithms=("fedavg", "codistill"), on_row=None, repeats: int = 1) -> list[dict]:  # fmt: skip
    """Every N of ``clients``, ``repeats`` times: each algorithm on ``packed_ranks`` ranks twice,
    evaluated per client (before) and each distinct model once (after), the pure compute timed alone
    (:func:`alone`) between the two, which come in alternating order (this machine's speed drifts:
    each ratio is taken within a repeat); and once on N ranks while N <= ``one_per_client_up_to``
    (beyond it the machine's memory, 400 MiB per rank, runs out). ``on_row``: called with the rows
    after each run (to save them as they come)."""
    rows = []

    def job(algorithm: str, n: int, ranks: int, mode: str, repeat: int) -> None:
        log(f"mpicd bench: {algorithm}, {n} clients on {ranks} ranks, evaluated {mode} (repeat {repeat + 1}) ...")
        out = folder / f"{algorithm}_{n}_{ranks}_{mode}_{repeat}.h5"
        try:
            row = one_run(config, [*overrides, f"eval.shared_models={mode}"], algorithm, n, ranks, rounds, out, timeout)
            rows.append({**row, "evaluated": mode, "repeat": repeat})
        except BenchError as err:  # one run's failure (a data limit, memory) is reported, not fatal
            rows.append({"algorithm": algorithm, "clients": n, "ranks": ranks, "evaluated": mode, "repeat": repeat,
                         "error": str(err)[-600:]})  # fmt: skip
            log(f"mpicd bench: failed: {str(err).splitlines()[-1][:300]}")
        out.unlink(missing_ok=True)
        if on_row is not None:
            on_row(rows)

    for repeat in range(repeats):
        for i, n in enumerate(clients):
            for algorithm in algorithms:
                packed = min(packed_ranks, n)
                first, second = ("per_client", "once") if (i + repeat) % 2 == 0 else ("once", "per_client")
                job(algorithm, n, packed, first, repeat)
                log(f"mpicd bench: {algorithm}, {n} clients of {packed} ranks, the pure compute timed alone ...")
                try:
                    rows.append({**alone(config, overrides, algorithm, n, packed, min(rounds, 6)), "repeat": repeat})
                except RuntimeError as err:
                    rows.append({"algorithm": algorithm, "clients": n, "ranks": packed, "evaluated": "alone",
                                 "repeat": repeat, "error": str(err)[-600:]})  # fmt: skip
                job(algorithm, n, packed, second, repeat)
                if repeat == 0 and n <= one_per_client_up_to and n != packed:
                    job(algorithm, n, n, "once", repeat)
    return rows


def alone(config: str, overrides: list[str], algorithm: str, clients: int, ranks: int, rounds: int) -> dict:
    """:func:`alone_one` for every rank at once, each in a fresh process pinned to its own core as
    the job's ranks are (Open MPI binds rank r to core r here), so the pure compute meets the same
    machine the job does: the job's round can be no shorter than its slowest rank's. The median
    over rounds after the first of the slowest rank's round."""
    import subprocess

    argv = [sys.executable, "-m", "mpicd.bench.clients", "--config", config, "--rounds", str(rounds)]
    procs = [
        subprocess.Popen(
            [*argv, "--alone", f"{algorithm},{clients},{ranks},{rank}", *overrides],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(ranks)
    ]
    found = []
    try:
        for rank, proc in enumerate(procs):
            out, err = proc.communicate(timeout=3600)
            if proc.returncode != 0:
                raise RuntimeError(f"alone ({algorithm}, {clients} clients, rank {rank}) failed:\n{err[-2000:]}")
            found.append(json.loads(out.strip().splitlines()[-1]))
    except (subprocess.TimeoutExpired, ValueError, IndexError) as err:  # a hang, or no JSON line
        raise RuntimeError(f"alone ({algorithm}, {clients} clients): {err}") from err
    finally:
        for proc in procs:  # none left pinned to a core, loading the next job
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    train = np.array([f["train_seconds"] for f in found]).T  # (rounds, ranks)
    evaluate = np.array([f["eval_seconds"] for f in found]).T
    later = slice(1, None) if len(train) > 1 else slice(None)
    return {
        "algorithm": algorithm,
        "clients": clients,
        "ranks": ranks,
        "evaluated": "alone",
        "threads": found[0]["threads"],
        "distinct_models": int(sum(f["distinct_models"] for f in found)),
        "pure_round_seconds": float(np.median((train + evaluate)[later].max(axis=1))),
        "train_seconds": float(np.median(train[later].max(axis=1))),
        "eval_seconds": float(np.median(evaluate[later].max(axis=1))),
    }


def alone_one(config: str, overrides: list[str], algorithm: str, clients: int, ranks: int, rank: int,
              rounds: int) -> dict:  # fmt: skip
    """The pure compute of rank ``rank`` of a job of ``clients`` clients packed on ``ranks`` ranks,
    timed alone: in this process (pinned to core ``rank``), no MPI and no round loop, with the torch
    threads and deterministic kernels a rank of the job gets, the rank's clients built as the job
    builds them (:mod:`mpicd.mpi.assignment`); then round by round each client's local epochs and each
    distinct model's evaluation on the test and validation splits (one where the algorithm ends a
    round with one model for all, else every client's), each timed by itself. Co-distillation's
    clients get a zero mean from the next client as their received teacher row, so that their epochs
    compute the term as in the job. Seconds per round: lists of ``train_seconds`` and ``eval_seconds``."""
    import types

    import torch

    # torch (1.4 s) and mpi4py (MPI_Init on import): this measurement's own process needs them, not mpicd
    # bench, which imports this module and only launches MPI jobs
    from mpicd.mpi.placement import cpu_threads, deterministic_algorithms
    from mpicd.run.client import Client
    from mpicd.run.plan import prepare

    if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) >= ranks:
        os.sched_setaffinity(0, {rank})
    threads = cpu_threads(ranks)
    torch.set_num_threads(threads)
    deterministic_algorithms()
    extra = [f"clients={clients}", "clients_per_rank=balanced", f"algorithm={{name: {algorithm}}}", "device=cpu"]
    plan = prepare(load_config(config, [*overrides, *extra]))
    splits = ("test", "val") if plan.dataset.val is not None else ("test",)
    layout = Assignment.of(plan.partition.train_counts.sum(axis=1), ranks, rank)
    comm = types.SimpleNamespace(rank=rank, size=ranks, ledger=ByteLedger())
    shared: dict = {}
    held = [Client(plan, comm, "cpu", c, layout.owner, shared) for c in layout.mine]
    if algorithm == "codistill":
        for c in held:
            teacher = (c.index + 1) % clients
            c.algorithm.teachers[c.index] = teacher
            c.algorithm.received = {teacher: torch.zeros(1, c.algorithm.width)}
    distinct = held[:1] if plan.algorithm_cls.shared_at_evaluation else held
    train, evaluate = [0.0] * rounds, [0.0] * rounds
    for r in range(rounds):
        for c in held:
            start = time.perf_counter()
            c.local_epochs(r)
            train[r] += time.perf_counter() - start
        for c in distinct:
            start = time.perf_counter()
            for split in splits:
                c.predictions(split)
            evaluate[r] += time.perf_counter() - start
    return {"threads": threads, "distinct_models": len(distinct), "train_seconds": train, "eval_seconds": evaluate}


def render(holding_result: dict | None, rows: list[dict]) -> str:
    lines = []
    if holding_result:
        h = holding_result
        a, b = h["one_model_per_client"], h["one_model_swapped"]
        lines += [
            f"holding {h['clients']} clients of {h['model']} ({h['parameters']:,d} parameters) in one process "
            "(per added client: resident memory, tensors of its state; seconds per round of all clients):",
            f"  one model per client:  {a['rss_per_added_client'] / 2**20:8.2f} MiB  "
            f"{a['state_bytes_per_client'] / 2**20:8.3f} MiB  {a['seconds_per_round']:.3f} s",
            f"  one model, swapped:    {b['rss_per_added_client'] / 2**20:8.2f} MiB  "
            f"{b['state_bytes_per_client'] / 2**20:8.3f} MiB  {b['seconds_per_round']:.3f} s "
            f"(of which swapping {b['swap_seconds_per_round']:.4f} s)",
        ]
    runs = [r for r in rows if r.get("evaluated") != "alone"]
    if runs:
        lines.append(
            "| algorithm | clients | ranks | evaluated | wall s | start-up s | s/round | round s | "
            "pure compute s/round | memory GiB |"
        )
        lines.append("| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for r in runs:
            head = f"| {r['algorithm']} | {r['clients']} | {r['ranks']} | {r.get('evaluated', 'once')} |"
            if "error" in r:
                lines.append(f"{head} failed: {r['error'][-120:]} |")
                continue
            lines.append(
                f"{head} {r['wall_seconds']:.1f} | {r['startup_seconds']:.2f} | {r['seconds_per_round']:.3f} | "
                f"{r.get('round_seconds', float('nan')):.3f} | {r['pure_compute_per_round']:.3f} | "
                f"{r['memory_pss_bytes'] / 2**30:.2f} |"
            )
    paired = before_after(rows)
    if paired:
        lines += ["", render_before_after(paired)]
    return "\n".join(lines)


def before_after(rows: list[dict]) -> list[dict]:
    """The packed runs paired within each repeat: evaluated per client (before), each distinct model
    once (after), and the pure compute timed alone; per algorithm and N the median over repeats of
    each figure and each ratio, and the range of after / pure."""
    found: dict = {}
    for r in rows:
        if "error" not in r and r.get("evaluated") in ("per_client", "once", "alone"):
            key = (r["algorithm"], r["clients"], r["ranks"])
            found.setdefault(key, {}).setdefault(r.get("repeat", 0), {})[r["evaluated"]] = r
    paired = []
    for (algorithm, n, ranks), repeats in found.items():
        each = []
        for got in repeats.values():
            if set(got) != {"per_client", "once", "alone"}:
                continue  # a failed run, or the one-per-client layout
            before, after, pure = got["per_client"], got["once"], got["alone"]["pure_round_seconds"]
            each.append({
                "round_before": before["round_seconds"], "round_after": after["round_seconds"],
                "speedup_round": before["round_seconds"] / after["round_seconds"],
                "pure_round_seconds": pure, "after_over_pure": after["round_seconds"] / pure,
                "before_over_pure": before["round_seconds"] / pure,
                "wall_before": before["wall_seconds"], "wall_after": after["wall_seconds"],
                "speedup_wall": before["wall_seconds"] / after["wall_seconds"],
            })  # fmt: skip
        if each:
            median = {k: float(np.median([e[k] for e in each])) for k in each[0]}
            spread = [e["after_over_pure"] for e in each]
            paired.append({"algorithm": algorithm, "clients": n, "ranks": ranks, "repeats": len(each), **median,
                           "after_over_pure_min": min(spread), "after_over_pure_max": max(spread)})  # fmt: skip
    return paired


def render_before_after(paired: list[dict]) -> str:
    lines = [
        "| algorithm | clients | ranks | repeats | s/round before | s/round after | speed-up | pure compute s/round | "
        "after / pure (range) | before / pure | wall s before | wall s after | wall speed-up |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for p in paired:
        spread = f"{p['after_over_pure']:.2f} ({p['after_over_pure_min']:.2f}–{p['after_over_pure_max']:.2f})"
        lines.append(
            f"| {p['algorithm']} | {p['clients']} | {p['ranks']} | {p['repeats']} | {p['round_before']:.3f} | "
            f"{p['round_after']:.3f} | {p['speedup_round']:.2f} | {p['pure_round_seconds']:.3f} | {spread} | "
            f"{p['before_over_pure']:.2f} | {p['wall_before']:.1f} | {p['wall_after']:.1f} | {p['speedup_wall']:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """``python -m mpicd.bench.clients [--holding] [--clients 4,8,...] [--rounds R] [--json FILE] [overrides]``."""
    import argparse
    import tempfile

    parser = argparse.ArgumentParser(prog="python -m mpicd.bench.clients")
    parser.add_argument("--config", default=str(ROOT / "configs" / "pneumoniamnist.yaml"))
    parser.add_argument("--clients", default="", help="comma-separated client counts for the sweep")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=1, help="repeat the packed pairs (medians of the ratios)")
    parser.add_argument("--holding", type=int, default=0, metavar="K", help="measure holding K clients")
    parser.add_argument("--mode", choices=("one_model_per_client", "one_model_swapped"))
    parser.add_argument("--alone", metavar="ALGORITHM,CLIENTS,RANKS,RANK", help="one rank's pure compute (a JSON line)")
    parser.add_argument("--one-per-client-up-to", type=int, default=16)
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--json")
    args, overrides = parser.parse_known_args(argv)
    if args.alone:  # the pure compute of one sweep cell, in a process of its own: a JSON line
        algorithm, clients, ranks, rank = args.alone.split(",")
        print(
            json.dumps(alone_one(args.config, overrides, algorithm, int(clients), int(ranks), int(rank), args.rounds))
        )
        return 0
    if args.mode:  # one half of holding(), in a process of its own: a JSON line
        print(json.dumps(holding_one(args.config, overrides, args.holding, args.rounds, args.mode)))
        return 0
    held = holding(args.config, overrides, args.holding, args.rounds) if args.holding else None
    rows: list = []

    def save(done: list) -> None:
        if args.json:
            Path(args.json).write_text(json.dumps({"holding": held, "sweep": done}, indent=1))

    save(rows)
    if held:
        print(render(held, []), flush=True)
    if args.clients:
        folder = Path(tempfile.mkdtemp(prefix="mpicd-bench-clients-"))
        counts = [int(n) for n in args.clients.split(",")]
        rows = sweep(args.config, overrides, counts, args.rounds, folder, args.timeout,
                     one_per_client_up_to=args.one_per_client_up_to, on_row=save, repeats=args.repeats)  # fmt: skip
    print(render(held, rows))
    if args.json:
        Path(args.json).write_text(json.dumps({"holding": held, "sweep": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
