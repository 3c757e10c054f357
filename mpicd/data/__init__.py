"""Datasets for mpicd: one loader per on-disk format, each returning a standardised :class:`Dataset`
whose ``test`` and ``val`` splits no client trains on; :mod:`mpicd.data.partition` splits ``train``."""

from __future__ import annotations

from collections.abc import Callable

from mpicd.config.sections import ConfigError, DataConfig
from mpicd.data import aptos, breast_cancer, covid, imagefolder, medmnist
from mpicd.data.base import Arrays, Dataset

__all__ = ["Arrays", "Dataset", "LOADERS", "load_dataset"]

LOADERS: dict[str, Callable[[DataConfig], Dataset]] = {
    "breast_cancer": breast_cancer.load,
    "medmnist": medmnist.load,
    "imagefolder": imagefolder.load,
    "aptos": aptos.load,
    "covid": covid.load,
}


def load_dataset(cfg: DataConfig) -> Dataset:
    """Load the dataset ``cfg.name`` names; every bad input is a ConfigError naming the key and file."""
    if cfg.name not in LOADERS:
        raise ConfigError("data.name", f"unknown dataset format {cfg.name!r} (known: {', '.join(LOADERS)})")
    return LOADERS[cfg.name](cfg)
