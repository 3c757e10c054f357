"""MedMNIST ``.npz`` files (PneumoniaMNIST, BreastMNIST, RetinaMNIST, ...): official train/val/test splits.

The official test split is the held-out evaluation set and the official val split the tuning
set, so no client ever trains on either; every class must appear in all three.
"""

from __future__ import annotations

import zipfile
import zlib
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from mpicd.config import ConfigError, DataConfig
from mpicd.data.base import Arrays, Dataset, check_fits_in_memory, existing_path, make_dataset, reject_unused

SPLITS = ("train", "val", "test")
KNOWN_CLASS_NAMES = {
    "pneumoniamnist": ("normal", "pneumonia"),
    "breastmnist": ("malignant", "normal_benign"),
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


def load(cfg: DataConfig) -> Dataset:
    reject_unused(cfg, "classes")
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
    if cfg.image_size is not None:
        count = sum(len(arrays[f"{split}_images"]) for split in SPLITS)
        check_fits_in_memory(count, 3 if first.ndim == 4 else 1, cfg.image_size, str(path))
    total = sum(len(arrays[f"{split}_labels"]) for split in SPLITS)
    splits = {}
    for split in SPLITS:
        x = _images(arrays.pop(f"{split}_images"), f"{split}_images", path)
        y = _labels(arrays.pop(f"{split}_labels"), f"{split}_labels", len(x), path, total)
        splits[split] = Arrays(x if cfg.image_size is None else _resize(x, cfg.image_size), y)
    num_classes = int(max(s.y.max(initial=0) for s in splits.values())) + 1
    name = path.stem.lower()
    class_names = KNOWN_CLASS_NAMES.get(name.split("_")[0], tuple(f"class{c}" for c in range(num_classes)))
    if len(class_names) != num_classes:
        raise ConfigError(
            "data.path",
            f"{str(path)!r} has labels 0..{num_classes - 1}, but a "
            f"{name} file has {len(class_names)} classes {class_names}",
        )
    for split, arrays in splits.items():
        absent = np.flatnonzero(np.bincount(arrays.y, minlength=num_classes) == 0)
        if len(absent):
            raise ConfigError(
                "data.path",
                f"{str(path)!r}: class {class_names[absent[0]]!r} has no image in "
                f"the {split} split; every class needs one in train, val and test",
            )
    return make_dataset(
        name,
        "image",
        splits["train"],
        splits["val"],
        splits["test"],
        class_names,
        eval_split=f"official test split of {path.name} ({len(splits['test'].y)} images)",
        val_split=f"official val split of {path.name} ({len(splits['val'].y)} images)",
    )
