"""The configuration as people read it: ``mpicd config``'s commented default YAML and the configuration
reference's key tables (``mpicd config --markdown``), from the declarations in mpicd.config.sections and each
algorithm's Params, which the caller passes in (``params``: name -> Params dataclass, in the order to list them,
mpicd.algorithms.params_by_name()): the configuration never consults the algorithm registry itself.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Union

import yaml

from mpicd import __version__
from mpicd.config.sections import Config


@dataclass(frozen=True)
class KeyDoc:
    """One key as ``mpicd config`` and the configuration reference's table show it."""

    key: str  # dotted, as written in YAML
    default: Any
    allowed: str
    doc: str


def inline(value: Any) -> str:
    """A value as one line of YAML, as the override parser reads it back."""
    return yaml.safe_dump(value, default_flow_style=True, width=10_000).strip().removesuffix("\n...").strip()


def _allowed(tp: Any, meta: typing.Mapping) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(inline(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(_allowed(a, meta) for a in typing.get_args(tp))
    if origin is list:
        return f"list of {_allowed(typing.get_args(tp)[0], {})}s"
    if tp in (int, float):
        low = next(
            (
                (f"[{meta[b]:g}", f">= {meta[b]:g}") if b == "ge" else (f"({meta[b]:g}", f"> {meta[b]:g}")
                for b in ("ge", "gt")
                if b in meta
            ),
            None,
        )
        high = next(
            (
                (f"{meta[b]:g}]", f"<= {meta[b]:g}") if b == "le" else (f"{meta[b]:g})", f"< {meta[b]:g}")
                for b in ("le", "lt")
                if b in meta
            ),
            None,
        )
        name = "integer" if tp is int else "number"
        if low and high:
            return f"{name} in {low[0]}, {high[0]}"
        return " ".join([name, *(bound[1] for bound in (low, high) if bound)])
    return {bool: "true | false", str: "string", type(None): "null"}.get(tp, getattr(tp, "__name__", str(tp)))


def describe(cls: type, prefix: str = "") -> list[KeyDoc]:
    """Every key of dataclass ``cls`` with its default, allowed values and doc, sections recursively.

    A mapping-valued field (``Config.algorithm``) is left out: its keys belong to the chosen algorithm.
    """
    hints = typing.get_type_hints(cls)
    rows: list[KeyDoc] = []
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name.rstrip('_')}"
        section = [a for a in typing.get_args(hints[f.name]) if dataclasses.is_dataclass(a)]
        if dataclasses.is_dataclass(hints[f.name]) or section:  # an optional section: its keys
            rows += describe(hints[f.name] if not section else section[0], f"{key}.")
        elif hints[f.name] is not dict:
            default = f.default_factory() if f.default is dataclasses.MISSING else f.default
            rows.append(KeyDoc(key, default, _allowed(hints[f.name], f.metadata), f.metadata.get("doc", "")))
    return rows


def _algorithm_rows(name: str, params: Mapping[str, type]) -> list[KeyDoc]:
    """The ``algorithm`` section with ``name`` chosen: the name, then that algorithm's own keys."""
    return [
        KeyDoc("algorithm.name", name, " | ".join(params), "the method; algorithm=NAME selects one with its defaults"),
        *describe(params[name], "algorithm."),
    ]


def default_config(name: str, params: Mapping[str, type]) -> str:
    """The default config with algorithm ``name`` as YAML, each key commented with its allowed values and doc;
    ``params``: every algorithm's Params by name (the module's docstring)."""
    rows = describe(Config) + _algorithm_rows(name, params)
    lines = [
        f"# mpicd {__version__}: the default configuration (algorithm {name}); after each key: allowed "
        "values; meaning.",
        f"# Another algorithm's keys: mpicd config --algorithm NAME, NAME one of {', '.join(params)}.",
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


def config_tables(params: Mapping[str, type]) -> str:
    """The configuration tables of docs/reference/configuration.md (``mpicd config --markdown``): every key,
    then every algorithm's keys (``params``: every algorithm's Params by name, the module's docstring)."""

    def row(*cells: str) -> str:
        return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"

    def described(key: str, r: KeyDoc) -> str:
        return row(key, f"`{inline(r.default)}`", r.allowed, r.doc)

    lines = [row("key", "default", "allowed values", "meaning"), row(*["---"] * 4)]
    chosen = _algorithm_rows(Config().algorithm["name"], params)[:1]
    lines += [described(f"`{r.key}`", r) for r in describe(Config) + chosen]
    lines += ["", row("`algorithm.name`", "key", "default", "allowed values", "meaning"), row(*["---"] * 5)]
    for name, cls in params.items():
        keys = describe(cls)
        lines += [row(f"`{name}`", f"`{r.key}`", f"`{inline(r.default)}`", r.allowed, r.doc) for r in keys] or [
            row(f"`{name}`", "–", "", "", "no keys of its own")
        ]
    return "\n".join(lines)
