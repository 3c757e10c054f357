"""Typed dataclass sections read from YAML: field bounds, coercion without silent loss, and the
one error type that names its key. Below both the config and the algorithms' ``Params``, which
declare their keys with :func:`spec` and are read by :func:`from_mapping`.
"""

from __future__ import annotations

import dataclasses
import math
import re
import reprlib
import types
import typing
from dataclasses import field
from decimal import Decimal, InvalidOperation
from typing import Any, Literal, Union


class ConfigError(ValueError):
    """A bad configuration value; ``key`` is the dotted name of the culprit."""

    def __init__(self, key: str, message: str):
        self.key = key
        super().__init__(f"config error: {key}: {message}" if key else f"config error: {message}")


def spec(default: Any = dataclasses.MISSING, *, doc: str = "", **bounds: Any) -> Any:
    """A dataclass field with bounds checked by :func:`from_mapping`.

    bounds: ``ge``, ``gt``, ``le``, ``lt`` (numbers), ``choices`` is implied by ``Literal`` types.
    """
    kwargs: dict[str, Any] = {"metadata": {"doc": doc, **bounds}}
    if isinstance(default, (list, dict)):
        kwargs["default_factory"] = lambda d=default: type(d)(d)
    elif default is not dataclasses.MISSING:
        kwargs["default"] = default
    return field(**kwargs)


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is list:
        return f"list of {_type_name(typing.get_args(tp)[0])}"
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Return ``value`` as type ``tp`` or raise ConfigError; no silent conversions that lose data."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        if value in typing.get_args(tp) and not isinstance(value, bool):
            return value
        raise ConfigError(key, f"must be one of {_type_name(tp)}, got {show(value)}")
    if origin in (Union, types.UnionType):
        sections = [a for a in typing.get_args(tp) if dataclasses.is_dataclass(a)]
        if sections and isinstance(value, dict):  # an optional section: its own errors name their keys
            return from_mapping(sections[0], value, key)
        for option in typing.get_args(tp):
            try:
                return _coerce(value, option, key)
            except ConfigError:
                continue
        raise ConfigError(key, f"must be {_type_name(tp)}, got {show(value)}")
    if tp is type(None):
        if value is None:
            return None
        raise ConfigError(key, f"must be null, got {show(value)}")
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(key, f"must be a list, got {show(value)}")
        (item,) = typing.get_args(tp)
        return [_coerce(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(key, f"must be true or false, got {show(value)}")
    if tp is int:
        number = _number(value)
        if isinstance(number, (float, Decimal)) and math.isfinite(number) and number == int(number):
            number = int(number)  # a whole number: 5e4, 32.0
        if isinstance(number, int) and not isinstance(number, bool):
            if -_INT_LIMIT <= number < _INT_LIMIT:
                return number
            raise ConfigError(
                key, f"must be an integer in [-2**63, 2**63) (what numpy, torch and HDF5 hold), got {show(value)}"
            )
        raise ConfigError(key, f"must be an integer, got {show(value)}")
    if tp is float:
        number = _number(value)
        if isinstance(number, (int, float, Decimal)) and not isinstance(number, bool):
            try:
                number = float(number)
            except OverflowError:  # an integer beyond float's range
                number = math.inf
            if math.isfinite(number):
                return number
        raise ConfigError(key, f"must be a finite number, got {show(value)}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(key, f"must be a string, got {show(value)}")
    if tp is dict:
        if isinstance(value, dict):
            return value
        raise ConfigError(key, f"must be a mapping, got {show(value)}")
    if dataclasses.is_dataclass(tp):
        return from_mapping(tp, value, key)
    raise TypeError(f"unsupported config type {tp!r} for {key}")


_INT_LIMIT = 2**63
_SHOW = reprlib.Repr()
_SHOW.maxstring = _SHOW.maxother = _SHOW.maxlong = 80
_SHOW.maxlevel, _SHOW.maxlist, _SHOW.maxdict, _SHOW.maxtuple, _SHOW.maxset = 3, 6, 6, 6, 6


def show(value: Any) -> str:
    """A bounded repr for messages: YAML aliases can make a value's full repr astronomically long."""
    return _SHOW.repr(value)


def key_text(key: Any) -> str:
    """A key as a message shows it: a plain name as is, anything else (non-string, blank, control
    characters) as its repr, so that the message stays one readable line."""
    if isinstance(key, str) and key and key.isprintable() and key.strip() == key:
        return key
    return show(key)


_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


def _number(value: Any) -> Any:
    """``"1e-3"`` -> Decimal("1e-3"): PyYAML (YAML 1.1) reads a number without a dot, or with an
    unsigned exponent, as a string, but everyone types them; other values pass through unchanged."""
    if isinstance(value, str) and value.isascii() and _NUMBER.fullmatch(value.strip()):
        try:
            return Decimal(value.strip())
        except InvalidOperation:  # an exponent beyond Decimal's range, e.g. 1e99999999999999999999
            return value
    return value  # not text, or not ASCII (Decimal would read "١٢" or a full-width "１" as digits)


def _check_bounds(value: Any, meta: typing.Mapping, key: str) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return
    checks = {
        "ge": (lambda v, b: v >= b, ">="),
        "gt": (lambda v, b: v > b, ">"),
        "le": (lambda v, b: v <= b, "<="),
        "lt": (lambda v, b: v < b, "<"),
    }
    for name, (ok, sign) in checks.items():
        if name in meta and not ok(value, meta[name]):
            raise ConfigError(key, f"must be {sign} {meta[name]}, got {value!r}")


def from_mapping(cls: type, mapping: Any, prefix: str = "", also_known: typing.Sequence[str] = ()) -> Any:
    """Build dataclass ``cls`` from a mapping, rejecting unknown keys and bad values.

    A field named ``lambda_`` is spelt ``lambda`` in YAML (Python reserves the word).
    ``also_known``: keys the caller takes out of the mapping first (named in the unknown-key message).
    """
    if mapping is None:
        mapping = {}
    if not isinstance(mapping, dict):
        raise ConfigError(prefix, f"must be a mapping, got {show(mapping)}")
    hints = typing.get_type_hints(cls)
    fields = {f.name.rstrip("_"): f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(mapping) - set(fields), key=key_text)  # YAML keys may be numbers, null, ...
    if unknown:
        where = f"{prefix}." if prefix else ""
        known = sorted({*fields, *also_known})
        allowed = f"known keys here: {', '.join(known)}" if known else "no keys are allowed here"
        raise ConfigError(f"{where}{key_text(unknown[0])}", f"unknown key ({allowed})")
    values = {}
    for yaml_name, f in fields.items():
        key = f"{prefix}.{yaml_name}" if prefix else yaml_name
        if yaml_name not in mapping:
            continue
        value = _coerce(mapping[yaml_name], hints[f.name], key)
        _check_bounds(value, f.metadata, key)
        values[f.name] = value
    return cls(**values)


def to_mapping(obj: Any) -> Any:
    """The inverse of :func:`from_mapping` (``lambda_`` written as ``lambda``)."""
    if dataclasses.is_dataclass(obj):  # an optional section left out (null) is not written: older files' configs
        return {
            f.name.rstrip("_"): to_mapping(getattr(obj, f.name))
            for f in dataclasses.fields(obj)
            if not (f.metadata.get("omit_when_none") and getattr(obj, f.name) is None)
        }
    if isinstance(obj, dict):
        return {k: to_mapping(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_mapping(v) for v in obj]
    return obj
