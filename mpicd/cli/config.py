"""``mpicd config``: the default config, every key with its default and meaning (``--markdown``: the key tables)."""

from __future__ import annotations

import argparse
import sys

from mpicd.config.sections import Config
from mpicd.config.text import config_tables, default_config
from mpicd.run.runner import EXIT_BAD_INPUT


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mpicd config",
        description="print the default config: every key "
        "with its default, allowed values and meaning (valid YAML to start from)",
    )
    p.add_argument("--algorithm", metavar="NAME", help="show this algorithm's own keys (default: codistill)")
    p.add_argument(
        "--markdown",
        action="store_true",
        help="every key of every algorithm as the configuration reference's Markdown tables",
    )
    return p


def main(args: argparse.Namespace) -> int:
    # here, not at the top: the registry imports torch, and every command's module is imported by `mpicd --help`
    from mpicd.algorithms import params_by_name

    params = params_by_name()  # the algorithms are chosen here: mpicd.config.text only lays their keys out
    if args.markdown:
        print(config_tables(params))
        return 0
    name = args.algorithm or Config().algorithm["name"]
    if name not in params:
        print(f"mpicd: --algorithm must be one of {', '.join(params)}, got {name!r}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(default_config(name, params))
    return 0
