"""``mpicd report FILE...``: tables and plots from results files and runs ledgers."""

from __future__ import annotations

import argparse
import sys

from mpicd.core.paths import PathRefused, refuse_link
from mpicd.run.runner import EXIT_BAD_INPUT

OUTPUTS = ("--plot", "--plot-rounds", "--plot-bytes", "--csv", "--versus-csv")  # every file the report writes


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mpicd report", description="tables (mean ± sd over seeds) and plots from results files and runs ledgers"
    )
    p.add_argument(
        "files",
        nargs="+",
        help="results files (.h5) and runs ledgers (.jsonl, written by mpicd ledger: every run they hold, "
        "for --last 10 or --select best-val only); each run once",
    )
    p.add_argument("--last", type=int, metavar="N", help="score each run over its last N completed rounds (default 1)")
    p.add_argument(
        "--select",
        choices=("last", "best-val"),
        default="last",
        help="best-val: score each run at its round of highest validation minority accuracy (ties -> earliest)",
    )
    p.add_argument(
        "--split",
        choices=("test", "train"),
        default="test",
        help="train: score every metric on each client's own training images (runs made with "
        "eval.train_split=true): the audit of scoring on training data, never a held-out score",
    )
    p.add_argument(
        "--include-incomplete",
        action="store_true",
        help="also report runs that stopped before their last round (excluded and listed by default)",
    )
    p.add_argument(
        "--versus",
        metavar="METHOD",
        help="pair every other method with METHOD by seed: mean "
        "difference in minority accuracy, 95%% t-interval, wins/ties/loses",
    )
    p.add_argument(
        "--versus-metric",
        metavar="METRIC",
        help="the score --versus compares: minority_acc (default), balanced_acc, test_acc, personal_acc "
        "(weighted by each client's own label distribution), or one class's recall by its name, e.g. recall:malignant",
    )
    p.add_argument(
        "--versus-only",
        action="store_true",
        help="print only what was read and the --versus comparison, not the cell tables",
    )
    p.add_argument("--plot", metavar="FILE", help="minority accuracy against skew, ±sd bands, one panel per setting")
    p.add_argument("--plot-rounds", metavar="FILE", help="minority accuracy against round (mean ± sd over seeds)")
    p.add_argument("--plot-bytes", metavar="FILE", help="bytes per round per rank of each method (log scale)")
    p.add_argument("--csv", metavar="FILE", help="write the cell table as CSV (one row per cell)")
    p.add_argument(
        "--versus-csv",
        metavar="FILE",
        help="write the --versus comparison as CSV (one row per compared cell: mean difference, interval, verdict)",
    )
    p.add_argument(
        "--follow-symlinks",
        action="store_true",
        help="write through a symbolic link at an output path (--csv, --versus-csv, --plot*) to its target; "
        "without it such a path is refused (exit 2) and nothing is written",
    )
    return p


def main(args: argparse.Namespace) -> int:
    # h5py: 60 ms that mpicd --help (45 ms in all) would pay, as it imports every command's module
    from mpicd import report as rep

    if args.last is not None and (args.last < 1 or args.select != "last"):
        print("mpicd: --last must be >= 1 and goes with --select last only", file=sys.stderr)
        return EXIT_BAD_INPUT
    needs_versus = (
        ("--versus-csv", args.versus_csv),
        ("--versus-metric", args.versus_metric),
        ("--versus-only", args.versus_only),
    )
    for flag, given in needs_versus:
        if given and not args.versus:
            print(f"mpicd: {flag} needs --versus METHOD (the method to compare against)", file=sys.stderr)
            return EXIT_BAD_INPUT
    metric = args.versus_metric or "minority_acc"
    try:
        rep.check_metric(metric)
    except rep.ReportError as err:
        print(f"mpicd: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:  # before any work: a refused path costs nothing and leaves no file
        for flag in OUTPUTS:
            path = getattr(args, flag[2:].replace("-", "_"))
            if path and not args.follow_symlinks:
                refuse_link(path, flag)
    except PathRefused as err:
        print(f"mpicd: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    last = args.last or 1
    try:
        runs, notes = rep.collect(args.files, last, args.select, args.include_incomplete, args.split)
        if args.split == "train":
            notes.insert(0, "scored on each client's own TRAINING images (--split train): an audit, not held-out")
        if not runs:
            raise rep.ReportError("no run left to report: " + "; ".join(notes) + " (--include-incomplete reports them)")
        cells = rep.group(runs)
        text = rep.render(cells, last, args.select, notes, args.versus, metric, args.versus_only)
    except (OSError, KeyError, ValueError) as err:
        print(f"mpicd: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(text)
    follow = args.follow_symlinks
    try:  # a link planted since the check above is refused here, not written through
        for path, draw in (
            (args.plot, rep.plot),
            (args.plot_rounds, rep.plot_rounds),
            (args.plot_bytes, rep.plot_bytes),
        ):
            if path:
                draw(cells, path, follow=follow)
                print(f"plot: {path}")
        if args.csv:
            rep.write_csv(cells, args.csv, follow=follow)
            print(f"csv: {args.csv}")
        if args.versus_csv:
            rep.write_versus_csv(cells, args.versus, args.versus_csv, metric, follow=follow)
            print(f"csv: {args.versus_csv}")
    except PathRefused as err:
        print(f"mpicd: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return 0
