"""MedMNIST ``.npz`` files (PneumoniaMNIST, BreastMNIST, RetinaMNIST, ...): official train/val/test splits.

The official test split is the held-out evaluation set and the official val split the tuning
set, so no client ever trains on either; every class must appear in all three.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from mpicd.config import ConfigError, DataConfig
from mpicd.data.base import Arrays, Dataset, existing_path, make_dataset, reject_unused

SPLITS = ("train", "val", "test")
KNOWN_CLASS_NAMES = {
    "pneumoniamnist": ("normal", "pneumonia"),
    "breastmnist": ("malignant", "normal_benign"),
}


def _images(raw: np.ndarray, key: str, path: Path) -> np.ndarray:
    """uint8 (n, H, W) or (n, H, W, 3) -> float32 (n, channels, H, W) in [0, 1]."""
    if raw.dtype != np.uint8 or not (raw.ndim == 3 or (raw.ndim == 4 and raw.shape[-1] == 3)):
        raise ConfigError("data.path", f"{key} in {str(path)!r} is {raw.dtype} {raw.shape}; MedMNIST images "
                                       f"are uint8 (n, H, W) or (n, H, W, 3)")
    x = raw.astype(np.float32) / 255.0
    return x[:, None] if x.ndim == 3 else np.ascontiguousarray(x.transpose(0, 3, 1, 2))


def _labels(raw: np.ndarray, key: str, n: int, path: Path) -> np.ndarray:
    """(n, 1) or (n,) non-negative integers -> int64 (n,); multi-label files (ChestMNIST) are refused."""
    if (raw.shape not in ((n, 1), (n,)) or not np.issubdtype(raw.dtype, np.integer)
            or (raw.size and raw.min() < 0)):
        raise ConfigError("data.path", f"{key} in {str(path)!r} is {raw.dtype} {raw.shape}; expected one "
                                       f"non-negative integer label per image, shape ({n}, 1)")
    return raw.reshape(n).astype(np.int64)


def _resize(x: np.ndarray, size: int) -> np.ndarray:
    if x.shape[2:] == (size, size):
        return x
    out = F.interpolate(torch.from_numpy(x), size=(size, size), mode="bilinear", align_corners=False,
                        antialias=True)
    return out.clamp_(0.0, 1.0).numpy()


def load(cfg: DataConfig) -> Dataset:
    reject_unused(cfg, "classes")
    path = existing_path(cfg, want_dir=False, what="a MedMNIST .npz file")
    try:
        npz = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as err:
        raise ConfigError("data.path", f"{str(path)!r} is not a readable .npz file: {err}") from None
    splits = {}
    with npz:
        for split in SPLITS:
            for key in (f"{split}_images", f"{split}_labels"):
                if key not in npz.files:
                    raise ConfigError("data.path", f"{str(path)!r} has no array {key!r} (it has "
                                                   f"{sorted(npz.files)}); expected the MedMNIST layout")
            x = _images(npz[f"{split}_images"], f"{split}_images", path)
            y = _labels(npz[f"{split}_labels"], f"{split}_labels", len(x), path)
            splits[split] = Arrays(x if cfg.image_size is None else _resize(x, cfg.image_size), y)
    num_classes = int(max(s.y.max(initial=0) for s in splits.values())) + 1
    name = path.stem.lower()
    class_names = KNOWN_CLASS_NAMES.get(name.split("_")[0], tuple(f"class{c}" for c in range(num_classes)))
    if len(class_names) != num_classes:
        raise ConfigError("data.path", f"{str(path)!r} has labels 0..{num_classes - 1}, but a "
                                       f"{name} file has {len(class_names)} classes {class_names}")
    for split, arrays in splits.items():
        absent = np.flatnonzero(np.bincount(arrays.y, minlength=num_classes) == 0)
        if len(absent):
            raise ConfigError("data.path", f"{str(path)!r}: class {class_names[absent[0]]!r} has no image in "
                                           f"the {split} split; every class needs one in train, val and test")
    return make_dataset(name, "image", splits["train"], splits["val"], splits["test"], class_names,
                        eval_split=f"official test split of {path.name} ({len(splits['test'].y)} images)",
                        val_split=f"official val split of {path.name} ({len(splits['val'].y)} images)")
