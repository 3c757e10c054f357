"""Small on-disk datasets in the exact layouts of the real ones, written into a test's tmp_path."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image


def write_medmnist(
    path: Path, labels: dict[str, list[int]], size: int = 8, rgb: bool = False, drop: str | None = None
) -> dict[str, np.ndarray]:
    """An .npz like the official MedMNIST files: uint8 images (n, H, W[, 3]), uint8 labels (n, 1).

    Returns the arrays written; ``drop`` leaves one key out.
    """
    rng = np.random.default_rng(0)
    arrays = {}
    for split, ys in labels.items():
        shape = (len(ys), size, size, 3) if rgb else (len(ys), size, size)
        arrays[f"{split}_images"] = rng.integers(0, 256, shape, dtype=np.uint8)
        arrays[f"{split}_labels"] = np.asarray(ys, dtype=np.uint8).reshape(-1, 1)
    arrays.pop(drop, None)
    np.savez_compressed(path, **arrays)
    return arrays


def write_png(path: Path, grey: int, size: tuple[int, int] = (40, 30)) -> None:
    """A flat RGB png of grey level ``grey``, so a loaded image can be traced back to its file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, (grey, grey, grey)).save(path)


def write_aptos(root: Path, diagnoses: list[int]) -> dict[str, tuple[int, int]]:
    """APTOS 2019 Kaggle layout: train.csv (id_code,diagnosis) + train_images/<id_code>.png.

    Image i is flat grey level 10 + 20 * i; returns {id_code: (grey, diagnosis)}.
    """
    root.mkdir(parents=True, exist_ok=True)
    rows, truth = ["id_code,diagnosis"], {}
    for i, grade in enumerate(diagnoses):
        id_code = f"{i:04x}c0ffee{i}"
        grey = 10 + 20 * i
        write_png(root / "train_images" / f"{id_code}.png", grey, size=(50 + i, 37))
        rows.append(f"{id_code},{grade}")
        truth[id_code] = (grey, grade)
    (root / "train.csv").write_text("\n".join(rows) + "\n")
    return truth


def write_covid(root: Path, counts: dict[str, int]) -> dict[str, list[int]]:
    """COVID-19 Radiography Database layout: <Class>/images/<Class>-<k>.png (and an unused masks/).

    Returns {class: grey levels of its images in file-name order}.
    """
    greys, level = {}, 5
    for name, n in counts.items():
        greys[name] = []
        for k in range(1, n + 1):
            write_png(root / name / "images" / f"{name}-{k}.png", level, size=(32, 32))
            write_png(root / name / "masks" / f"{name}-{k}.png", 255, size=(32, 32))
            greys[name].append(level)
            level += 11
        greys[name] = [greys[name][i] for i in np.argsort([f"{name}-{k}.png" for k in range(1, n + 1)])]
    return greys


def write_imagefolder(
    root: Path, counts: dict[str, dict[str, int]], size: tuple[int, int] = (12, 10), start: int = 3
) -> dict[tuple[str, str], list[int]]:
    """torchvision's ImageFolder layout: ``<root>/<split>/<class>/<k>.png`` (split "" for the one-folder
    layout), each image a flat 8-bit grey PNG of its own level (``start``, ``start`` + 1, ...) so a
    loaded image can be traced back to its file.

    Returns {(split, class): grey levels of its images, in file-name order}.
    """
    levels, level = {}, start
    for split, classes in counts.items():
        for name, n in classes.items():
            levels[split, name] = []
            for k in range(n):
                path = root / split / name / f"{k:03d}.png"
                path.parent.mkdir(parents=True, exist_ok=True)
                Image.new("L", size, level).save(path)
                levels[split, name].append(level)
                level += 1
    assert level <= 256, "more images than grey levels"
    return levels
