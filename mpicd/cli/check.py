"""``mpicd check CONFIG``: validate the config and data, print the resolved config, the model and the partition; no MPI."""

from __future__ import annotations

import argparse
import sys

import yaml

from mpicd.config.loading import load_config
from mpicd.config.sections import ConfigError
from mpicd.run.check import data_lines, partition_table, warnings
from mpicd.run.runner import EXIT_BAD_INPUT


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mpicd check",
        description="validate config and data, print the resolved config and the partition; needs no MPI",
    )
    p.add_argument("config", help="YAML config file")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides")
    return p


def main(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config, args.overrides)  # before torch's import: a bad key fails at once
        # torch (seconds), here and below: not at the top, which `mpicd --help` imports with every command
        from mpicd.run.plan import prepare

        plan = prepare(config)
    except ConfigError as err:
        print(f"mpicd: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    from mpicd.models.networks import build_model, describe  # torch, as prepare

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
    print("\n".join(data_lines(plan)))
    print(partition_table(plan))
    for line in warnings(plan):
        print(f"warning: {line}")  # not an error: stdout, exit 0
    if plan.dataset.md5 is not None:  # a MedMNIST file, hashed once by its loader
        from mpicd.data.medmnist import md5_check  # torch, as prepare

        official, line = md5_check(plan.dataset.name, plan.dataset.md5)
        print(f"data file: {line}" if official else f"warning: {line}")  # not an error: stdout, exit 0
    return 0
