"""MedMNIST .npz loader on fixtures in the official layout, and on the real PneumoniaMNIST file."""

from pathlib import Path

import numpy as np
import pytest

from fixtures_data import write_medmnist
from mpicd.config import ConfigError, DataConfig
from mpicd.data import load_dataset
from mpicd.data.partition import make_partition

REAL = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "pneumoniamnist.npz"
LABELS = {"train": [0, 1, 1, 0, 1, 1], "val": [1, 0], "test": [0, 1, 1]}


def load(path, **kw):
    return load_dataset(DataConfig(name="medmnist", path=str(path), **kw))


def test_grey_images_become_channels_first_floats(tmp_path):
    arrays = write_medmnist(tmp_path / "pneumoniamnist.npz", LABELS)
    ds = load(tmp_path / "pneumoniamnist.npz")
    assert ds.train.x.shape == (6, 1, 8, 8) and ds.train.x.dtype == np.float32
    np.testing.assert_allclose(ds.train.x[:, 0], arrays["train_images"] / 255.0, rtol=1e-6)
    assert ds.train.y.dtype == np.int64 and ds.train.y.tolist() == LABELS["train"]
    assert ds.val.y.tolist() == LABELS["val"] and ds.test.y.tolist() == LABELS["test"]
    np.testing.assert_allclose(ds.test.x[:, 0], arrays["test_images"] / 255.0, rtol=1e-6)
    assert ds.name == "pneumoniamnist" and ds.class_names == ("normal", "pneumonia")
    assert ds.kind == "image" and ds.input_shape == (1, 8, 8) and ds.num_classes == 2
    assert ds.eval_split == "official test split of pneumoniamnist.npz (3 images)"


def test_rgb_images_keep_their_channels(tmp_path):
    arrays = write_medmnist(tmp_path / "retinamnist.npz", LABELS, rgb=True)
    ds = load(tmp_path / "retinamnist.npz")
    assert ds.train.x.shape == (6, 3, 8, 8)
    np.testing.assert_allclose(ds.train.x.transpose(0, 2, 3, 1), arrays["train_images"] / 255.0, rtol=1e-6)
    assert ds.class_names == ("class0", "class1")


def test_resize_keeps_range_and_flat_images_flat(tmp_path):
    path = tmp_path / "breastmnist.npz"
    write_medmnist(path, LABELS, rgb=True)
    with np.load(path) as npz:
        arrays = dict(npz)
    arrays["train_images"][0] = 128
    np.savez(path, **arrays)
    ds = load(path, image_size=20)
    assert ds.train.x.shape == (6, 3, 20, 20) and ds.val.x.shape == (2, 3, 20, 20)
    assert ds.train.x.min() >= 0.0 and ds.train.x.max() <= 1.0
    np.testing.assert_allclose(ds.train.x[0], 128 / 255.0, rtol=1e-5)
    assert ds.class_names == ("malignant", "normal_benign")
    assert load(path, image_size=4).train.x.shape == (6, 3, 4, 4)


def test_num_classes_spans_every_split(tmp_path):
    write_medmnist(tmp_path / "x.npz", {"train": [0, 1, 0], "val": [3], "test": [2, 1]})
    ds = load(tmp_path / "x.npz")
    assert ds.num_classes == 4 and ds.class_names == ("class0", "class1", "class2", "class3")


def test_path_errors_name_the_file(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_dataset(DataConfig(name="medmnist"))
    assert err.value.key == "data.path"
    with pytest.raises(ConfigError, match="nothere.npz.*does not exist") as err:
        load(tmp_path / "nothere.npz")
    assert err.value.key == "data.path"
    (tmp_path / "junk.npz").write_text("not an npz")
    with pytest.raises(ConfigError, match="junk.npz"):
        load(tmp_path / "junk.npz")


def test_missing_key_is_named(tmp_path):
    write_medmnist(tmp_path / "x.npz", LABELS, drop="val_labels")
    with pytest.raises(ConfigError, match=r"x\.npz.*'val_labels'") as err:
        load(tmp_path / "x.npz")
    assert err.value.key == "data.path"


@pytest.mark.parametrize("key, bad", [
    ("train_images", np.zeros((6, 8, 8), np.float32)),
    ("train_images", np.zeros((6, 8, 8, 2), np.uint8)),
    ("train_labels", np.zeros((6, 3), np.uint8)),
    ("test_labels", np.zeros((2, 1), np.uint8)),
    ("val_labels", -np.ones((2, 1), np.int64)),
])
def test_malformed_arrays_are_errors(tmp_path, key, bad):
    path = tmp_path / "x.npz"
    write_medmnist(path, LABELS)
    with np.load(path) as npz:
        arrays = dict(npz)
    arrays[key] = bad
    np.savez(path, **arrays)
    with pytest.raises(ConfigError, match=rf"{key} in .*x\.npz"):
        load(path)


def test_classes_key_and_unexpected_label_count_are_errors(tmp_path):
    write_medmnist(tmp_path / "pneumoniamnist.npz", {"train": [0, 2], "val": [1], "test": [0]})
    with pytest.raises(ConfigError) as err:
        load(tmp_path / "pneumoniamnist.npz", classes=["a", "b"])
    assert err.value.key == "data.classes"
    with pytest.raises(ConfigError, match="pneumoniamnist.npz.*labels 0..2"):
        load(tmp_path / "pneumoniamnist.npz")


@pytest.fixture(scope="module")
def real():
    if not REAL.is_file():
        pytest.skip(f"real PneumoniaMNIST file absent: {REAL} (see ../shared/data/README.md)")
    return load(REAL)


def test_real_pneumoniamnist_matches_its_readme(real):
    assert real.train.x.shape == (4707, 1, 28, 28)
    assert real.val.x.shape == (524, 1, 28, 28) and real.test.x.shape == (624, 1, 28, 28)
    assert np.bincount(real.train.y).tolist() == [1213, 3494]
    assert np.bincount(real.val.y).tolist() == [135, 389]
    assert np.bincount(real.test.y).tolist() == [234, 390]
    assert real.class_names == ("normal", "pneumonia") and real.eval_split.endswith("(624 images)")
    assert 0.0 <= real.train.x.min() and real.train.x.max() <= 1.0


def test_real_partition_only_uses_training_images(real):
    part = make_partition(real.train.y, 2, 4, 0.6, None, seed=0)
    assert part.base_per_class == 1213 // 4
    for idx in part.train_indices:
        assert idx.max() < len(real.train.y)
    # the held-out set is a separate array that no partition index can reach
    assert not np.shares_memory(real.test.x, real.train.x)
