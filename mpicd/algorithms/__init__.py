"""The algorithm registry: ``algorithm.name`` in the config -> class. One line per algorithm."""

from __future__ import annotations

from ..config import ConfigError, from_mapping
from .base import Algorithm, Batch, Context
from .codistill import CoDistillation
from .local import LocalOnly

REGISTRY: dict[str, type[Algorithm]] = {
    CoDistillation.name: CoDistillation,
    LocalOnly.name: LocalOnly,
}


def resolve(section: dict) -> tuple[type[Algorithm], object]:
    """Validate the config's ``algorithm`` section against the chosen algorithm's ``Params``."""
    fields = dict(section)
    name = fields.pop("name", None)
    if name not in REGISTRY:
        raise ConfigError("algorithm.name", f"must be one of {', '.join(sorted(REGISTRY))}, got {name!r}")
    cls = REGISTRY[name]
    return cls, from_mapping(cls.Params, fields, "algorithm")


__all__ = ["Algorithm", "Batch", "Context", "REGISTRY", "resolve"]
