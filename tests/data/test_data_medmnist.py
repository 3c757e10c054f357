"""MedMNIST .npz loader on fixtures in the official layout, and on the real PneumoniaMNIST file:
official splits, every class in each, standardised with the training split's statistics."""

from pathlib import Path

import numpy as np
import pytest

from fixtures_data import write_medmnist
from mpicd.config.sections import ConfigError, DataConfig
from mpicd.data import load_dataset
from mpicd.data.partition import make_partition

REAL = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "pneumoniamnist.npz"
LABELS = {"train": [0, 1, 1, 0, 1, 1], "val": [1, 0], "test": [0, 1, 1]}


def load(path, **kw):
    return load_dataset(DataConfig(name="medmnist", path=str(path), **kw))


def by_hand(arrays, split, rgb=False):
    """The split's raw images in [0, 1], channels first, and the training split's per-channel statistics."""

    def raw(s):
        x = arrays[f"{s}_images"].astype(np.float64) / 255.0
        return x.transpose(0, 3, 1, 2) if rgb else x[:, None]

    train = raw("train")
    mean = np.array([train[:, c].mean() for c in range(train.shape[1])])
    std = np.array([np.sqrt(((train[:, c] - mean[c]) ** 2).mean()) for c in range(train.shape[1])])
    return raw(split), mean, std


def assert_standardised(got, arrays, split, rgb=False):
    x, mean, std = by_hand(arrays, split, rgb)
    np.testing.assert_allclose(got, (x - mean[None, :, None, None]) / std[None, :, None, None], rtol=1e-5, atol=1e-5)


def test_grey_images_become_channels_first_floats(tmp_path):
    arrays = write_medmnist(tmp_path / "pneumoniamnist.npz", LABELS)
    ds = load(tmp_path / "pneumoniamnist.npz")
    assert ds.train.x.shape == (6, 1, 8, 8) and ds.train.x.dtype == np.float32
    assert ds.train.y.dtype == np.int64 and ds.train.y.tolist() == LABELS["train"]
    assert ds.val.y.tolist() == LABELS["val"] and ds.test.y.tolist() == LABELS["test"]
    for split in ("train", "val", "test"):
        assert_standardised(getattr(ds, split).x, arrays, split)
    _, mean, std = by_hand(arrays, "train")
    np.testing.assert_allclose(ds.normalization["mean"], mean, rtol=1e-6)
    np.testing.assert_allclose(ds.normalization["std"], std, rtol=1e-6)
    assert ds.normalization["computed_on"] == "train split (6 images)"
    np.testing.assert_allclose(ds.train.x.mean(), 0.0, atol=1e-5)
    np.testing.assert_allclose(ds.train.x.std(), 1.0, atol=1e-5)
    assert ds.name == "pneumoniamnist" and ds.class_names == ("normal", "pneumonia")
    assert ds.kind == "image" and ds.input_shape == (1, 8, 8) and ds.num_classes == 2
    assert ds.eval_split == "official test split of pneumoniamnist.npz (3 images)"
    assert ds.val_split == "official val split of pneumoniamnist.npz (2 images)"


def test_rgb_images_keep_their_channels(tmp_path):
    arrays = write_medmnist(tmp_path / "retinamnist.npz", LABELS, rgb=True)
    ds = load(tmp_path / "retinamnist.npz")
    assert ds.train.x.shape == (6, 3, 8, 8)
    for split in ("train", "val", "test"):
        assert_standardised(getattr(ds, split).x, arrays, split, rgb=True)
    assert len(ds.normalization["mean"]) == len(ds.normalization["std"]) == 3
    np.testing.assert_allclose(ds.train.x.mean(axis=(0, 2, 3)), 0.0, atol=1e-5)
    np.testing.assert_allclose(ds.train.x.std(axis=(0, 2, 3)), 1.0, atol=1e-5)
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
    mean, std = (np.array(ds.normalization[k])[:, None, None] for k in ("mean", "std"))
    unscaled = ds.train.x * std + mean
    assert unscaled.min() >= -1e-5 and unscaled.max() <= 1.0 + 1e-5
    np.testing.assert_allclose(unscaled[0], 128 / 255.0, rtol=1e-5)
    assert ds.class_names == ("malignant", "normal_benign")
    assert load(path, image_size=4).train.x.shape == (6, 3, 4, 4)


