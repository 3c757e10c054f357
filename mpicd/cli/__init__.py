"""Command line: ``mpicd run | check | config | report | sweep | pack | ledger | verify | bench``; parsing and exit
codes only."""

from __future__ import annotations

import argparse
import os
import sys

import yaml

from mpicd import __version__
from mpicd.run.check import partition_table
from mpicd.config.sections import Config, ConfigError, load_config
from mpicd.config.text import config_tables, default_config
from mpicd.run.runner import EXIT_BAD_INPUT, run


def _parsers() -> dict[str, argparse.ArgumentParser]:
    run = argparse.ArgumentParser(prog="mpicd run", description="train under MPI: mpirun -n CLIENTS mpicd run CONFIG")
    run.add_argument("config", help="YAML config file")
    run.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides, e.g. rounds=3")
    run.add_argument("--out", help="results file (default: the config's output)")
    existing = run.add_mutually_exclusive_group()
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
    check = argparse.ArgumentParser(
        prog="mpicd check",
        description="validate config and data, print the resolved config and the partition; needs no MPI",
    )
    check.add_argument("config", help="YAML config file")
    check.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides")
    report = argparse.ArgumentParser(
        prog="mpicd report", description="tables (mean ± sd over seeds) and plots from results files and runs ledgers"
    )
    report.add_argument(
        "files",
        nargs="+",
        help="results files (.h5) and runs ledgers (.jsonl, written by mpicd ledger: every run they hold, "
        "for --last 10 or --select best-val only); each run once",
    )
    report.add_argument(
        "--last", type=int, metavar="N", help="score each run over its last N completed rounds (default 1)"
    )
    report.add_argument(
        "--select",
        choices=("last", "best-val"),
        default="last",
        help="best-val: score each run at its round of highest validation minority accuracy (ties -> earliest)",
    )
    report.add_argument(
        "--split",
        choices=("test", "train"),
        default="test",
        help="train: score every metric on each client's own training images (runs made with "
        "eval.train_split=true): the audit of scoring on training data, never a held-out score",
    )
    report.add_argument(
        "--include-incomplete",
        action="store_true",
        help="also report runs that stopped before their last round (excluded and listed by default)",
    )
    report.add_argument(
        "--versus",
        metavar="METHOD",
        help="pair every other method with METHOD by seed: mean "
        "difference in minority accuracy, 95%% t-interval, wins/ties/loses",
    )
    report.add_argument(
        "--versus-metric",
        metavar="METRIC",
        help="the score --versus compares: minority_acc (default), balanced_acc, test_acc, or one class's "
        "recall by its name, e.g. recall:malignant",
    )
    report.add_argument(
        "--versus-only",
        action="store_true",
        help="print only what was read and the --versus comparison, not the cell tables",
    )
    report.add_argument(
        "--plot", metavar="FILE", help="minority accuracy against skew, ±sd bands, one panel per setting"
    )
    report.add_argument("--plot-rounds", metavar="FILE", help="minority accuracy against round (mean ± sd over seeds)")
    report.add_argument("--plot-bytes", metavar="FILE", help="bytes per round per rank of each method (log scale)")
    report.add_argument("--csv", metavar="FILE", help="write the cell table as CSV (one row per cell)")
    report.add_argument(
        "--versus-csv",
        metavar="FILE",
        help="write the --versus comparison as CSV (one row per compared cell: mean difference, interval, verdict)",
    )
    sweep = argparse.ArgumentParser(
        prog="mpicd sweep", description="list the runs of a sweep file (jobs/sweep.sh and slurm/sweep.sbatch use this)"
    )
    sweep.add_argument("sweep", help="sweep YAML: config, output_dir, grid")
    what = sweep.add_mutually_exclusive_group()
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
    verify = argparse.ArgumentParser(
        prog="mpicd verify",
        description="check results files' invariants (run identity, config hash, finite completed "
        "rounds, nothing past them, bytes as declared, per channel too); exit 1 naming what is wrong",
    )
    verify.add_argument("files", nargs="+", help="results files (.h5)")
    verify.add_argument(
        "--channels",
        action="store_true",
        help="also list each channel's class and the bytes all ranks sent and received on it (mpicd.mpi.channels)",
    )
    pack = argparse.ArgumentParser(
        prog="mpicd pack",
        description="run a sweep's pending runs in one MPI job: "
        "mpirun -n M mpicd pack SWEEP (groups of each run's client count)",
    )
    pack.add_argument("sweep", help="sweep YAML: config, output_dir, grid")
    ledger = argparse.ArgumentParser(
        prog="mpicd ledger",
        description="write the scores of a sweep's finished runs into its runs ledger (JSON lines, for git): "
        "mpicd report reads it and sweeps skip the runs it holds",
    )
    ledger.add_argument(
        "sweep", help="sweep YAML; the ledger is its key ledger, default <sweep file without .yaml>.runs.jsonl"
    )
    config = argparse.ArgumentParser(
        prog="mpicd config",
        description="print the default config: every key "
        "with its default, allowed values and meaning (valid YAML to start from)",
    )
    config.add_argument("--algorithm", metavar="NAME", help="show this algorithm's own keys (default: codistill)")
    config.add_argument(
        "--markdown", action="store_true", help="every key of every algorithm as the README's Markdown tables"
    )
    bench = argparse.ArgumentParser(
        prog="mpicd bench",
        description="measure overhead, round anatomy, parallel vs "
        "serial, start-up and the network, and project round times to 1024 ranks; "
        "start it WITHOUT mpirun: it launches its own MPI jobs (srun under Slurm)",
    )
    bench.add_argument(
        "--ranks", type=int, help="ranks of the multi-rank parts and the start-up (default 4; --quick: 2)"
    )
    bench.add_argument("--repeats", type=int, help="repeats of every measurement (default 3; --quick: 1)")
    bench.add_argument("--rounds", type=int, help="rounds per run, the first a warm-up (default 6; --quick: 2)")
    bench.add_argument(
        "--quick",
        action="store_true",
        help="smoke test: 2 ranks, 2 rounds, 1 repeat, 40 images per class, 2 message sizes",
    )
    bench.add_argument(
        "--write-ranks",
        metavar="LIST",
        help="also measure the results write per round on these rank counts, e.g. 2,4,8,16,32 "
        "(flushed every round vs checkpoint.flush_every: auto; --quick: 2,5)",
    )
    bench.add_argument(
        "--clients-per-rank",
        metavar="LIST",
        help="also measure clients per rank (mpicd.bench.clients): FedAvg and co-distillation at these client "
        "counts, e.g. 4,16,64, on 2 ranks evaluated per client and each distinct model once (before and after, "
        "--repeats times) against the pure compute timed alone, and on one rank per client up to 16",
    )
    bench.add_argument("--config", help="an image dataset's config (default configs/pneumoniamnist.yaml)")
    bench.add_argument("--data", metavar="NPZ", help="the dataset file (sets data.path)")
    bench.add_argument("--json", metavar="FILE", help="write every figure as JSON")
    bench.add_argument("--plot", metavar="FILE", help="the projection as a plot (needs matplotlib)")
    bench.add_argument(
        "--timeout", type=float, metavar="S", help="seconds before a launched job is killed (default 3600)"
    )
    bench.add_argument(
        "--threads",
        type=int,
        metavar="T",
        help="torch threads of the one-process parts (overhead, "
        "serial, ResNet-18 compute); default: what mpicd gives one rank alone here",
    )
    return {
        "run": run,
        "check": check,
        "config": config,
        "report": report,
        "sweep": sweep,
        "pack": pack,
        "ledger": ledger,
        "verify": verify,
        "bench": bench,
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parsers = _parsers()
    if argv[:1] in (["--version"], ["-V"]):
        print(f"mpicd {__version__}")
        return 0
    if argv[:1] in (["--help"], ["-h"], ["help"]):
        print(command_list(parsers))
        return 0
    if not argv or argv[0] not in parsers:
        print(
            f"usage: mpicd {{{','.join(parsers)}}} ...  (mpicd COMMAND --help for more; mpicd --version)",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    args = parsers[argv[0]].parse_intermixed_args(argv[1:])
    commands = {
        "check": check,
        "config": config,
        "run": run,
        "report": report,
        "sweep": sweep,
        "pack": pack,
        "ledger": ledger,
        "verify": verify,
        "bench": bench,
    }
    try:
        return commands[argv[0]](args)
    except BrokenPipeError:  # `mpicd sweep ... | head`: the reader has gone; nothing more to say
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # no second BrokenPipeError when Python flushes at exit
        return 0


def verify(args: argparse.Namespace) -> int:
    from mpicd.results.verify import main

    return main(args.files, channels=args.channels)


def command_list(parsers: dict[str, argparse.ArgumentParser]) -> str:
    """``mpicd --help``: every command with its one-line description."""
    width = max(map(len, parsers))
    lines = [f"mpicd {__version__}: federated learning on class-imbalanced images, one MPI rank per client", ""]
    lines += [f"  mpicd {name:<{width}}  {p.description}" for name, p in parsers.items()]
    lines += ["", "mpicd COMMAND --help for a command's options; mpicd --version; README.md for the rest"]
    return "\n".join(lines)


def bench(args: argparse.Namespace) -> int:
    from mpicd.bench import main

    return main(args)


def pack(args: argparse.Namespace) -> int:
    from mpicd.sweep.pack import main

    return main(args.sweep)


def ledger(args: argparse.Namespace) -> int:
    from mpicd.sweep.grid import write_ledger

    try:
        done = write_ledger(args.sweep)
    except ConfigError as err:
        print(f"mpicd: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(done.line())
    return 0


def check(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config, args.overrides)  # before torch's import: a bad key fails at once
        from mpicd.run.plan import prepare

        plan = prepare(config)
    except ConfigError as err:
        print(f"mpicd: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    from mpicd.models.networks import build_model, describe

    print(yaml.safe_dump(plan.resolved_config, sort_keys=False), end="")
    cfg = plan.config
    print(
        describe(
            build_model(
                cfg.model.name,
                plan.dataset.input_shape,
                plan.dataset.num_classes,
                cfg.model.feature_dim,
                cfg.model.hidden,
            )
        )
    )
    print(partition_table(plan))
    if plan.dataset.md5 is not None:  # a MedMNIST file, hashed once by its loader
        from mpicd.data.medmnist import md5_check

        official, line = md5_check(plan.dataset.name, plan.dataset.md5)
        print(f"data file: {line}" if official else f"warning: {line}")  # not an error: stdout, exit 0
    return 0


def config(args: argparse.Namespace) -> int:
    from mpicd.algorithms import REGISTRY

    if args.markdown:
        print(config_tables())
        return 0
    name = args.algorithm or Config().algorithm["name"]
    if name not in REGISTRY:
        print(f"mpicd: --algorithm must be one of {', '.join(REGISTRY)}, got {name!r}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(default_config(name))
    return 0


def report(args: argparse.Namespace) -> int:
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
    for path, draw in ((args.plot, rep.plot), (args.plot_rounds, rep.plot_rounds), (args.plot_bytes, rep.plot_bytes)):
        if path:
            draw(cells, path)
            print(f"plot: {path}")
    if args.csv:
        rep.write_csv(cells, args.csv)
        print(f"csv: {args.csv}")
    if args.versus_csv:
        rep.write_versus_csv(cells, args.versus, args.versus_csv, metric)
        print(f"csv: {args.versus_csv}")
    return 0


def sweep(args: argparse.Namespace) -> int:
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

    from mpicd.sweep.grid import done_in, is_done

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
