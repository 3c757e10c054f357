"""``mpirun -n M mpicd pack SWEEP``: a sweep's pending runs in one MPI job."""

from __future__ import annotations

import argparse


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mpicd pack",
        description="run a sweep's pending runs in one MPI job: "
        "mpirun -n M mpicd pack SWEEP (groups of each run's client count)",
    )
    p.add_argument("sweep", help="sweep YAML: config, output_dir, grid")
    return p


def main(args: argparse.Namespace) -> int:
    # torch (1.4 s) and mpi4py (MPI_Init on import): mpicd --help imports every command's module
    from mpicd.sweep.pack import main as pack_sweep

    return pack_sweep(args.sweep)
