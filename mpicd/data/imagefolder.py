"""A folder of images per class, torchvision's ImageFolder convention: ``<path>/<class>/**/*.png|jpg|jpeg``.

The format for a user's own images, with no Python: the class folders are the classes (sorted by
name, or by number where every name is an integer, so ``2`` comes before ``10``), and where
``<path>/train/`` and ``<path>/test/`` both exist the user's own ``test/`` is the held-out split,
validation is ``<path>/val/`` if it exists, else carved from ``train/``. Without them both splits
are stratified, as for the other folder formats. Images keep their own size unless
``data.image_size`` asks for a resize, so every image must then share one; grey images give one
channel, and one colour image makes the whole dataset RGB. The dataset's name in reports and the
results file is ``data.display_name``, else the folder's own name.
"""

from __future__ import annotations

import hashlib
import io
import os
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from PIL import Image

from mpicd.config.sections import ConfigError, DataConfig
from mpicd.data.base import (
    Arrays,
    Dataset,
    UNREADABLE_IMAGE,
    check_fits_in_memory,
    existing_path,
    make_dataset,
    reject_unused,
    split_dataset,
    stratified_holdout,
    unreadable_image,
)

EXTENSIONS = (".png", ".jpg", ".jpeg")
SPLIT_FOLDERS = ("train", "test")
GREY_MODES = frozenset({"1", "L", "LA", "La"})
WIDE_GREY_MODES = frozenset({"I", "I;16", "I;16B", "I;16L", "I;16N"})  # 16-bit PNGs: scaled by 65535


@dataclass(frozen=True)
class ImageFile:
    path: Path
    label: int


def load(cfg: DataConfig) -> Dataset:
    reject_unused(cfg, "label_map")
    root = existing_path(
        cfg, want_dir=True, what="a folder with one sub-folder of images per class, or train/ and test/ holding those"
    )
    name = _display_name(cfg, root)
    split_layout = _split_layout(root)
    top = root / "train" if split_layout else root
    classes = _classes(cfg, top)
    parts = {"train": _files(top, classes, cfg)}
    if split_layout:
        parts["test"] = _files(root / "test", classes, cfg)
        if (root / "val").is_dir():
            parts["val"] = _files(root / "val", classes, cfg)
    everything = [f for files in parts.values() for f in files]
    size = cfg.image_size
    modes, shape, sizes = _survey(everything, size)
    channels = 3 if any(_is_colour(mode) for mode in modes.values()) else 1
    check_fits_in_memory(len(everything), channels, max(shape), str(root))
    digests: dict[str, dict[bytes, Path]] = {}
    arrays = {}
    for split, files in parts.items():
        digests[split] = {}
        x = np.empty((len(files), channels, *shape), dtype=np.float32)
        for i, f in enumerate(files):
            x[i] = _read(f.path, modes[f.path], channels, size, digests[split])
        arrays[split] = Arrays(x, np.asarray([f.label for f in files], dtype=np.int64))
    preprocessing = _preprocessing(modes, channels, size, sizes)
    warnings = _duplicates(digests, root)
    if not split_layout:
        dataset = split_dataset(name, "image", arrays["train"].x, arrays["train"].y, classes, cfg, str(root))
    else:
        dataset = _with_own_test(name, arrays, classes, cfg, root)
    return replace(dataset, preprocessing=preprocessing, warnings=warnings)


def _display_name(cfg: DataConfig, root: Path) -> str:
    """``data.display_name``, else the folder's name; one printable line, since reports title tables with it."""
    name = root.resolve().name if cfg.display_name is None else cfg.display_name
    if not name.strip() or not name.isprintable() or len(name) > 80:
        raise ConfigError("data.display_name", f"must be one printable line of 1 to 80 characters, got {name!r}")
    return name


