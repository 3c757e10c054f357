"""MedMNIST ``.npz`` files (PneumoniaMNIST, BreastMNIST, RetinaMNIST, ...): official train/val/test splits.

The official test split is the held-out evaluation set and the official val split the tuning
set, so no client ever trains on either; every class must appear in all three.

``data.label_map`` merges or reorders the file's labels (position = the file's label, value = the
new class; RetinaMNIST's [0, 1, 1, 1, 1] is grade 0 vs grades 1-4) before anything else sees them,
and ``data.classes`` names the resulting classes. The file's md5 is computed once per load (under
``mpicd run`` on one rank per node, :mod:`mpicd.data.node_shared`) and kept in the Dataset;
:func:`md5_check` compares it with MedMNIST's published checksums.
"""

from __future__ import annotations

import hashlib
import zipfile
import zlib
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from mpicd.config.sections import ConfigError, DataConfig
from mpicd.data.base import reject_unused, Arrays, check_fits_in_memory, Dataset, existing_path, make_dataset

SPLITS = ("train", "val", "test")
KNOWN_CLASS_NAMES = {
    "pneumoniamnist": ("normal", "pneumonia"),
    "breastmnist": ("malignant", "normal_benign"),
}
# The md5 MedMNIST publishes for its 28x28 files (``medmnist/info.py`` of the MedMNIST package, v2.1.0).
OFFICIAL_MD5 = {
    "pneumoniamnist": "28209eda62fecd6e6a2d98b1501bb15f",
    "retinamnist": "bd4c0672f1bba3e3a89f0e4e876791e4",
    "breastmnist": "750601b1f35ba3300ea97c75c52ff8f6",
}
# Files known not to be official, named in the warning.
KNOWN_COPIES = {
    "fba64bbd7011d51bc110a3641f8e049d": "the unofficial PneumoniaMNIST copy (4707 training images in "
    "another order) that ../shared/data once held",
}


def _check_images(raw: np.ndarray, key: str, path: Path) -> None:
    if (
        raw.dtype != np.uint8
        or not (raw.ndim == 3 or (raw.ndim == 4 and raw.shape[-1] == 3))
        or min(raw.shape[1:3]) < 1
    ):
        raise ConfigError(
            "data.path",
            f"{key} in {str(path)!r} is {raw.dtype} {raw.shape}; MedMNIST images "
            f"are uint8 (n, H, W) or (n, H, W, 3) with H, W >= 1",
        )


def _images(raw: np.ndarray, key: str, path: Path) -> np.ndarray:
    """uint8 (n, H, W) or (n, H, W, 3) -> float32 (n, channels, H, W) in [0, 1]."""
    _check_images(raw, key, path)
    x = raw.astype(np.float32) / 255.0
    return x[:, None] if x.ndim == 3 else np.ascontiguousarray(x.transpose(0, 3, 1, 2))


def _labels(raw: np.ndarray, key: str, n: int, path: Path, images: int) -> np.ndarray:
    """(n, 1) or (n,) non-negative integers -> int64 (n,); multi-label files (ChestMNIST) are refused.

    ``images``: how many the whole file holds; a label that high would need more classes than images.
    """
    if raw.shape not in ((n, 1), (n,)) or not np.issubdtype(raw.dtype, np.integer) or (raw.size and raw.min() < 0):
        raise ConfigError(
            "data.path",
            f"{key} in {str(path)!r} is {raw.dtype} {raw.shape}; expected one "
            f"non-negative integer label per image, shape ({n}, 1)",
        )
    if raw.size and raw.max() >= images:
        raise ConfigError(
            "data.path",
            f"{key} in {str(path)!r} has label {raw.max()}, but the file holds only "
            f"{images} images, fewer than the classes 0..{raw.max()} that label implies",
        )
    return raw.reshape(n).astype(np.int64)


def _resize(x: np.ndarray, size: int) -> np.ndarray:
    if x.shape[2:] == (size, size):
        return x
    out = F.interpolate(torch.from_numpy(x), size=(size, size), mode="bilinear", align_corners=False, antialias=True)
    return out.clamp_(0.0, 1.0).numpy()


