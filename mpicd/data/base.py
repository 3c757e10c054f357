"""The dataset containers every loader returns, and the splits, checks and scaling they share.

Kept apart from ``__init__`` so the format modules can import them without a cycle.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from mpicd.config.sections import ConfigError, DataConfig
from mpicd.core import seeds

# Distinct random streams per split, so the validation draw never moves the held-out set.


@dataclass(frozen=True, eq=False)
class Arrays:
    """One split: ``x`` float32 (images (n, channels, H, W), tabular (n, features)), ``y`` int64 (n,)."""

    x: np.ndarray
    y: np.ndarray

    def __post_init__(self) -> None:
        x, y = self.x, self.y
        if x.dtype != np.float32 or y.dtype != np.int64 or y.ndim != 1 or len(x) != len(y):
            raise TypeError(
                f"Arrays needs float32 x and int64 (n,) y of equal length, got "
                f"x {self.x.dtype}{self.x.shape}, y {self.y.dtype}{self.y.shape}"
            )


@dataclass(frozen=True, eq=False)
class Dataset:
    """A loaded dataset, standardised with ``train``'s statistics; clients only ever train on ``train``.

    ``test`` is the held-out evaluation set, ``val`` the tuning set; ``eval_split``, ``val_split``
    and ``normalization`` (plain Python values) say how each was made, for the results file.
    ``label_map``: the class each label of the file became (position = the file's label), None when
    the labels are the file's own; ``md5``: the hex md5 of the data file the arrays were read from
    (MedMNIST), None for other formats; ``preprocessing``: what reading did to the images (channels,
    resize), where the loader says; ``warnings``: what the loader found suspect but not wrong (shown
    by ``mpicd check`` and ``mpicd run``).
    """

    name: str
    train: Arrays
    test: Arrays
    val: Arrays
    num_classes: int
    class_names: tuple[str, ...]
    kind: str
    eval_split: str
    val_split: str
    normalization: dict
    label_map: tuple[int, ...] | None = None
    md5: str | None = None
    preprocessing: str | None = None
    warnings: tuple[str, ...] = ()

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.train.x.shape[1:])

    @property
    def label_map_text(self) -> str:
        """The label mapping in one line, for the results file and ``mpicd check``, e.g.
        ``[0, 1, 1, 1, 1]: label 0 -> 'no DR'; labels 1, 2, 3, 4 -> 'DR'``; ``none`` without one."""
        if self.label_map is None:
            return "none (the file's own labels)"
        parts = []
        for c, name in enumerate(self.class_names):
            labels = [str(label) for label, new in enumerate(self.label_map) if new == c]
            parts.append(f"label{'s' if len(labels) > 1 else ''} {', '.join(labels)} -> {name!r}")
        return f"{list(self.label_map)}: {'; '.join(parts)}"


def reject_unused(cfg: DataConfig, *keys: str) -> None:
    """A key set for a format that ignores it would silently do nothing: make it an error."""
    for key in keys:
        if getattr(cfg, key) is not None:
            raise ConfigError(
                f"data.{key}", f"is not used by data.name={cfg.name!r}; remove it (got {getattr(cfg, key)!r})"
            )


def existing_path(cfg: DataConfig, want_dir: bool, what: str) -> Path:
    """``cfg.path`` as an existing folder (``want_dir``) or file, else a ConfigError naming it."""
    if cfg.path is None:
        raise ConfigError("data.path", f"data.name={cfg.name!r} needs data.path: {what}")
    path = Path(cfg.path).expanduser()
    if not (path.is_dir() if want_dir else path.is_file()):
        kind = "folder" if want_dir else "file"
        raise ConfigError("data.path", f"{kind} {str(path)!r} does not exist (expected {what})")
    return path


# What PIL raises on a file that is not an image, is cut short, or is corrupt inside (a broken chunk
# is a SyntaxError, a header claiming billions of pixels a DecompressionBombError).
UNREADABLE_IMAGE = (OSError, SyntaxError, ValueError, EOFError, Image.DecompressionBombError)


def unreadable_image(path: Path, err: BaseException, listed: str = "") -> ConfigError:
    """The one error for an image PIL cannot read, naming it (and ``listed``: where it is named, e.g.
    a CSV line) once: PIL's own message repeats the path, which is dropped from the reason."""
    where = f" ({listed})" if listed else ""
    reason = " ".join(str(err).replace(f" {str(path)!r}", "").split()) or type(err).__name__
    return ConfigError("data.path", f"cannot read image {str(path)!r}{where}: {reason}")


def resized_text(size: int, default: bool) -> str:
    """The ``preprocessing`` of a format that reads every image as grey at one square size."""
    why = "data.image_size's default for this format" if default else "data.image_size"
    return f"grey, 1 channel; every image resized to {size}x{size} ({why}; PIL bilinear)"


def read_grey_png(path: Path, size: int, listed: str = "") -> np.ndarray:
    """One image file as a (size, size) float32 grey array in [0, 1] (PIL's antialiased bilinear resize).

    ``listed``: where the image is named (e.g. a CSV line), added to the error.
    """
    try:
        with Image.open(path) as img:
            grey = img.convert("L").resize((size, size), Image.Resampling.BILINEAR)
    except UNREADABLE_IMAGE as err:
        raise unreadable_image(path, err, listed) from None
    return np.asarray(grey, dtype=np.float32) / 255.0


def check_fits_in_memory(images: int, channels: int, size: int, source: str) -> None:
    """Refuse an image size whose float32 arrays alone would exceed this machine's memory, before
    resizing anything (data.image_size=100000 would otherwise swap or be killed, not fail)."""
    try:
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return  # no way to know here
    needed = images * channels * size * size * 4
    if needed > physical:
        raise ConfigError(
            "data.image_size",
            f"{size}x{size} images: the {images} images of {source} would "
            f"take {needed / 2**30:,.0f} GiB as float32, more than this "
            f"machine's {physical / 2**30:,.0f} GiB of memory",
        )


def _rounded(fraction: float, n: int) -> int:
    """fraction * n rounded half up (numpy's round would send 0.5 to the even neighbour)."""
    return int(np.floor(fraction * n + 0.5))


def stratified_split(
    y: np.ndarray, cfg: DataConfig, class_names: tuple[str, ...], source: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sorted (train, val, test) indices: of each class's n cases, round(test_fraction * n) held out
    for test, then round(val_fraction * n) of the rest for validation, the remainder for training.

    Test and validation draw from separate streams of ``split_seed``, so ``val_fraction`` never
    changes the test set. Every class keeps at least one case in each split, or it is an error
    naming ``source``.
    """
    test_rng = seeds.rng(cfg.split_seed, seeds.HOLDOUT)
    val_rng = seeds.rng(cfg.split_seed, seeds.VAL)
    train, val, test = [], [], []
    for c, name in enumerate(class_names):
        idx = test_rng.permutation(np.flatnonzero(y == c))
        n = len(idx)
        n_test, n_val = _rounded(cfg.test_fraction, n), _rounded(cfg.val_fraction, n)
        n_train = n - n_test - n_val
        if min(n_test, n_val, n_train) < 1:
            key = "data.test_fraction" if n_test in (0, n) else "data.val_fraction"
            raise ConfigError(
                key,
                f"class {name!r} has {n} cases in {source}; test_fraction="
                f"{cfg.test_fraction} and val_fraction={cfg.val_fraction} leave {n_test} "
                f"for test, {n_val} for validation and {n_train} for training; each "
                f"must be at least 1",
            )
        rest = val_rng.permutation(np.sort(idx[n_test:]))
        test.append(idx[:n_test])
        val.append(rest[:n_val])
        train.append(rest[n_val:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(val)), np.sort(np.concatenate(test))


def stratified_holdout(
    y: np.ndarray, cfg: DataConfig, class_names: tuple[str, ...], source: str
) -> tuple[np.ndarray, np.ndarray]:
    """Sorted (train, val) indices where the test split is the user's own: round(val_fraction * n) of
    each class's n cases for validation, from ``split_seed``'s validation stream, the rest for training;
    each at least 1, or an error naming ``source``."""
    val_rng = seeds.rng(cfg.split_seed, seeds.VAL)
    train, val = [], []
    for c, name in enumerate(class_names):
        idx = val_rng.permutation(np.flatnonzero(y == c))
        n = len(idx)
        n_val = _rounded(cfg.val_fraction, n)
        if min(n_val, n - n_val) < 1:
            raise ConfigError(
                "data.val_fraction",
                f"class {name!r} has {n} cases in {source}; val_fraction={cfg.val_fraction} leaves {n_val} "
                f"for validation and {n - n_val} for training; each must be at least 1",
            )
        val.append(idx[:n_val])
        train.append(idx[n_val:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(val))


def split_descriptions(cfg: DataConfig, n_val: int, n_test: int, unit: str) -> tuple[str, str]:
    """The ``eval_split`` and ``val_split`` texts of a split made by :func:`stratified_split`."""
    return (
        f"stratified {cfg.test_fraction:g} of each class held out with split_seed={cfg.split_seed} ({n_test} {unit})",
        f"stratified {cfg.val_fraction:g} of each class, drawn with split_seed={cfg.split_seed} from "
        f"what is not held out ({n_val} {unit})",
    )


def standardise(train: Arrays, val: Arrays, test: Arrays, unit: str) -> tuple[Arrays, Arrays, Arrays, dict]:
    """Scale all three splits with the training split's mean and std, per channel (images, over
    all pixels of the channel) or per feature (tabular), so nothing of val or test leaks in.

    A constant channel gets std 1. Returns the splits and the statistics as plain floats.
    """
    axes = (0, *range(2, train.x.ndim))
    mean = train.x.mean(axis=axes, dtype=np.float64)
    std = train.x.std(axis=axes, dtype=np.float64)
    std[std == 0] = 1.0
    shape = (1, len(mean), *[1] * (train.x.ndim - 2))
    m, s = mean.astype(np.float32).reshape(shape), std.astype(np.float32).reshape(shape)
    train, val, test = (Arrays(((a.x - m) / s).astype(np.float32, copy=False), a.y) for a in (train, val, test))
    stats = {
        "mean": [float(v) for v in mean],
        "std": [float(v) for v in std],
        "computed_on": f"train split ({len(train.y)} {unit})",
    }
    return train, val, test, stats


def make_dataset(
    name: str,
    kind: str,
    train: Arrays,
    val: Arrays,
    test: Arrays,
    class_names: tuple[str, ...],
    eval_split: str,
    val_split: str,
    label_map: tuple[int, ...] | None = None,
    md5: str | None = None,
    preprocessing: str | None = None,
) -> Dataset:
    """Standardise the splits (:func:`standardise`) and wrap them in a Dataset."""
    train, val, test, stats = standardise(train, val, test, "images" if kind == "image" else "cases")
    return Dataset(
        name=name,
        train=train,
        test=test,
        val=val,
        num_classes=len(class_names),
        class_names=class_names,
        kind=kind,
        eval_split=eval_split,
        val_split=val_split,
        normalization=stats,
        label_map=label_map,
        md5=md5,
        preprocessing=preprocessing,
    )


def split_dataset(
    name: str,
    kind: str,
    x: np.ndarray,
    y: np.ndarray,
    class_names: tuple[str, ...],
    cfg: DataConfig,
    source: str,
    preprocessing: str | None = None,
) -> Dataset:
    """``x, y`` split with :func:`stratified_split` and standardised into a Dataset."""
    train, val, test = stratified_split(y, cfg, class_names, source)
    eval_split, val_split = split_descriptions(cfg, len(val), len(test), "images" if kind == "image" else "cases")
    return make_dataset(
        name,
        kind,
        *(Arrays(x[i], y[i]) for i in (train, val, test)),
        class_names,
        eval_split,
        val_split,
        preprocessing=preprocessing,
    )
