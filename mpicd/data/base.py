"""The dataset containers every loader returns, and the checks and held-out split they share.

Kept apart from ``__init__`` so the format modules can import them without a cycle.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from mpicd.config import ConfigError, DataConfig

_HOLDOUT_STREAM = 0x686F6C64  # "hold": keeps the held-out split's random stream apart from others


@dataclass(frozen=True, eq=False)
class Arrays:
    """One split: ``x`` float32 (images (n, channels, H, W) in [0, 1], tabular (n, features)), ``y`` int64 (n,)."""

    x: np.ndarray
    y: np.ndarray

    def __post_init__(self) -> None:
        x, y = self.x, self.y
        if x.dtype != np.float32 or y.dtype != np.int64 or y.ndim != 1 or len(x) != len(y):
            raise TypeError(f"Arrays needs float32 x and int64 (n,) y of equal length, got "
                            f"x {self.x.dtype}{self.x.shape}, y {self.y.dtype}{self.y.shape}")


@dataclass(frozen=True, eq=False)
class Dataset:
    """A loaded dataset; ``test`` is the held-out evaluation set that no client ever trains on."""

    name: str
    train: Arrays
    test: Arrays
    val: Arrays | None
    num_classes: int
    class_names: tuple[str, ...]
    kind: str
    eval_split: str

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.train.x.shape[1:])


def reject_unused(cfg: DataConfig, *keys: str) -> None:
    """A key set for a format that ignores it would silently do nothing: make it an error."""
    for key in keys:
        if getattr(cfg, key) is not None:
            raise ConfigError(f"data.{key}", f"is not used by data.name={cfg.name!r}; remove it "
                                             f"(got {getattr(cfg, key)!r})")


def existing_path(cfg: DataConfig, want_dir: bool, what: str) -> Path:
    """``cfg.path`` as an existing folder (``want_dir``) or file, else a ConfigError naming it."""
    if cfg.path is None:
        raise ConfigError("data.path", f"data.name={cfg.name!r} needs data.path: {what}")
    path = Path(cfg.path).expanduser()
    if not (path.is_dir() if want_dir else path.is_file()):
        kind = "folder" if want_dir else "file"
        raise ConfigError("data.path", f"{kind} {str(path)!r} does not exist (expected {what})")
    return path


def read_grey_png(path: Path, size: int) -> np.ndarray:
    """One image file as a (size, size) float32 grey array in [0, 1] (PIL's antialiased bilinear resize)."""
    try:
        with Image.open(path) as img:
            grey = img.convert("L").resize((size, size), Image.Resampling.BILINEAR)
    except OSError as err:
        raise ConfigError("data.path", f"cannot read image {str(path)!r}: {err}") from None
    return np.asarray(grey, dtype=np.float32) / 255.0


def stratified_holdout(y: np.ndarray, cfg: DataConfig, class_names: tuple[str, ...],
                       source: str) -> tuple[np.ndarray, np.ndarray]:
    """Sorted (train, test) indices: round(test_fraction * n_c) of each class held out, seeded by split_seed.

    Every class keeps at least one case on each side, or it is an error naming ``source``.
    """
    rng = np.random.default_rng(np.random.SeedSequence([cfg.split_seed, _HOLDOUT_STREAM]))
    train, test = [], []
    for c, name in enumerate(class_names):
        idx = rng.permutation(np.flatnonzero(y == c))
        n_test = int(np.floor(cfg.test_fraction * len(idx) + 0.5))
        if n_test == 0 or n_test == len(idx):
            raise ConfigError("data.test_fraction", f"class {name!r} has {len(idx)} cases in {source}; "
                              f"test_fraction={cfg.test_fraction} leaves {n_test} held out and "
                              f"{len(idx) - n_test} for training, both must be at least 1")
        test.append(idx[:n_test])
        train.append(idx[n_test:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(test))


def holdout_description(cfg: DataConfig, n_test: int, unit: str) -> str:
    """The ``eval_split`` text of a held-out split made by :func:`stratified_holdout`."""
    return (f"stratified {cfg.test_fraction:g} of each class held out with split_seed={cfg.split_seed} "
            f"({n_test} {unit})")


def holdout_dataset(name: str, x: np.ndarray, y: np.ndarray, class_names: tuple[str, ...],
                    cfg: DataConfig, source: str) -> Dataset:
    """Images ``x, y`` split with :func:`stratified_holdout` into a Dataset without a val split."""
    train, test = stratified_holdout(y, cfg, class_names, source)
    return Dataset(name=name, train=Arrays(x[train], y[train]), test=Arrays(x[test], y[test]), val=None,
                   num_classes=len(class_names), class_names=class_names, kind="image",
                   eval_split=holdout_description(cfg, len(test), "images"))