def _split_layout(root: Path) -> bool:
    """``train/`` and ``test/`` both there: the user's own held-out split; one without the other is
    ambiguous (a class called train?), so an error naming the folder."""
    have = [(root / s).is_dir() for s in SPLIT_FOLDERS]
    if all(have):
        return True
    if any(have):
        there, missing = ("train", "test") if have[0] else ("test", "train")
        raise ConfigError(
            "data.path",
            f"{str(root)!r} has {there}/ but no {missing}/: put the other split's class folders in "
            f"{str(root / missing)!r}, or rename {there}/ if it is a class",
        )
    return False


def _sorted_names(names: list[str]) -> list[str]:
    """By number where every name is an integer (``2`` before ``10``), else by name (torchvision's order)."""
    if all(n.lstrip("-").isdigit() for n in names):
        return sorted(names, key=lambda n: (int(n), n))
    return sorted(names)


def _classes(cfg: DataConfig, top: Path) -> tuple[str, ...]:
    found = [e.name for e in os.scandir(top) if e.is_dir() and not e.name.startswith(".")]
    if cfg.classes is not None:
        classes = tuple(cfg.classes)
        if len(set(classes)) != len(classes):
            raise ConfigError("data.classes", f"names a class twice: {list(classes)}")
        for c in classes:
            if c not in found:
                raise ConfigError(
                    "data.classes",
                    f"class {c!r}: folder {str(top / c)!r} does not exist (found: {_sorted_names(found)})",
                )
    else:
        classes = tuple(_sorted_names(found))
    if len(classes) < 2:
        raise ConfigError(
            "data.path",
            f"{str(top)!r} has {len(classes)} class folder{'s' if len(classes) != 1 else ''} "
            f"({', '.join(classes) or 'none'}); a classifier needs at least two, one sub-folder of images per class",
        )
    return classes


def _files(top: Path, classes: tuple[str, ...], cfg: DataConfig) -> list[ImageFile]:
    """Every image under each class folder (sub-folders included, symlinks followed once), in name order."""
    files = []
    for label, cls in enumerate(classes):
        folder = top / cls
        if not folder.is_dir():
            key = "data.classes" if cfg.classes is not None else "data.path"
            raise ConfigError(key, f"class {cls!r} has no folder {str(folder)!r} (every split needs every class)")
        found, others, seen = [], 0, set()
        for here, dirs, names in os.walk(folder, followlinks=True):
            real = os.path.realpath(here)
            if real in seen:  # a link back up the tree
                dirs[:] = []
                continue
            seen.add(real)
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            for n in sorted(names):
                if n.startswith("."):
                    continue
                if n.lower().endswith(EXTENSIONS):
                    found.append(Path(here) / n)
                else:
                    others += 1
        if not found:
            extra = f" ({others} other file{'s' if others != 1 else ''})" if others else ""
            raise ConfigError(
                "data.path", f"class {cls!r}: folder {str(folder)!r} has no .png, .jpg or .jpeg images{extra}"
            )
        files += [ImageFile(p, label) for p in found]
    return files


def _survey(files: list[ImageFile], size: int | None) -> tuple[dict[Path, str], tuple[int, int], set[tuple[int, int]]]:
    """Each file's PIL mode, from its header, the (H, W) every image will have: ``size`` where given,
    else the first image's, which every other image must share (an error naming the first that does
    not), and the (W, H) sizes found."""
    modes, first, sizes = {}, None, set()
    for f in files:
        try:
            with Image.open(f.path) as img:
                modes[f.path], (w, h) = img.mode, img.size
                if img.mode == "P":
                    modes[f.path] = "P-grey" if _grey_palette(img) else "P"
        except UNREADABLE_IMAGE as err:
            raise unreadable_image(f.path, err) from None
        sizes.add((w, h))
        if size is None:
            if first is None:
                first = (f.path, w, h)
            elif (w, h) != first[1:]:
                raise ConfigError(
                    "data.path",
                    f"image {str(f.path)!r} is {w}x{h} but {str(first[0])!r} is {first[1]}x{first[2]}: "
                    f"the images must share one size, or set data.image_size to resize every image to one square size",
                )
    if size is not None:
        return modes, (size, size), sizes
    return modes, (first[2], first[1]), sizes


def _grey_palette(img: Image.Image) -> bool:
    palette = img.getpalette() or []
    return all(palette[i] == palette[i + 1] == palette[i + 2] for i in range(0, len(palette) - 2, 3))


