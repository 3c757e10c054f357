"""A config from YAML and dotted overrides: groups (``algorithm=fedavg``), duplicate keys refused,
method switches recorded, then the typed sections (:func:`load_config`)."""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any

import yaml

from mpicd.core.schema import ConfigError, from_mapping
from mpicd.core.schema import key_text as _key_text, show as _show

from mpicd.config.sections import Config

# Config groups, as in Hydra: ``algorithm=fedavg`` (or ``algorithm: fedavg`` in a file) selects that
# entry with its defaults, i.e. the section becomes {name: fedavg}; a mapping replaces the section.
GROUPS = ("data", "model", "algorithm")


def _select_group(key: str, value: Any) -> Any:
    return {"name": value} if key in GROUPS and isinstance(value, str) else value


class SwitchedSection(dict):
    """The ``algorithm`` section after one or more ``algorithm.name=X`` overrides that kept another
    method's keys (:func:`apply_override`): ``switches`` holds each as (previous name, X, the keys
    the section held then), in order, for the registry to refuse the keys X does not have when it
    resolves the section (:func:`mpicd.algorithms.resolve`); parsing a config never consults the
    registry. Otherwise the plain mapping it holds."""

    def __init__(self, section: dict, switches: typing.Sequence[tuple[Any, Any, tuple[str, ...]]]):
        super().__init__(section)
        self.switches = tuple(switches)


def _method_switch(section: Any, name: Any) -> tuple[Any, Any, tuple[str, ...]] | None:
    """``algorithm.name=X`` keeps the section's other keys: (the section's name, X, those keys) when
    it names another method and holds keys besides its name, else None."""
    if not isinstance(section, dict) or section.get("name", name) == name or set(section) <= {"name"}:
        return None
    return section["name"], name, tuple(sorted(set(section) - {"name"}))


def _parse_yaml(text: str, key: str, failure: str, source: str = "") -> Any:
    """``yaml.safe_load(text)``, refusing a key written twice in one mapping (YAML would keep the last,
    silently), and with every failure one ConfigError line: PyYAML's constructors raise ValueError,
    KeyError, AttributeError... on bad scalars (``2001-02-30``, ``!!int x``), RecursionError on deep
    nesting. ``key``: the dotted prefix of the parsed text; ``source``: where it comes from."""
    loader = None
    try:
        loader = yaml.SafeLoader(text)  # already reads: refuses control characters
        node = loader.get_single_node()
        _refuse_duplicates(node, key, source or "the value")
        return None if node is None else loader.construct_document(node)
    except ConfigError:
        raise
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        reason = " ".join(f"{err.context or ''} {err.problem or ''}".split())
        raise ConfigError(_key_text(key) if key else "", f"{failure}: {reason}{where}") from None
    except RecursionError:
        raise ConfigError(_key_text(key) if key else "", f"{failure}: nested too deeply") from None
    except Exception as err:  # noqa: BLE001 - PyYAML's constructors raise many types on bad input
        reason = " ".join(str(err).split())[:300] or type(err).__name__
        raise ConfigError(_key_text(key) if key else "", f"{failure}: {reason}") from None
    finally:
        if loader is not None:
            loader.dispose()


def _refuse_duplicates(node: Any, prefix: str, source: str) -> None:
    """A key twice in one YAML mapping is an error naming its dotted key and both lines (aliases are
    visited once, so a file of nested aliases costs its size, not its expansion)."""
    seen_nodes: set[int] = set()
    stack = [(node, prefix)]
    while stack:
        node, where = stack.pop()
        if node is None or id(node) in seen_nodes:
            continue
        seen_nodes.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            stack += [(child, where) for child in node.value]
        elif isinstance(node, yaml.MappingNode):
            lines: dict[tuple[str, str], int] = {}
            for key_node, value_node in node.value:
                if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                    dotted = f"{where}.{_key_text(key_node.value)}" if where else _key_text(key_node.value)
                    line = key_node.start_mark.line + 1
                    if (key_node.tag, key_node.value) in lines:
                        raise ConfigError(
                            dotted,
                            f"is set twice in {source} (lines "
                            f"{lines[key_node.tag, key_node.value]} and {line}); "
                            f"YAML would silently keep the last",
                        )
                    lines[key_node.tag, key_node.value] = line
                    stack.append((value_node, dotted))
                else:
                    stack.append((value_node, where))