def file_md5(path: Path) -> str:
    """The hex md5 of the file, read in 1 MiB chunks (a few milliseconds for a 28x28 MedMNIST file)."""
    digest = hashlib.md5(usedforsecurity=False)
    try:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    except OSError as err:
        raise ConfigError("data.path", f"cannot read {str(path)!r}: {err}") from None
    return digest.hexdigest()


def md5_check(name: str, md5: str) -> tuple[bool, str]:
    """(official, one line) for a MedMNIST file named ``name`` (the stem, lower case) whose md5 is
    ``md5``: ``official MedMNIST v2 file ... (md5 ...)``, or why it is not (a modified or unknown
    file is not an error: the line is a warning naming the expected and the found checksum)."""
    for known, expected in OFFICIAL_MD5.items():
        if md5 == expected:
            renamed = "" if name == known else f", read as {name}.npz"
            return True, f"official MedMNIST v2 file {known}.npz (md5 {md5}{renamed})"
    copy = f"; it is {KNOWN_COPIES[md5]}" if md5 in KNOWN_COPIES else ""
    if name in OFFICIAL_MD5:
        return False, (
            f"{name}.npz is not the official MedMNIST v2 file: expected md5 {OFFICIAL_MD5[name]} "
            f"(published by MedMNIST), found {md5}{copy}; results on it will not match results on the "
            f"official file"
        )
    return False, (
        f"{name}.npz is not a MedMNIST v2 file whose checksum mpicd knows (found md5 {md5}{copy}; "
        f"known: {', '.join(f'{k}.npz {v}' for k, v in OFFICIAL_MD5.items())})"
    )


# What numpy and zipfile raise on a cut-short, corrupt or foreign file, or on a pickled array.
UNREADABLE = (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error)


def _read(path: Path) -> dict[str, np.ndarray]:
    """The six arrays of the MedMNIST layout, each read whole here, so a truncated or corrupt archive
    fails naming the file (and the array), not later inside training."""
    try:
        npz = np.load(path, allow_pickle=False)
    except UNREADABLE as err:
        raise ConfigError("data.path", f"{str(path)!r} is not a readable .npz file: {err}") from None
    if not isinstance(npz, np.lib.npyio.NpzFile):
        raise ConfigError(
            "data.path",
            f"{str(path)!r} holds one {npz.dtype} array {npz.shape} (a .npy file), "
            f"not a .npz archive in the MedMNIST layout",
        )
    arrays = {}
    with npz:
        for split in SPLITS:
            for key in (f"{split}_images", f"{split}_labels"):
                if key not in npz.files:
                    raise ConfigError(
                        "data.path",
                        f"{str(path)!r} has no array {key!r} (it has "
                        f"{sorted(npz.files)}); expected the MedMNIST layout",
                    )
                try:
                    arrays[key] = npz[key]
                except UNREADABLE as err:
                    raise ConfigError(
                        "data.path",
                        f"{str(path)!r}: array {key!r} cannot be read (a truncated or corrupt file?): {err}",
                    ) from None
                if not isinstance(arrays[key], np.ndarray):  # a zip member that is not a .npy file
                    raise ConfigError("data.path", f"{str(path)!r}: {key!r} is not a .npy array")
    return arrays


