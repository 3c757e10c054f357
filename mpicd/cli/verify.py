"""``mpicd verify FILE...``: does a results file keep its promises."""

from __future__ import annotations

import argparse


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mpicd verify",
        description="check results files' invariants (run identity, config hash, finite completed "
        "rounds, nothing past them, bytes as declared, per channel too); exit 1 naming what is wrong",
    )
    p.add_argument("files", nargs="+", help="results files (.h5)")
    p.add_argument(
        "--channels",
        action="store_true",
        help="also list each channel's class and the bytes all ranks sent and received on it (mpicd.mpi.channels)",
    )
    return p


def main(args: argparse.Namespace) -> int:
    # h5py and torch (the algorithm registry): not at the top, which `mpicd --help` imports with every command
    from mpicd.results.verify import main as verify_files

    return verify_files(args.files, channels=args.channels)