def apply_override(tree: dict, assignment: str, switches: list | None = None) -> None:
    """Apply one ``dotted.key=value`` override in place; the value is parsed as YAML.

    ``section=NAME`` for a group (data, model, algorithm) selects NAME with its defaults.
    ``switches``: where an ``algorithm.name=X`` that keeps another method's keys is recorded
    (:class:`SwitchedSection`).
    """
    if "=" not in assignment:
        raise ConfigError(_key_text(assignment), "an override must look like key=value, e.g. rounds=3")
    dotted, raw = assignment.split("=", 1)
    parts = dotted.strip().split(".")
    if not all(parts):
        raise ConfigError(_key_text(dotted), "empty key in override")
    value = _parse_yaml(raw, dotted.strip(), f"cannot parse value {_show(raw)}") if raw.strip() else None
    if parts == ["algorithm", "name"]:
        if not isinstance(value, (str, type(None))):
            raise ConfigError("algorithm.name", f"must be the name of a method, e.g. codistill, got {_show(value)}")
        section = tree.get("algorithm")
        odd = [k for k in section if not isinstance(k, str)] if isinstance(section, dict) else []
        if odd:
            raise ConfigError(f"algorithm.{_key_text(odd[0])}", "unknown key (keys are names)")
        switch = _method_switch(section, value)
        if switch is not None and switches is not None:
            switches.append(switch)
    node = tree
    for i, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(".".join(parts[: i + 1]), "is not a section, cannot set a key inside it")
        node = child
    node[parts[-1]] = _select_group(parts[0], value) if len(parts) == 1 else value


def load_tree(path: str | Path | None, overrides: typing.Sequence[str] = (), switches: list | None = None) -> dict:
    """Read the YAML file (or start empty) and apply overrides; no validation yet (``switches``: as
    :func:`apply_override`)."""
    tree: Any = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError("", f"config file {str(p)!r} does not exist")
        try:
            text = p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise ConfigError("", f"config file {str(p)!r} cannot be read as UTF-8 text: {err}") from None
        tree = _parse_yaml(text, "", f"config file {str(p)!r} is not valid YAML", f"config file {str(p)!r}")
        if tree is None:  # an empty file, or only comments
            tree = {}
        if not isinstance(tree, dict):
            raise ConfigError("", f"config file {str(p)!r} must hold a mapping at the top level, got {_show(tree)}")
        tree = {key: _select_group(key, value) for key, value in tree.items()}
    for assignment in overrides:
        apply_override(tree, assignment, switches)
    return tree


def load_config(path: str | Path | None, overrides: typing.Sequence[str] = ()) -> Config:
    """Config file + overrides -> validated :class:`Config` (the algorithm section is checked by the
    registry, :func:`mpicd.algorithms.resolve`, method switches included: :class:`SwitchedSection`)."""
    switches: list = []
    cfg = from_mapping(Config, load_tree(path, overrides, switches))
    if "name" not in cfg.algorithm:
        raise ConfigError("algorithm.name", "missing (e.g. codistill)")
    if not isinstance(cfg.algorithm["name"], (str, type(None))):  # the registry would fail to look it up
        raise ConfigError(
            "algorithm.name", f"must be the name of a method, e.g. codistill, got {_show(cfg.algorithm['name'])}"
        )
    if switches:
        cfg.algorithm = SwitchedSection(cfg.algorithm, switches)
    return cfg