def _class_names(cfg: DataConfig, name: str, labels: int, path: Path) -> tuple[tuple[str, ...], np.ndarray | None]:
    """The class names after ``data.label_map`` and the map as a lookup table (None: no map), for a
    file of ``labels`` labels (0..labels-1); each bad key is a ConfigError naming it."""
    default = tuple(f"class{c}" for c in range(labels))
    own = KNOWN_CLASS_NAMES.get(name.split("_")[0], default)
    if len(own) != labels:
        raise ConfigError(
            "data.path",
            f"{str(path)!r} has labels 0..{labels - 1}, but a {name} file has {len(own)} classes {own}",
        )
    lookup = None
    if cfg.label_map is not None:
        if len(cfg.label_map) != labels:
            raise ConfigError(
                "data.label_map",
                f"has {len(cfg.label_map)} entries {cfg.label_map}, but {str(path)!r} has {labels} labels "
                f"0..{labels - 1}: one entry per label of the file (position = the file's label, value = its "
                f"new class)",
            )
        lookup = np.asarray(cfg.label_map, dtype=np.int64)
        own = tuple("+".join(own[label] for label in np.flatnonzero(lookup == c)) for c in range(lookup.max() + 1))
    if cfg.classes is None:
        return own, lookup
    classes = tuple(cfg.classes)
    after = f"data.label_map {cfg.label_map} makes" if lookup is not None else f"{str(path)!r} has"
    if len(classes) != len(own):
        raise ConfigError(
            "data.classes",
            f"names {len(classes)} classes {list(classes)}, but {after} {len(own)} classes "
            f"0..{len(own) - 1}: give one name per class, or null",
        )
    if len(set(classes)) != len(classes) or not all(c.strip() for c in classes):
        raise ConfigError("data.classes", f"names must be distinct and not blank, got {list(classes)}")
    return classes, lookup


def load(cfg: DataConfig) -> Dataset:
    reject_unused(cfg, "display_name")
    path = existing_path(cfg, want_dir=False, what="a MedMNIST .npz file")
    arrays = _read(path)
    first = arrays["train_images"]
    for split in SPLITS:
        raw = arrays[f"{split}_images"]
        _check_images(raw, f"{split}_images", path)  # before converting or resizing anything
        if raw.shape[1:] != first.shape[1:]:
            raise ConfigError(
                "data.path",
                f"{split}_images in {str(path)!r} are {raw.shape[1:]} but "
                f"train_images are {first.shape[1:]}: every split needs the same "
                f"image size and channels",
            )
    total = sum(len(arrays[f"{split}_labels"]) for split in SPLITS)
    labels = {
        split: _labels(arrays.pop(f"{split}_labels"), f"{split}_labels", len(arrays[f"{split}_images"]), path, total)
        for split in SPLITS
    }
    name = path.stem.lower()
    class_names, lookup = _class_names(cfg, name, int(max(y.max(initial=0) for y in labels.values())) + 1, path)
    if lookup is not None:
        labels = {split: lookup[y] for split, y in labels.items()}
    num_classes = len(class_names)
    for split, y in labels.items():
        absent = np.flatnonzero(np.bincount(y, minlength=num_classes) == 0)
        if len(absent):
            mapped = f" (after data.label_map {cfg.label_map})" if lookup is not None else ""
            raise ConfigError(
                "data.path",
                f"{str(path)!r}: class {class_names[absent[0]]!r} has no image in "
                f"the {split} split{mapped}; every class needs one in train, val and test",
            )
    if cfg.image_size is not None:
        check_fits_in_memory(total, 3 if first.ndim == 4 else 1, cfg.image_size, str(path))
    md5 = file_md5(path)  # once per load: under mpicd run, on one rank per node
    splits = {}
    for split in SPLITS:
        x = _images(arrays.pop(f"{split}_images"), f"{split}_images", path)
        splits[split] = Arrays(x if cfg.image_size is None else _resize(x, cfg.image_size), labels[split])
    return make_dataset(
        name,
        "image",
        splits["train"],
        splits["val"],
        splits["test"],
        class_names,
        eval_split=f"official test split of {path.name} ({len(splits['test'].y)} images)",
        val_split=f"official val split of {path.name} ({len(splits['val'].y)} images)",
        label_map=None if lookup is None else tuple(int(v) for v in lookup),
        md5=md5,
        preprocessing=_preprocessing(first, cfg.image_size),
    )


def _preprocessing(first: np.ndarray, size: int | None) -> str:
    """Channels and resize, for ``mpicd check`` and the results file (``first``: train_images as stored)."""
    read = "RGB, 3 channels" if first.ndim == 4 else "grey, 1 channel"
    side = f"{first.shape[1]}x{first.shape[2]}"
    if size is None:
        return f"{read}; read at their own size ({side}), not resized"
    return f"{read}; every image resized from {side} to {size}x{size} (data.image_size; antialiased bilinear)"
