"""``mpicd ledger SWEEP``: the scores of a sweep's finished runs into its runs ledger."""

from __future__ import annotations

import argparse
import sys

from mpicd.config.sections import ConfigError
from mpicd.run.runner import EXIT_BAD_INPUT


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mpicd ledger",
        description="write the scores of a sweep's finished runs into its runs ledger (JSON lines, for git): "
        "mpicd report reads it and sweeps skip the runs it holds",
    )
    p.add_argument(
        "sweep", help="sweep YAML; the ledger is its key ledger, default <sweep file without .yaml>.runs.jsonl"
    )
    return p


def main(args: argparse.Namespace) -> int:
    # torch (algorithm registry): 1.4 s that mpicd --help would pay, as it imports every command's module
    from mpicd.sweep.grid import write_ledger

    try:
        done = write_ledger(args.sweep)
    except ConfigError as err:
        print(f"mpicd: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(done.line())
    return 0
