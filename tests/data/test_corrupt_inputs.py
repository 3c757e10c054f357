"""Corrupt data and results files: each is exit 2 and one line naming the file (and the array, CSV line
or image), or the client and class a partition leaves empty; never a traceback, never a huge allocation.

Every fixture is made here in tmp_path, in the exact layout of the real format, then damaged by hand:
cut short, bytes flipped inside a compressed member, wrong dtypes and shapes, a PNG that is not one,
CSV rows with an unknown grade, a missing image or a repeated id. The expected client and class of an
emptied partition are worked out by hand from floor((1 - skew) * images_per_class).
"""

from __future__ import annotations

import contextlib
import io
import resource
import shutil
import struct
import subprocess
import sys
import zipfile
import zlib
from pathlib import Path

import h5py
import numpy as np
import pytest
import yaml

from fixtures_data import write_aptos, write_covid, write_medmnist
from mpicd.cli import main
from mpicd.results.reader import Results, ResultsFileError

from conftest import QUICKSTART, ROOT, mpi_env, mpicd_cli, mpicd_run

LABELS = {"train": [0] * 10 + [1] * 10, "val": [0, 1, 0, 1], "test": [0, 1, 0, 1]}
DIAGNOSES = [0, 2, 0, 4, 0, 1, 0, 3, 0, 0, 2, 1]  # 6 without DR, 6 with: train.csv lines 2..13


def config(folder: Path, data: dict, **top) -> Path:
    """A config file for 2 clients on ``data``; the model follows the data (lenet for images)."""
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump({"clients": 2, "rounds": 1, "model": {"name": "auto"}, "data": data, **top}))
    return path


