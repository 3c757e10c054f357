"""``mpicd sweep SWEEP``: list a sweep's runs, or answer one question about one (its ranks, arguments, status)."""

from __future__ import annotations

import argparse
import sys

from mpicd.config.sections import ConfigError
from mpicd.run.runner import EXIT_BAD_INPUT


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mpicd sweep", description="list the runs of a sweep file (jobs/sweep.sh and slurm/sweep.sbatch use this)"
    )
    p.add_argument("sweep", help="sweep YAML: config, output_dir, grid")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--pending", action="store_true", help="only the indexes of runs not yet complete")
    what.add_argument("--ranks", type=int, metavar="I", help="the MPI rank count run I needs")
    what.add_argument("--args", type=int, metavar="I", help="the mpicd arguments of run I, shell-quoted")
    what.add_argument(
        "--status",
        type=int,
        metavar="I",
        help="print done or pending for run I; exit status "
        "0 if done, 1 if pending (what scripts should test: no pipe, no race)",
    )
    return p


def main(args: argparse.Namespace) -> int:
    # torch (algorithm registry): 1.4 s that mpicd --help would pay, as it imports every command's module
    from mpicd.sweep.grid import load_sweep

    try:
        runs = load_sweep(args.sweep)
    except ConfigError as err:
        print(f"mpicd: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    chosen = next((i for i in (args.ranks, args.args, args.status) if i is not None), None)
    if chosen is not None and not 0 <= chosen < len(runs):
        print(f"mpicd: run index {chosen} out of range: {args.sweep} has runs 0..{len(runs) - 1}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        return _sweep_answer(args, runs, chosen)
    except ConfigError as err:  # a complete results file of another config (sweep.is_done)
        print(f"mpicd: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT


def _sweep_answer(args: argparse.Namespace, runs: list, chosen: int | None) -> int:
    import shlex

    from mpicd.sweep.grid import done_in, is_done  # torch, as in main

    if args.pending:
        print("\n".join(str(r.index) for r in runs if not is_done(r)))
    elif args.ranks is not None:
        print(runs[chosen].ranks)
    elif args.args is not None:
        r = runs[chosen]
        print(shlex.join(["run", str(r.config), *r.overrides, "--out", str(r.output)]))
    elif args.status is not None:
        done = is_done(runs[chosen])
        print("done" if done else "pending")
        return 0 if done else 1
    else:
        for r in runs:
            where = done_in(r)
            held = f"  (in {r.ledger} only: no complete results file)" if where == "ledger" else ""
            print(
                f"{r.index:>4}  ranks {r.ranks:>3}  {'done   ' if where else 'pending'}  {r.output}  "
                f"{' '.join(r.overrides)}{held}"
            )
    return 0
