"""The ``mpicd-cli`` directive: every command's ``--help``, taken from the parsers the CLI runs, so the
command-line reference cannot drift from the code."""

from __future__ import annotations

import os

from docutils import nodes
from sphinx.util.docutils import SphinxDirective


class MpicdCli(SphinxDirective):
    has_content = False

    def run(self) -> list[nodes.Node]:
        from mpicd.cli import COMMANDS, _parsers, command_list

        os.environ["COLUMNS"] = "100"  # argparse wraps to the terminal: one width for every build
        parsers = _parsers()
        out: list[nodes.Node] = [nodes.literal_block(text=command_list(parsers), language="text")]
        for name in COMMANDS:
            section = nodes.section(ids=[f"mpicd-{name}"], names=[f"mpicd {name}"])
            section += nodes.title(text=f"mpicd {name}")
            section += nodes.literal_block(text=parsers[name].format_help(), language="text")
            out.append(section)
        return out


def setup(app):
    app.add_directive("mpicd-cli", MpicdCli)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
