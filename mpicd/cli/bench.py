"""``mpicd bench``: launches its own MPI jobs and measures (mpicd.bench)."""

from __future__ import annotations

import argparse


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mpicd bench",
        description="measure overhead, round anatomy, parallel vs "
        "serial, start-up and the network, and project round times to 1024 ranks; "
        "start it WITHOUT mpirun: it launches its own MPI jobs (srun under Slurm)",
    )
    p.add_argument("--ranks", type=int, help="ranks of the multi-rank parts and the start-up (default 4; --quick: 2)")
    p.add_argument("--repeats", type=int, help="repeats of every measurement (default 3; --quick: 1)")
    p.add_argument("--rounds", type=int, help="rounds per run, the first a warm-up (default 6; --quick: 2)")
    p.add_argument(
        "--quick",
        action="store_true",
        help="smoke test: 2 ranks, 2 rounds, 1 repeat, 40 images per class, 2 message sizes",
    )
    p.add_argument(
        "--write-ranks",
        metavar="LIST",
        help="also measure the results write per round on these rank counts, e.g. 2,4,8,16,32 "
        "(flushed every round vs checkpoint.flush_every: auto; --quick: 2,5)",
    )
    p.add_argument(
        "--clients-per-rank",
        metavar="LIST",
        help="also measure clients per rank (mpicd.bench.clients): FedAvg and co-distillation at these client "
        "counts, e.g. 4,16,64, on 2 ranks evaluated per client and each distinct model once (before and after, "
        "--repeats times) against the pure compute timed alone, and on one rank per client up to 16",
    )
    p.add_argument("--config", help="an image dataset's config (default configs/pneumoniamnist.yaml)")
    p.add_argument("--data", metavar="NPZ", help="the dataset file (sets data.path)")
    p.add_argument("--json", metavar="FILE", help="write every figure as JSON")
    p.add_argument("--plot", metavar="FILE", help="the projection as a plot (needs matplotlib)")
    p.add_argument("--timeout", type=float, metavar="S", help="seconds before a launched job is killed (default 3600)")
    p.add_argument(
        "--threads",
        type=int,
        metavar="T",
        help="torch threads of the one-process parts (overhead, "
        "serial, ResNet-18 compute); default: what mpicd gives one rank alone here",
    )
    return p


def main(args: argparse.Namespace) -> int:
    # h5py: 60 ms that mpicd --help (45 ms in all) would pay, as it imports every command's module
    from mpicd.bench import main as bench_main

    return bench_main(args)