def check(path: Path) -> tuple[int, str]:
    """``mpicd check`` in-process (the same entry point as the command): exit status and stderr."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(["check", str(path)])
    return code, err.getvalue()


def limited_memory() -> None:
    """A child that tries to allocate terabytes fails fast instead of swapping the shared machine."""
    resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))


def check_command(path: Path) -> tuple[int, str]:
    """The real ``python -m mpicd check``, under a memory limit."""
    result = subprocess.run(
        [sys.executable, "-m", "mpicd", "check", str(path)],
        cwd=ROOT,
        env=mpi_env(),
        capture_output=True,
        text=True,
        timeout=180,
        preexec_fn=limited_memory,
    )
    return result.returncode, result.stderr


def one_line(code: int, stderr: str, key: str, *fragments: str) -> str:
    lines = stderr.splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in stderr, (code, stderr)
    assert lines[0].startswith(f"mpicd: config error: {key}: "), lines[0]
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


# --------------------------------------------------------------------------- MedMNIST .npz


def arrays_of(path: Path) -> dict:
    with np.load(path) as npz:
        return dict(npz)


def truncated(path: Path, fraction: float) -> None:
    raw = path.read_bytes()
    path.write_bytes(raw[: int(len(raw) * fraction)])


def flip_inside(path: Path, member: str) -> None:
    """Flip bytes inside one compressed member, leaving the zip directory intact."""
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo(member)
    raw = bytearray(path.read_bytes())
    name_len, extra_len = struct.unpack("<HH", raw[info.header_offset + 26 : info.header_offset + 30])
    start = info.header_offset + 30 + name_len + extra_len
    for i in range(start + 10, start + min(40, info.compress_size - 1)):
        raw[i] ^= 0xA5
    path.write_bytes(bytes(raw))


def replaced(path: Path, **new) -> None:
    arrays = arrays_of(path)
    arrays.update(new)
    np.savez(path, **arrays)


def npy_instead(path: Path) -> None:
    with open(path, "wb") as f:
        np.save(f, np.zeros(3))


def junk_members(path: Path) -> None:
    with zipfile.ZipFile(path, "w") as zf:
        for split in ("train", "val", "test"):
            for kind in ("images", "labels"):
                zf.writestr(f"{split}_{kind}.npy", b"not a numpy array")


NPZ_CASES = {
    "cut in half": (lambda p: truncated(p, 0.5), "is not a readable .npz file"),
    "cut at 99%": (lambda p: truncated(p, 0.99), "is not a readable .npz file"),
    "empty": (lambda p: truncated(p, 0.0), "is not a readable .npz file"),
    "corrupt member": (lambda p: flip_inside(p, "val_images.npy"), "array 'val_images' cannot be read"),
    "pickled labels": (
        lambda p: replaced(p, train_labels=np.array([[1]] * 20, dtype=object)),
        "array 'train_labels' cannot be read",
    ),
    "float images": (lambda p: replaced(p, train_images=np.zeros((20, 8, 8))), "train_images in", "float64"),
    "4 channels": (lambda p: replaced(p, val_images=np.zeros((4, 8, 8, 4), np.uint8)), "val_images in", "(4, 8, 8, 4)"),
    "0x0 images": (lambda p: replaced(p, test_images=np.zeros((4, 0, 0), np.uint8)), "test_images in", "H, W >= 1"),
    "labels per image wrong": (lambda p: replaced(p, train_labels=np.zeros((20, 3), np.uint8)), "train_labels in"),
    "split of another size": (
        lambda p: replaced(p, val_images=np.zeros((4, 4, 4), np.uint8)),
        "val_images in",
        "(4, 4) but train_images are (8, 8)",
    ),
    "split in colour": (
        lambda p: replaced(p, test_images=np.zeros((4, 8, 8, 3), np.uint8)),
        "test_images in",
        "(8, 8, 3) but train_images are (8, 8)",
    ),
    "a .npy file": (npy_instead, "a .npy file"),
    "members not .npy": (junk_members, "'train_images' is not a .npy array"),
}


@pytest.mark.parametrize("case", sorted(NPZ_CASES))
def test_a_damaged_npz_names_the_file_and_what_is_wrong(case, tmp_path):
    npz = tmp_path / "pneumoniamnist.npz"
    write_medmnist(npz, LABELS)
    damage, *fragments = NPZ_CASES[case]
    damage(npz)
    path = config(tmp_path, {"name": "medmnist", "path": str(npz)})
    one_line(*check(path), "data.path", repr(str(npz)), *fragments)


def test_the_undamaged_fixture_loads(tmp_path):
    npz = tmp_path / "pneumoniamnist.npz"
    write_medmnist(npz, LABELS)
    assert check(config(tmp_path, {"name": "medmnist", "path": str(npz)})) == (0, "")


def test_a_truncated_npz_through_the_command(tmp_path):
    npz = tmp_path / "x.npz"
    write_medmnist(npz, LABELS)
    truncated(npz, 0.5)
    one_line(
        *check_command(config(tmp_path, {"name": "medmnist", "path": str(npz)})),
        "data.path",
        repr(str(npz)),
        "is not a readable .npz file",
    )


def test_an_absurd_label_is_refused_before_allocating_a_class_per_value(tmp_path):
    """Label 2**40 would mean 2**40 classes: a bincount of 8 TB. The command answers within 6 GB."""
    npz = tmp_path / "x.npz"
    write_medmnist(npz, LABELS)
    labels = np.array(LABELS["train"], dtype=np.int64).reshape(-1, 1)
    labels[3] = 2**40
    replaced(npz, train_labels=labels)
    one_line(
        *check_command(config(tmp_path, {"name": "medmnist", "path": str(npz)})),
        "data.path",
        repr(str(npz)),
        f"train_labels in {str(npz)!r} has label {2**40}, but the file holds only 28 images",
    )


@pytest.mark.parametrize("fmt", ["medmnist", "aptos", "covid", "imagefolder"])
def test_an_image_size_no_machine_can_hold_is_refused_before_resizing(fmt, tmp_path):
    """10**6 x 10**6 float32 pixels are 4 TB per image: refused naming the key, in a 6 GB child."""
    if fmt == "medmnist":
        write_medmnist(tmp_path / "x.npz", LABELS)
        data = {"name": fmt, "path": str(tmp_path / "x.npz")}
    elif fmt == "aptos":
        write_aptos(tmp_path / "aptos", DIAGNOSES)
        data = {"name": fmt, "path": str(tmp_path / "aptos")}
    else:
        write_covid(tmp_path / "covid", {"Normal": 8, "COVID": 8})  # Normal/images/, COVID/images/: classes
        data = {"name": fmt, "path": str(tmp_path / "covid")}
    one_line(
        *check_command(config(tmp_path, {**data, "image_size": 10**6})),
        "data.image_size",
        "1000000x1000000 images",
        "GiB of memory",
    )


# --------------------------------------------------------------------------- images and CSV files


def png_header(width: int, height: int) -> bytes:
    """A well-formed PNG whose header claims width x height grey pixels (decompression-bomb sized)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = zlib.compress(b"\x00" * (width + 1) * 4)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
        + chunk(b"IDAT", rows)
        + chunk(b"IEND", b"")
    )


