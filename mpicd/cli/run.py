"""``mpicd run CONFIG``: train under MPI (mpicd.run.runner does the work on every rank)."""

from __future__ import annotations

import argparse

from mpicd.run.runner import run


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mpicd run", description="train under MPI: mpirun -n CLIENTS mpicd run CONFIG")
    p.add_argument("config", help="YAML config file")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides, e.g. rounds=3")
    p.add_argument("--out", help="results file (default: the config's output)")
    existing = p.add_mutually_exclusive_group()
    existing.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in the results file from its newest checkpoint (<out>.ckpt/); the "
        "config must be the file's; no file yet: start at round 1; a complete file: exit 0 at once",
    )
    existing.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing results file and delete its checkpoints (without this or "
        "--resume, a run whose --out exists is refused)",
    )
    p.add_argument(
        "--follow-symlinks",
        action="store_true",
        help="--out may be a symbolic link: write its target (and the checkpoints beside the target); without "
        "this, a link at --out or at its checkpoint folder is refused (exit 2), dangling or not",
    )
    return p


def main(args: argparse.Namespace) -> int:
    return run(args)
