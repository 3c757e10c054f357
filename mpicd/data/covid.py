"""COVID-19 Radiography Database layout: ``<path>/<Class>/images/*.png``, one folder per class.

Classes come from data.classes in label order (default Normal, COVID); the held-out and
validation sets are stratified splits, since the database has no official ones.
"""

from __future__ import annotations

import numpy as np

from mpicd.config.sections import ConfigError, DataConfig
from mpicd.data.base import (
    check_fits_in_memory,
    Dataset,
    existing_path,
    read_grey_png,
    reject_unused,
    resized_text,
    split_dataset,
)

DEFAULT_CLASSES = ("Normal", "COVID")
DEFAULT_SIZE = 64


def load(cfg: DataConfig) -> Dataset:
    reject_unused(cfg, "label_map", "display_name")
    root = existing_path(cfg, want_dir=True, what="the COVID-19 Radiography Database folder")
    classes = tuple(cfg.classes) if cfg.classes is not None else DEFAULT_CLASSES
    if len(classes) < 2 or len(set(classes)) != len(classes):
        raise ConfigError("data.classes", f"needs at least two distinct class folders, got {list(classes)}")
    size = cfg.image_size or DEFAULT_SIZE
    files, labels, owner = [], [], {}
    for label, name in enumerate(classes):
        folder = root / name / "images"
        found = sorted(folder.glob("*.png")) if folder.is_dir() else []
        if not found:
            state = "has no .png images" if folder.is_dir() else "does not exist"
            key = "data.classes" if cfg.classes is not None else "data.path"
            raise ConfigError(key, f"class {name!r}: folder {str(folder)!r} {state}")
        same = owner.setdefault(folder.resolve(), name)
        if same != name:  # the same images under two labels
            raise ConfigError(
                "data.classes", f"classes {same!r} and {name!r} are the same folder {str(folder.resolve())!r}"
            )
        files += found
        labels += [label] * len(found)
    check_fits_in_memory(len(files), 1, size, str(root))
    images = [read_grey_png(f, size) for f in files]
    x = np.stack(images)[:, None]
    return split_dataset(
        "covid",
        "image",
        x,
        np.asarray(labels, dtype=np.int64),
        classes,
        cfg,
        str(root),
        resized_text(size, cfg.image_size is None),
    )
