"""The algorithm registry: ``algorithm.name`` in the config -> class. One line per algorithm."""

from __future__ import annotations

import dataclasses

from mpicd.algorithms.base import Algorithm, Batch, Context, Payload, Sizes
from mpicd.algorithms.ccvr import CCVR
from mpicd.algorithms.centralized import Centralized
from mpicd.algorithms.codistill import CoDistillation
from mpicd.algorithms.fedamp import FedAMP
from mpicd.algorithms.fedavg import FedAvg
from mpicd.algorithms.feddistill import FedDistill
from mpicd.algorithms.fedlc import FedLC
from mpicd.algorithms.fedntd import FedNTD
from mpicd.algorithms.fedproto import FedProto
from mpicd.algorithms.fedrod import FedRoD
from mpicd.algorithms.fedrs import FedRS
from mpicd.algorithms.local import LocalOnly
from mpicd.core.schema import ConfigError, from_mapping

REGISTRY: dict[str, type[Algorithm]] = {
    CoDistillation.name: CoDistillation,
    LocalOnly.name: LocalOnly,
    FedAvg.name: FedAvg,
    FedProto.name: FedProto,
    FedDistill.name: FedDistill,
    FedAMP.name: FedAMP,
    FedLC.name: FedLC,
    FedRS.name: FedRS,
    FedNTD.name: FedNTD,
    FedRoD.name: FedRoD,
    CCVR.name: CCVR,
    Centralized.name: Centralized,
}


def resolve(section: dict) -> tuple[type[Algorithm], object]:
    """Validate the config's ``algorithm`` section against the chosen algorithm's ``Params``; first
    each method switch the section records (``switches``: mpicd.config.loading.SwitchedSection),
    by :func:`check_switch`."""
    for previous, name, keys in getattr(section, "switches", ()):
        check_switch(previous, name, keys)
    fields = dict(section)
    name = fields.pop("name", None)
    if name not in REGISTRY:
        raise ConfigError("algorithm.name", f"must be one of {', '.join(sorted(REGISTRY))}, got {name!r}")
    cls = REGISTRY[name]
    return cls, from_mapping(cls.Params, fields, "algorithm", also_known=("name",))


def check_switch(previous, name, keys) -> None:
    """``algorithm.name=NAME`` over a section of method ``previous`` that held ``keys`` kept them:
    refuse those NAME does not have, naming ``algorithm=NAME`` (an unknown NAME: :func:`resolve`'s
    own error names the valid methods)."""
    if name not in REGISTRY:
        return
    own = {f.name.rstrip("_") for f in dataclasses.fields(REGISTRY[name].Params)}
    foreign = sorted(set(keys) - own)
    if foreign:
        raise ConfigError(
            "algorithm.name",
            f"{name} takes no {', '.join(foreign)} (left from {previous}): "
            f"to switch method, write algorithm={name} (its defaults) or "
            f"algorithm={{name: {name}, ...}}",
        )


def params_by_name() -> dict[str, type]:
    """Every algorithm's ``Params`` dataclass by ``algorithm.name``, in the registry's order: what
    ``mpicd config`` and the configuration reference document (mpicd.config.text takes it as an argument)."""
    return {name: cls.Params for name, cls in REGISTRY.items()}


MPI_OPERATIONS = {
    "p2p": "Isend/Irecv + Waitall",
    "allreduce": "Allreduce (SUM)",
    "allgather": "Allgather",
    "bcast": "Bcast",
}


def payload_table() -> str:
    """The payload table of docs/explanation/what-leaves-a-rank.md, from every algorithm's ``payloads`` declaration."""
    lines = [
        "| `algorithm.name` | options | what leaves the rank each round | shape (float32) | "
        "MPI operation (ledger kind) | bytes sent | bytes received |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, cls in REGISTRY.items():
        if not cls.payloads:
            lines.append(f"| `{name}` | – | nothing | – | – | 0 | 0 |")
        for p in cls.payloads:
            options = ", ".join(f"`{key}: {value}`" for key, value in p.when) or "–"
            if p.when and p.applies(cls.Params()):
                options += " (default)"
            if p.rounds == "last":
                options += "; **the last round only**, on top of the every-round row of the same options"
            lines.append(
                f"| `{name}` | {options} | {p.what} | {p.shape} | {MPI_OPERATIONS[p.kind]} (`{p.kind}`) | "
                f"{p.sent.replace('*', '·')} | {p.recv.replace('*', '·')} |"
            )
    return "\n".join(lines)


__all__ = [
    "Algorithm",
    "Batch",
    "Context",
    "Payload",
    "REGISTRY",
    "Sizes",
    "check_switch",
    "params_by_name",
    "payload_table",
    "resolve",
]
