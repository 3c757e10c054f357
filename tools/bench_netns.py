"""The network model of ``mpicd bench`` against a network: two namespace nodes (tests/support/netns_cluster.py),
one rank on each, Open MPI over TCP across the bridge (root only).

1. ``python -m mpicd.bench.net`` between node1 and node2 on the bare veth link, then with the link
   limited by ``tc tbf`` (both directions) to RATE (default 100 Mbit/s, a hospital's uplink):
   ping-pong latency a and bandwidth b fitted as ``mpicd bench`` fits them.
2. On the limited link, ``mpicd run`` of FedAvg and co-distillation with LeNet and ResNet-18 on
   PneumoniaMNIST (2 clients, one torch thread per rank, ROUNDS rounds, IMAGES images per class):
   measured seconds per round (medians over the rounds after the first: the slowest rank's train +
   comm + eval + write; comm: the rank that waited least) against ``mpicd bench``'s projection for
   N = 2: that run's own compute (train + eval) and write seconds plus ``comm_model`` +
   ``progress_allreduce`` at the fitted a, b. Compute is taken from the run, so the comparison is of
   the network model only; the error is (projected - measured) / measured, of the round and of its
   communication alone.

    sudo .venv/bin/python tools/bench_netns.py [--rate 100mbit] [--rounds 4] [--images 40] [--json FILE]

Prints a markdown table and writes the JSON; builds and removes its own cluster.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))

from mpicd.mpi import launch  # noqa: E402

SIZES = (8, 64, 512, 4096, 32768, 262144, 2097152)
CASES = [("lenet", "fedavg"), ("lenet", "codistill"), ("resnet18", "fedavg"), ("resnet18", "codistill")]


def limit(cluster, node: str, rate: str) -> None:
    """tbf on both ends of ``node``'s veth: the bridge side (towards the node) and the node's eth0."""
    for prefix in (["tc"], ["tc", "-n", f"mpicd-{cluster.tag}-{node}"]):
        dev = cluster.state["veths"][node] if len(prefix) == 1 else "eth0"
        subprocess.run(
            [
                *prefix,
                "qdisc",
                "replace",
                "dev",
                dev,
                "root",
                "tbf",
                "rate",
                rate,
                "burst",
                "256kb",
                "latency",
                "100ms",
            ],
            check=True,
        )


def mpirun(cluster, folder: Path, *args: str, timeout: float = 1800) -> str:
    env = {**cluster.env, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    env = {k: v for k, v in env.items() if not k.startswith("SLURM_") or k == "SLURM_CONF"}
    env["SLURM_CPUS_PER_TASK"] = "1"  # one torch thread per rank: both "nodes" share this machine's cores
    hosts = cluster.hostfile({"node1": 1, "node2": 1})
    line = launch.command(
        2, [sys.executable, *args], launcher="mpirun", oversubscribe=False, unbound=True, hostfile=str(hosts)
    )
    command = cluster.on("node1", *line, cwd=ROOT)
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done.stdout


def net_fit(cluster, folder: Path, name: str, budget: float) -> dict:
    out = folder / f"net-{name}.json"
    sizes = ",".join(map(str, SIZES))
    flags = ["--sizes", sizes, "--repeats", "3", "--budget", str(budget), "--json", str(out)]
    mpirun(cluster, folder, "-m", "mpicd.bench.net", *flags)
    return json.loads(out.read_text())


def measured(path: Path) -> dict:
    """Medians over the rounds after the first (seconds): the slowest rank's round and compute, the
    least-waiting rank's comm and write (on the other rank, comm also holds the wait for the slower)."""
    from mpicd.results.reader import Results

    m = Results(path).metrics
    parts = {p: np.asarray(m[f"{p}_seconds"][1:], dtype=float) for p in ("train", "comm", "eval", "write")}
    total = sum(parts.values()).max(axis=1)
    return {
        "round": float(np.median(total)),
        "comm": float(np.median(parts["comm"].min(axis=1))),  # the rank that waited least: the transfer
        "compute": float(np.median((parts["train"] + parts["eval"]).max(axis=1))),
        "write": float(np.median(parts["write"].min(axis=1))),
        "bytes_sent_per_round_per_rank": int(np.median(np.asarray(m["bytes_sent"][1:]).max(axis=1))),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", default="100mbit")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--images", type=int, default=40)
    parser.add_argument("--json", default=str(ROOT / "docs" / "bench" / "netns.json"))
    args = parser.parse_args()
    from mpicd.bench.projection import comm_model, model_sizes, progress_allreduce
    from mpicd.config.loading import load_config
    from mpicd.run.plan import prepare
    from netns_cluster import NetnsCluster

    data = ROOT.parent / "shared" / "data" / "pneumoniamnist.npz"
    config = str(ROOT / "configs" / "pneumoniamnist.yaml")
    base = ["clients=2", f"rounds={args.rounds}", f"data.path={data}", f"data.images_per_class={args.images}"]
    sizes = model_sizes(prepare(load_config(config, base)))
    folder = Path(tempfile.mkdtemp(prefix="mpicd-benchnet-", dir="/var/tmp"))
    cluster = NetnsCluster(folder / "cluster", 2)
    report: dict = {"rate": args.rate, "rounds": args.rounds, "images_per_class": args.images, "cases": []}
    try:
        cluster.up()
        report["bare_sweep"] = net_fit(cluster, folder, "bare", 2.0**26)
        limit(cluster, "node2", args.rate)
        report["limited_sweep"] = net_fit(cluster, folder, "limited", 2.0**23)
        report["bare"], report["limited"] = report["bare_sweep"]["fit"], report["limited_sweep"]["fit"]
        a = report["limited"]["pingpong"]["latency_seconds"]
        b = report["limited"]["pingpong"]["bandwidth_bytes_per_second"]
        for model, algorithm in CASES:
            out = folder / f"{model}-{algorithm}.h5"
            mpirun(cluster, folder, "-m", "mpicd", "run", config, *base, f"model.name={model}",
                   f"algorithm={algorithm}", "--out", str(out))  # fmt: skip
            got = measured(out)
            comm = comm_model(algorithm, 2, sizes[model], a, b) + progress_allreduce(2, a, b)
            projected = got["compute"] + comm + got["write"]
            report["cases"].append(
                {
                    "model": model,
                    "algorithm": algorithm,
                    "measured": got,
                    "projected_comm": comm,
                    "projected_round": projected,
                    "round_error": (projected - got["round"]) / got["round"],
                    "comm_error": (comm - got["comm"]) / got["comm"],
                }
            )
            print(json.dumps(report["cases"][-1]), flush=True)
    finally:
        problems = cluster.down()
        shutil.rmtree(folder, ignore_errors=True)
        if problems:
            print(f"bench_netns: could not remove {problems}", file=sys.stderr)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=1))
    fit = report["limited"]["pingpong"]
    bare = report["bare"]["pingpong"]
    print(
        f"\nbare veth: a = {bare['latency_seconds'] * 1e6:.1f} us, b = {bare['bandwidth_bytes_per_second'] / 1e6:.0f} MB/s;"
        f" {args.rate} tbf: a = {fit['latency_seconds'] * 1e6:.1f} us, b = {fit['bandwidth_bytes_per_second'] / 1e6:.2f} MB/s\n"
    )
    print("| model | algorithm | bytes sent / round / rank | compute s | comm s measured | comm s projected | comm error |"
          " round s measured | round s projected | round error |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for c in report["cases"]:
        m = c["measured"]
        print(
            f"| {c['model']} | {c['algorithm']} | {m['bytes_sent_per_round_per_rank']:,} | {m['compute']:.3f} | {m['comm']:.3f} |"
            f" {c['projected_comm']:.3f} | {c['comm_error']:+.0%} | {m['round']:.3f} | {c['projected_round']:.3f} |"
            f" {c['round_error']:+.0%} |"
        )
    os.sync()
    return 0


if __name__ == "__main__":
    sys.exit(main())
