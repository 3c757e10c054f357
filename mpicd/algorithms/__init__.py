"""The algorithm registry: ``algorithm.name`` in the config -> class. One line per algorithm."""

from __future__ import annotations

from ..config import ConfigError, from_mapping
from .base import Algorithm, Batch, Context
from .centralized import Centralized
from .codistill import CoDistillation
from .fedamp import FedAMP
from .fedavg import FedAvg
from .feddistill import FedDistill
from .fedproto import FedProto
from .local import LocalOnly

REGISTRY: dict[str, type[Algorithm]] = {
    CoDistillation.name: CoDistillation,
    LocalOnly.name: LocalOnly,
    FedAvg.name: FedAvg,
    FedProto.name: FedProto,
    FedDistill.name: FedDistill,
    FedAMP.name: FedAMP,
    Centralized.name: Centralized,
}


def resolve(section: dict) -> tuple[type[Algorithm], object]:
    """Validate the config's ``algorithm`` section against the chosen algorithm's ``Params``."""
    fields = dict(section)
    name = fields.pop("name", None)
    if name not in REGISTRY:
        raise ConfigError("algorithm.name", f"must be one of {', '.join(sorted(REGISTRY))}, got {name!r}")
    cls = REGISTRY[name]
    return cls, from_mapping(cls.Params, fields, "algorithm", also_known=("name",))


__all__ = ["Algorithm", "Batch", "Context", "REGISTRY", "resolve"]