BAD_PNGS = {
    "not a png": lambda good: b"this is not an image",
    "cut short": lambda good: good[: len(good) // 2],
    "empty": lambda good: b"",
    "bytes flipped": lambda good: good[:33] + bytes(b ^ 0x5A for b in good[33:60]) + good[60:],
    "30000x30000 header": lambda good: png_header(30000, 30000),
}


@pytest.mark.parametrize("case", sorted(BAD_PNGS))
def test_an_aptos_image_that_does_not_decode_names_the_image_and_csv_line(case, tmp_path):
    truth = write_aptos(tmp_path / "aptos", DIAGNOSES)
    third = list(truth)[2]  # line 4 of train.csv (the header is line 1)
    image = tmp_path / "aptos" / "train_images" / f"{third}.png"
    image.write_bytes(BAD_PNGS[case](image.read_bytes()))
    one_line(
        *check(config(tmp_path, {"name": "aptos", "path": str(tmp_path / "aptos")})),
        "data.path",
        f"cannot read image {str(image)!r} (listed in {str(tmp_path / 'aptos' / 'train.csv')!r} line 4)",
    )


def test_a_png_that_does_not_decode_through_the_command(tmp_path):
    truth = write_aptos(tmp_path / "aptos", DIAGNOSES)
    image = tmp_path / "aptos" / "train_images" / f"{list(truth)[0]}.png"
    image.write_bytes(b"GIF89a but not really")
    one_line(
        *check_command(config(tmp_path, {"name": "aptos", "path": str(tmp_path / "aptos")})),
        "data.path",
        f"cannot read image {str(image)!r}",
        "line 2",
    )


def test_a_covid_image_that_does_not_decode_names_the_image(tmp_path):
    write_covid(tmp_path / "covid", {"Normal": 8, "COVID": 8})
    image = tmp_path / "covid" / "COVID" / "images" / "COVID-7.png"
    image.write_bytes(image.read_bytes()[:40])
    one_line(
        *check(config(tmp_path, {"name": "covid", "path": str(tmp_path / "covid")})),
        "data.path",
        f"cannot read image {str(image)!r}",
    )


def test_two_class_names_for_one_folder_are_refused(tmp_path):
    """``Normal`` and ``./Normal`` would put the same images under both labels (and in both splits)."""
    write_covid(tmp_path / "covid", {"Normal": 8, "COVID": 8})
    path = config(tmp_path, {"name": "covid", "path": str(tmp_path / "covid"), "classes": ["Normal", "./Normal"]})
    one_line(*check(path), "data.classes", "'Normal' and './Normal' are the same folder")


def csv_with(tmp_path: Path, extra: bytes) -> Path:
    write_aptos(tmp_path / "aptos", DIAGNOSES)
    table = tmp_path / "aptos" / "train.csv"
    table.write_bytes(table.read_bytes() + extra)
    return table


def test_a_csv_row_with_an_unknown_grade_names_the_csv_and_line(tmp_path):
    table = csv_with(tmp_path, b"000cc0ffee12,7\n")  # line 14
    one_line(
        *check_command(config(tmp_path, {"name": "aptos", "path": str(tmp_path / "aptos")})),
        "data.path",
        f"{str(table)!r} line 14: diagnosis '7' is not one of 0-4",
    )


def test_a_csv_row_whose_image_is_missing_names_the_image_and_line(tmp_path):
    table = csv_with(tmp_path, b"deadbeef,1\n")
    image = tmp_path / "aptos" / "train_images" / "deadbeef.png"
    one_line(
        *check(config(tmp_path, {"name": "aptos", "path": str(tmp_path / "aptos")})),
        "data.path",
        f"image {str(image)!r} listed in {str(table)!r} line 14 does not exist",
    )


def test_a_csv_that_lists_an_image_twice_names_both_lines(tmp_path):
    """The same image twice could land in a client's training set and in the held-out set."""
    truth = write_aptos(tmp_path / "aptos", DIAGNOSES)
    table = tmp_path / "aptos" / "train.csv"
    table.write_text(table.read_text() + f"{list(truth)[1]},0\n")
    one_line(
        *check(config(tmp_path, {"name": "aptos", "path": str(tmp_path / "aptos")})),
        "data.path",
        f"{str(table)!r} lists id_code {list(truth)[1]!r} twice, lines 3 and 14",
    )


def test_a_csv_that_is_not_utf8_names_the_csv(tmp_path):
    table = csv_with(tmp_path, b"caf\xe9,1\n")
    one_line(
        *check(config(tmp_path, {"name": "aptos", "path": str(tmp_path / "aptos")})),
        "data.path",
        f"{str(table)!r} is not UTF-8 text",
    )


# --------------------------------------------------------------------------- a class left empty on a client


def test_a_skew_that_leaves_a_client_no_image_of_a_class_names_client_and_class(tmp_path):
    """2 per class, skew 0.6: floor(0.4 * 2) = 0 images of class 1 on client 0 (expert in class 0)."""
    path = config(tmp_path, {"name": "breast_cancer", "images_per_class": 2, "skew": 0.6}, model={"name": "mlp"})
    one_line(*check_command(path), "data.skew", "client 0 (expertise class 0) would get 0 images of class 1")


def test_the_authors_skew_empties_only_the_class_0_experts(tmp_path):
    """authors mode, 3 clients (experts 0, 1, 0), 1 per class, skew 0.5: client 0 keeps floor(0.5) = 0 of
    class 1; client 1 (expert in 1) keeps all, so the first empty one is client 0, class 1."""
    path = config(
        tmp_path,
        {"name": "breast_cancer", "images_per_class": 1, "skew": 0.5, "skew_mode": "authors"},
        model={"name": "mlp"},
        clients=3,
    )
    one_line(*check(path), "data.skew", "client 0 (expertise class 0) would get 0 images of class 1")


def test_a_class_rarer_than_the_clients_names_the_class(tmp_path):
    """Class 1 has 2 training images, so 3 clients cannot each get one."""
    npz = tmp_path / "x.npz"
    write_medmnist(npz, {"train": [0] * 10 + [1] * 2, "val": [0, 1], "test": [0, 1]})
    path = config(tmp_path, {"name": "medmnist", "path": str(npz)}, clients=3)
    one_line(*check(path), "clients", "class 1 has 2 training images, fewer than one per client for 3 clients")


def test_more_images_per_class_than_a_class_holds_names_the_class(tmp_path):
    npz = tmp_path / "x.npz"
    write_medmnist(npz, LABELS)  # 10 training images of each class
    path = config(tmp_path, {"name": "medmnist", "path": str(npz), "images_per_class": 6})
    one_line(
        *check(path),
        "data.images_per_class",
        "6 per client x 2 clients needs 12 images of every class; class 0, the rarest, has 10 in the "
        "training split (short: classes 0, 1); the largest allowed value is 5 = 10 // 2",
    )


# --------------------------------------------------------------------------- results files


@pytest.fixture(scope="module")
def real_results(tmp_path_factory):
    out = tmp_path_factory.mktemp("real") / "run.h5"
    mpicd_run(2, QUICKSTART, out, "clients=2", "rounds=1", timeout=300)
    return out


def report(*paths: Path) -> tuple[int, str]:
    result = mpicd_cli("report", *map(str, paths), timeout=120)
    return result.returncode, result.stderr


def one_report_line(code: int, stderr: str, path: Path, *fragments: str) -> None:
    lines = stderr.splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in stderr, (code, stderr)
    assert lines[0].startswith(f"mpicd: {path}: "), lines[0]
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


def test_the_real_file_reports(real_results):
    assert report(real_results) == (0, "")


def test_a_results_file_cut_in_half_names_the_file_and_says_truncated(real_results, tmp_path):
    half = tmp_path / "half.h5"
    raw = real_results.read_bytes()
    half.write_bytes(raw[: len(raw) // 2])
    one_report_line(*report(half), half, "not a readable HDF5 file", "truncated file")
    with pytest.raises(ResultsFileError, match="half.h5: not a readable HDF5 file"):
        Results(half)


def test_an_hdf5_file_that_is_not_mpicds_names_the_file_and_what_is_missing(tmp_path):
    foreign = tmp_path / "foreign.h5"
    with h5py.File(foreign, "w") as f:
        f["x"] = np.random.default_rng(0).random(5)
    one_report_line(*report(foreign), foreign, "not an mpicd results file (no attribute 'completed_rounds'")


def test_a_text_file_named_h5_names_the_file(tmp_path):
    text = tmp_path / "notes.h5"
    text.write_text("these are my notes\n")
    one_report_line(*report(text), text, "not a readable HDF5 file", "file signature not found")


def test_a_missing_results_file_is_named(tmp_path):
    one_report_line(*report(tmp_path / "nowhere.h5"), tmp_path / "nowhere.h5", "no such file")


def damaged_copy(real: Path, folder: Path, edit) -> Path:
    path = folder / "damaged.h5"
    shutil.copy(real, path)
    with h5py.File(path, "a") as f:
        edit(f)
    return path


def reshaped_metric(f) -> None:
    del f["metrics/minority_acc"]
    f["metrics/minority_acc"] = np.zeros(3)


@pytest.mark.parametrize(
    "edit, fragment",
    [
        (lambda f: f.attrs.__setitem__("config", "a: [1"), "the attribute config is not YAML"),
        (lambda f: f.attrs.__setitem__("completed_rounds", 7), "completed_rounds is 7, but /metrics holds 1 rounds"),
        (lambda f: f.attrs.__setitem__("completed_rounds", "many"), "not an mpicd results file (ValueError"),
        (lambda f: f.__delitem__("comm"), "not an mpicd results file (no /comm/bytes_sent"),
        (reshaped_metric, "not a readable mpicd results file (AxisError"),
    ],
    ids=["config not yaml", "more rounds than rows", "rounds not a number", "no comm group", "1-d metric"],
)
def test_a_damaged_mpicd_file_names_the_file_and_why(real_results, tmp_path, edit, fragment):
    path = damaged_copy(real_results, tmp_path, edit)
    one_report_line(*report(path), path, fragment)