def test_num_classes_spans_every_split(tmp_path):
    write_medmnist(tmp_path / "x.npz", {"train": [0, 1, 3, 2], "val": [3, 2, 1, 0], "test": [2, 1, 0, 3]})
    ds = load(tmp_path / "x.npz")
    assert ds.num_classes == 4 and ds.class_names == ("class0", "class1", "class2", "class3")


@pytest.mark.parametrize(
    "labels, message",
    [
        ({"train": [0, 1, 0], "val": [1, 0], "test": [2, 1, 0]}, "class 'class2' has no image in the train split"),
        ({"train": [0, 1, 0], "val": [1, 1], "test": [1, 0]}, "class 'class0' has no image in the val split"),
        ({"train": [0, 1, 0], "val": [1, 0], "test": [0, 0]}, "class 'class1' has no image in the test split"),
    ],
)
def test_a_class_absent_from_a_split_is_an_error(tmp_path, labels, message):
    write_medmnist(tmp_path / "x.npz", labels)
    with pytest.raises(ConfigError, match=rf"x\.npz.*{message}") as err:
        load(tmp_path / "x.npz")
    assert err.value.key == "data.path"


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


@pytest.mark.parametrize(
    "key, bad",
    [
        ("train_images", np.zeros((6, 8, 8), np.float32)),
        ("train_images", np.zeros((6, 8, 8, 2), np.uint8)),
        ("train_labels", np.zeros((6, 3), np.uint8)),
        ("test_labels", np.zeros((2, 1), np.uint8)),
        ("val_labels", -np.ones((2, 1), np.int64)),
    ],
)
def test_malformed_arrays_are_errors(tmp_path, key, bad):
    path = tmp_path / "x.npz"
    write_medmnist(path, LABELS)
    with np.load(path) as npz:
        arrays = dict(npz)
    arrays[key] = bad
    np.savez(path, **arrays)
    with pytest.raises(ConfigError, match=rf"{key} in .*x\.npz"):
        load(path)


def test_classes_key_names_the_classes_and_unexpected_label_count_is_an_error(tmp_path):
    write_medmnist(tmp_path / "pneumoniamnist.npz", {"train": [0, 1], "val": [1, 0], "test": [0, 1]})
    assert load(tmp_path / "pneumoniamnist.npz", classes=["a", "b"]).class_names == ("a", "b")
    with pytest.raises(ConfigError, match="names 3 classes") as err:
        load(tmp_path / "pneumoniamnist.npz", classes=["a", "b", "c"])
    assert err.value.key == "data.classes"
    write_medmnist(tmp_path / "pneumoniamnist.npz", {"train": [0, 2], "val": [1], "test": [0]})
    with pytest.raises(ConfigError, match="pneumoniamnist.npz.*labels 0..2") as err:
        load(tmp_path / "pneumoniamnist.npz")
    assert err.value.key == "data.path"


@pytest.fixture(scope="module")
def real():
    if not REAL.is_file():
        pytest.skip(f"real PneumoniaMNIST file absent: {REAL} (see ../shared/data/README.md)")
    return load(REAL)


def test_real_pneumoniamnist_matches_its_readme(real):
    assert real.train.x.shape == (4708, 1, 28, 28)
    assert real.val.x.shape == (524, 1, 28, 28) and real.test.x.shape == (624, 1, 28, 28)
    assert np.bincount(real.train.y).tolist() == [1214, 3494]
    assert np.bincount(real.val.y).tolist() == [135, 389]
    assert np.bincount(real.test.y).tolist() == [234, 390]
    assert real.class_names == ("normal", "pneumonia") and real.eval_split.endswith("(624 images)")
    assert real.val_split == "official val split of pneumoniamnist.npz (524 images)"
    with np.load(REAL) as npz:
        arrays = {k: npz[k] for k in ("train_images", "val_images", "test_images")}
    for split in ("train", "val", "test"):
        assert_standardised(getattr(real, split).x, arrays, split)
    assert real.normalization["computed_on"] == "train split (4708 images)"
    np.testing.assert_allclose(real.train.x.mean(), 0.0, atol=1e-4)
    np.testing.assert_allclose(real.train.x.std(), 1.0, atol=1e-4)


def test_real_partition_only_uses_training_images(real):
    part = make_partition(real.train.y, 2, 4, 0.6, None, seed=0)
    assert part.base_per_class == 1214 // 4
    for idx in part.train_indices:
        assert idx.max() < len(real.train.y)
    # the held-out set is a separate array that no partition index can reach
    assert not np.shares_memory(real.test.x, real.train.x)
