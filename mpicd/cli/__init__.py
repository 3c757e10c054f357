"""Command line: ``mpicd run | check | config | report | sweep | pack | ledger | verify | bench``, one module per
command (its parser and what it does); this module dispatches and keeps the exit codes."""

from __future__ import annotations

import argparse
import os
import sys

from mpicd import __version__
from mpicd.cli import bench, check, config, ledger, pack, report, run, sweep, verify
from mpicd.mpi import ending
from mpicd.run.runner import EXIT_BAD_INPUT

COMMANDS = {
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


def _parsers() -> dict[str, argparse.ArgumentParser]:
    return {name: command.parser() for name, command in COMMANDS.items()}


MPI_COMMANDS = ("run", "pack")  # started under a launcher: their status may go to the wrapper's file


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    code = _command(argv)
    if argv and argv[0] in MPI_COMMANDS:  # a clean ending without the launcher's abort banner (a wrapper's file)
        code = ending.hand_over(code)  # without MPICD_EXIT_STATUS_FILE: ``code`` as it is
    return code


def _command(argv: list[str]) -> int:
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
    try:
        args = parsers[argv[0]].parse_intermixed_args(argv[1:])
    except SystemExit as err:  # a usage error or --help, the same on every rank (the same argv)
        if argv[0] not in MPI_COMMANDS or not os.environ.get(ending.FILE):
            raise
        return err.code if isinstance(err.code, int) else int(err.code is not None)
    try:
        return COMMANDS[argv[0]].main(args)
    except BrokenPipeError:  # `mpicd sweep ... | head`: the reader has gone; nothing more to say
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # no second BrokenPipeError when Python flushes at exit
        return 0


def command_list(parsers: dict[str, argparse.ArgumentParser]) -> str:
    """``mpicd --help``: every command with its one-line description."""
    width = max(map(len, parsers))
    lines = [f"mpicd {__version__}: federated learning on class-imbalanced images, one MPI rank per client", ""]
    lines += [f"  mpicd {name:<{width}}  {p.description}" for name, p in parsers.items()]
    lines += ["", "mpicd COMMAND --help for a command's options; mpicd --version; docs/index.md for the rest"]
    return "\n".join(lines)
