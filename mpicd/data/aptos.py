"""APTOS 2019 blindness detection (Kaggle layout), binarised as in the paper: grade 0 vs grades 1-4.

``<path>/train.csv`` (id_code, diagnosis) and ``<path>/train_images/<id_code>.png``; Kaggle's
test images have no labels, so the held-out and validation sets are stratified splits of train.csv.
"""

from __future__ import annotations

import csv

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

CLASS_NAMES = ("no_dr", "dr")
DEFAULT_SIZE = 64
GRADES = ("0", "1", "2", "3", "4")


def load(cfg: DataConfig) -> Dataset:
    reject_unused(cfg, "classes", "label_map", "display_name")
    root = existing_path(cfg, want_dir=True, what="the APTOS 2019 folder holding train.csv and train_images/")
    table = root / "train.csv"
    if not table.is_file():
        raise ConfigError("data.path", f"{str(table)!r} does not exist (APTOS layout: train.csv, train_images/)")
    with table.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        try:
            missing = [c for c in ("id_code", "diagnosis") if c not in (reader.fieldnames or [])]
            if missing:
                raise ConfigError(
                    "data.path", f"{str(table)!r} has no column {missing[0]!r} (columns: {reader.fieldnames})"
                )
            rows = [(reader.line_num, row) for row in reader]
        except UnicodeDecodeError as err:
            raise ConfigError("data.path", f"{str(table)!r} is not UTF-8 text: {err}") from None
        except csv.Error as err:
            raise ConfigError(
                "data.path", f"{str(table)!r} line {reader.line_num}: not readable as CSV: {err}"
            ) from None
    if not rows:
        raise ConfigError("data.path", f"{str(table)!r} lists no images")
    size = cfg.image_size or DEFAULT_SIZE
    paths, labels, first_line = [], [], {}
    for line, row in rows:
        grade = (row["diagnosis"] or "").strip()
        if grade not in GRADES:
            raise ConfigError("data.path", f"{str(table)!r} line {line}: diagnosis {grade!r} is not one of 0-4")
        id_code = (row["id_code"] or "").strip()
        if id_code in first_line:  # one image twice could land in both training and held-out splits
            raise ConfigError(
                "data.path", f"{str(table)!r} lists id_code {id_code!r} twice, lines {first_line[id_code]} and {line}"
            )
        first_line[id_code] = line
        image = root / "train_images" / f"{id_code}.png"
        if not image.is_file():
            raise ConfigError("data.path", f"image {str(image)!r} listed in {str(table)!r} line {line} does not exist")
        paths.append((image, line))
        labels.append(int(grade != "0"))
    check_fits_in_memory(len(paths), 1, size, str(root))
    images = [read_grey_png(image, size, f"listed in {str(table)!r} line {line}") for image, line in paths]
    y = np.asarray(labels, dtype=np.int64)
    return split_dataset(
        "aptos",
        "image",
        np.stack(images)[:, None],
        y,
        CLASS_NAMES,
        cfg,
        str(table),
        resized_text(size, cfg.image_size is None),
    )