def _is_colour(mode: str) -> bool:
    return mode not in GREY_MODES and mode not in WIDE_GREY_MODES and mode not in ("F", "P-grey")


def _read(path: Path, mode: str, channels: int, size: int | None, digests: dict[bytes, Path]) -> np.ndarray:
    """One image as (channels, H, W) float32 in [0, 1]: 8-bit / 255, 16-bit grey / 65535, grey
    repeated over three channels in an RGB dataset; PIL's antialiased bilinear resize where ``size``."""
    try:
        raw = path.read_bytes()
        digests.setdefault(hashlib.sha256(raw).digest(), path)
        with Image.open(io.BytesIO(raw)) as img:
            if mode in WIDE_GREY_MODES or mode == "F":
                img, scale = img.convert("F"), (65535.0 if mode != "F" else 1.0)
            elif channels == 1:
                img, scale = img.convert("L"), 255.0
            else:
                img, scale = img.convert("RGB"), 255.0
            if size is not None and img.size != (size, size):
                img = img.resize((size, size), Image.Resampling.BILINEAR)
            a = np.asarray(img, dtype=np.float32) / np.float32(scale)
    except UNREADABLE_IMAGE as err:  # OSError included: read_bytes
        raise unreadable_image(path, err) from None
    if a.ndim == 2:
        return np.broadcast_to(a, (channels, *a.shape))
    return np.moveaxis(a, -1, 0)


def _preprocessing(modes: dict[Path, str], channels: int, size: int | None, sizes: set[tuple[int, int]]) -> str:
    """What reading did to the images, for ``mpicd check`` and the results file."""
    colour = sum(_is_colour(m) for m in modes.values())
    read = "grey, 1 channel" if channels == 1 else f"RGB, 3 channels ({colour} of {len(modes)} images are colour)"
    if size is None:
        return f"{read}; read at their own size, not resized"
    if sizes == {(size, size)}:
        return f"{read}; already {size}x{size} (data.image_size), not resized"
    found = sorted(sizes, key=lambda wh: (wh[0] * wh[1], wh))
    was = (
        f"{found[0][0]}x{found[0][1]}"
        if len(found) == 1
        else f"{len(found)} sizes, {found[0][0]}x{found[0][1]} to {found[-1][0]}x{found[-1][1]}"
    )
    return f"{read}; every image resized to {size}x{size} (data.image_size; PIL bilinear) from {was}"


def _duplicates(digests: dict[str, dict[bytes, Path]], root: Path) -> tuple[str, ...]:
    """Byte-identical files across splits: held-out images the clients also train on."""
    out = []
    train = digests["train"]
    for split in ("test", "val"):
        same = [(p, train[d]) for d, p in digests.get(split, {}).items() if d in train]
        if same:
            p, q = same[0]
            out.append(
                f"{len(same)} image{'s' if len(same) > 1 else ''} of {split}/ "
                f"{'are' if len(same) > 1 else 'is'} byte-identical to training images (first: "
                f"{p.relative_to(root)} = {q.relative_to(root)}): the held-out score counts them"
            )
    return tuple(out)


def _with_own_test(name: str, arrays: dict[str, Arrays], classes: tuple[str, ...], cfg: DataConfig, root: Path):
    train = arrays["train"]
    if "val" in arrays:
        val_split = f"the folder's own val/ ({len(arrays['val'].y)} images)"
        fit, val = train, arrays["val"]
    else:
        keep, held = stratified_holdout(train.y, cfg, classes, str(root / "train"))
        fit, val = Arrays(train.x[keep], train.y[keep]), Arrays(train.x[held], train.y[held])
        val_split = (
            f"stratified {cfg.val_fraction:g} of each class of train/, drawn with split_seed={cfg.split_seed} "
            f"({len(held)} images)"
        )
    eval_split = f"the folder's own test/ ({len(arrays['test'].y)} images)"
    return make_dataset(name, "image", fit, val, arrays["test"], classes, eval_split, val_split)
