"""The configuration as people read it: ``mpicd config``'s commented default YAML and the README's key
tables (``mpicd config --markdown``), from the declarations in mpicd.config.sections and each algorithm's Params.
"""

from __future__ import annotations

import dataclasses

from mpicd import __version__
from mpicd.config.sections import Config, KeyDoc, describe, inline


def _algorithm_rows(name: str) -> list[KeyDoc]:
    """The ``algorithm`` section with ``name`` chosen: the name, then that algorithm's own keys."""
    from mpicd.algorithms import REGISTRY

    return [
        KeyDoc(
            "algorithm.name", name, " | ".join(REGISTRY), "the method; algorithm=NAME selects one with its defaults"
        ),
        *describe(REGISTRY[name].Params, "algorithm."),
    ]


def default_config(name: str) -> str:
    """The default config with algorithm ``name`` as YAML, each key commented with its allowed values and doc."""
    from mpicd.algorithms import REGISTRY

    rows = describe(Config) + _algorithm_rows(name)
    lines = [
        f"# mpicd {__version__}: the default configuration (algorithm {name}); after each key: allowed "
        "values; meaning.",
        f"# Another algorithm's keys: mpicd config --algorithm NAME, NAME one of {', '.join(REGISTRY)}.",
        "# On the command line: dotted key=value overrides, e.g. train.lr=1e-3 or algorithm=fedavg.",
    ]
    # A section that is off unless present (privacy) is printed commented out: the output stays a
    # loadable config of the defaults, and uncommenting it (with the values it needs) turns it on.
    optional = {f.name for f in dataclasses.fields(Config) if f.metadata.get("omit_when_none")}
    entries, section = [], ""
    for row in rows:
        head, _, leaf = row.key.rpartition(".")
        off = "# " if head.split(".")[0] in optional else ""
        if head != section:
            if head:  # a top-level key after a section needs no header
                entries.append((f"{off}{head}:", "off unless present; uncomment to turn on" if off else ""))
            section = head
        comment = f"{row.allowed}; {row.doc}" if row.doc else row.allowed
        entries.append((f"{off}{'  ' if head else ''}{leaf}: {inline(row.default)}", comment))
    width = max(len(text) for text, _ in entries) + 2
    lines += [f"{text:<{width}}# {comment}" if comment else text for text, comment in entries]
    return "\n".join(lines)


def config_tables() -> str:
    """The README's configuration tables (``mpicd config --markdown``): every key, then every algorithm's keys."""
    from mpicd.algorithms import REGISTRY

    def row(*cells: str) -> str:
        return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"

    def described(key: str, r: KeyDoc) -> str:
        return row(key, f"`{inline(r.default)}`", r.allowed, r.doc)

    lines = [row("key", "default", "allowed values", "meaning"), row(*["---"] * 4)]
    lines += [described(f"`{r.key}`", r) for r in describe(Config) + _algorithm_rows(Config().algorithm["name"])[:1]]
    lines += ["", row("`algorithm.name`", "key", "default", "allowed values", "meaning"), row(*["---"] * 5)]
    for name, cls in REGISTRY.items():
        keys = describe(cls.Params)
        lines += [row(f"`{name}`", f"`{r.key}`", f"`{inline(r.default)}`", r.allowed, r.doc) for r in keys] or [
            row(f"`{name}`", "–", "", "", "no keys of its own")
        ]
    return "\n".join(lines)
