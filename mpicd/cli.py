"""Command line: ``mpicd run | check | report | sweep``. Argument parsing and exit codes only."""

from __future__ import annotations

import argparse
import sys
from typing import Callable, TypeVar

import yaml

from .config import ConfigError, load_config

T = TypeVar("T")
EXIT_BAD_INPUT = 2


def _parsers() -> dict[str, argparse.ArgumentParser]:
    run = argparse.ArgumentParser(prog="mpicd run", description="train under MPI: mpirun -n CLIENTS mpicd run CONFIG")
    run.add_argument("config", help="YAML config file")
    run.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides, e.g. rounds=3")
    run.add_argument("--out", help="results file (default: the config's output)")
    check = argparse.ArgumentParser(prog="mpicd check", description="validate config and data, print the "
                                    "resolved config and the partition; needs no MPI")
    check.add_argument("config", help="YAML config file")
    check.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides")
    report = argparse.ArgumentParser(prog="mpicd report", description="tables (mean ± sd over seeds) "
                                     "and plots from results files")
    report.add_argument("files", nargs="+", help="results files (.h5)")
    report.add_argument("--last", type=int, default=1, help="average each run over its last N rounds")
    report.add_argument("--plot", help="also draw minority accuracy against skew into this image file")
    sweep = argparse.ArgumentParser(prog="mpicd sweep", description="list the runs of a sweep file "
                                    "(jobs/sweep.sh and slurm/sweep.sbatch use this)")
    sweep.add_argument("sweep", help="sweep YAML: config, output_dir, grid")
    what = sweep.add_mutually_exclusive_group()
    what.add_argument("--pending", action="store_true", help="only the indexes of runs not yet complete")
    what.add_argument("--ranks", type=int, metavar="I", help="the MPI rank count run I needs")
    what.add_argument("--args", type=int, metavar="I", help="the mpicd arguments of run I, shell-quoted")
    return {"run": run, "check": check, "report": report, "sweep": sweep}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parsers = _parsers()
    if not argv or argv[0] not in parsers:
        print(f"usage: mpicd {{{','.join(parsers)}}} ...  (mpicd COMMAND --help for more)", file=sys.stderr)
        return EXIT_BAD_INPUT
    args = parsers[argv[0]].parse_intermixed_args(argv[1:])
    return {"check": check, "run": run, "report": report, "sweep": sweep}[argv[0]](args)


def check(args: argparse.Namespace) -> int:
    from .plan import prepare

    try:
        plan = prepare(load_config(args.config, args.overrides))
    except ConfigError as err:
        print(f"mpicd: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(yaml.safe_dump(plan.resolved_config, sort_keys=False), end="")
    print(partition_table(plan))
    return 0


def report(args: argparse.Namespace) -> int:
    from .report import group, plot, render, summarize

    if args.last < 1:
        print("mpicd: --last must be >= 1", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        cells = group(summarize(path, args.last) for path in args.files)
    except (OSError, KeyError, ValueError) as err:
        print(f"mpicd: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(render(cells, args.last))
    if args.plot:
        plot(cells, args.plot)
        print(f"plot: {args.plot}")
    return 0


def sweep(args: argparse.Namespace) -> int:
    import shlex

    from .sweep import is_done, load_sweep

    try:
        runs = load_sweep(args.sweep)
    except ConfigError as err:
        print(f"mpicd: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    chosen = args.ranks if args.ranks is not None else args.args
    if chosen is not None and not 0 <= chosen < len(runs):
        print(f"mpicd: run index {chosen} out of range: {args.sweep} has runs 0..{len(runs) - 1}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.pending:
        print("\n".join(str(r.index) for r in runs if not is_done(r)))
    elif args.ranks is not None:
        print(runs[chosen].ranks)
    elif args.args is not None:
        r = runs[chosen]
        print(shlex.join(["run", str(r.config), *r.overrides, "--out", str(r.output)]))
    else:
        for r in runs:
            print(f"{r.index:>4}  ranks {r.ranks:>3}  {'done   ' if is_done(r) else 'pending'}  {r.output}  "
                  f"{' '.join(r.overrides)}")
    return 0


def partition_table(plan) -> str:
    """Per client: expertise class, training images per class, held-out images per class."""
    names = plan.dataset.class_names
    test_counts = [int((plan.dataset.test.y == c).sum()) for c in range(plan.dataset.num_classes)]
    header = ["client", "expertise"] + [f"train:{n}" for n in names] + [f"test:{n}" for n in names]
    rows = [[str(i), names[int(plan.partition.expertise[i])]]
            + [str(int(v)) for v in plan.partition.train_counts[i]] + [str(v) for v in test_counts]
            for i in range(plan.config.clients)]
    widths = [max(len(r[j]) for r in [header, *rows]) for j in range(len(header))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(r, widths)) for r in [header, *rows]]
    lines.append(f"held-out set: {plan.dataset.eval_split}; no client trains on it")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from .comm import Comm
    from .loop import run as run_rounds
    from .plan import prepare
    from .runtime import abort_on_exception, place

    comm = Comm()
    with abort_on_exception(comm.mpi):
        try:
            plan = agreed(comm, lambda: prepare(_config_for(comm, args)))
            placement = agreed(comm, lambda: place(comm.mpi, plan.config.device))
        except ConfigError:
            return EXIT_BAD_INPUT
        out = args.out or plan.config.output
        if comm.rank == 0:
            print(f"mpicd: {plan.algorithm_cls.name} on {plan.dataset.name}, {comm.size} clients, "
                  f"{plan.config.rounds} rounds, {placement.device} ({placement.threads} threads/rank) "
                  f"-> {out}", flush=True)
        run_rounds(plan, comm, placement.device, out, log=lambda line: print(line, flush=True))
        if comm.rank == 0:
            print(f"mpicd: results written to {out}", flush=True)
    return 0


def _config_for(comm, args):
    config = load_config(args.config, args.overrides)
    if config.clients != comm.size:
        raise ConfigError("clients", f"the config has {config.clients} clients but the job has "
                                     f"{comm.size} MPI ranks: run mpirun -n {config.clients}, or set clients={comm.size}")
    return config


def agreed(comm, step: Callable[[], T]) -> T:
    """Run ``step`` on every rank; if it raises ConfigError anywhere, every rank raises.

    The lowest failing rank prints its message, so the user sees one clear error and no rank
    is left waiting in a collective that the others never reach.
    """
    error: ConfigError | None = None
    try:
        result = step()
    except ConfigError as err:
        error = err
    failing = comm.first_failing_rank(error is not None)
    if failing is not None:
        if comm.rank == failing:
            print(f"mpicd: {error}", file=sys.stderr, flush=True)
        raise error or ConfigError("", f"rank {failing} rejected the input (see its message)")
    return result
