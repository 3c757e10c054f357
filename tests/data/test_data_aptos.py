"""APTOS 2019 loader on a fixture tree in the Kaggle layout: binarised labels, grey, resized, held out."""

import numpy as np
import pytest

from fixtures_data import write_aptos, write_png
from mpicd.config.sections import ConfigError, DataConfig
from mpicd.data import load_dataset

DIAGNOSES = [0, 2, 0, 4, 0, 1, 0, 3, 0, 0, 2, 1]  # 6 without DR, 6 with


def load(path, **kw):
    return load_dataset(DataConfig(name="aptos", path=str(path), **kw))


def unscaled(ds, split):
    """A split's images back in [0, 1], undoing the standardisation the dataset records."""
    return split.x * np.float32(ds.normalization["std"][0]) + np.float32(ds.normalization["mean"][0])


def test_layout_loads_binarised_grey_and_resized(tmp_path):
    truth = write_aptos(tmp_path / "aptos", DIAGNOSES)
    ds = load(tmp_path / "aptos")
    assert ds.name == "aptos" and ds.kind == "image"
    assert ds.class_names == ("no_dr", "dr") and ds.num_classes == 2
    # 6 + 6 images: round(0.2 * 6) = 1 of each class for test, round(0.1 * 6) = 1 for val
    assert ds.train.x.shape == (8, 1, 64, 64) and ds.test.x.shape == (2, 1, 64, 64)
    assert ds.val.x.shape == (2, 1, 64, 64) and np.bincount(ds.val.y).tolist() == [1, 1]
    assert ds.train.x.dtype == np.float32 and np.bincount(ds.test.y).tolist() == [1, 1]
    assert "split_seed=0" in ds.eval_split and "(2 images)" in ds.eval_split
    assert "split_seed=0" in ds.val_split and "(2 images)" in ds.val_split
    label_of_grey = {grey: int(grade > 0) for grey, grade in truth.values()}
    seen = {}
    for name in ("train", "val", "test"):
        split = getattr(ds, name)
        for x, y in zip(unscaled(ds, split), split.y):
            grey = int(round(float(x.mean()) * 255))
            np.testing.assert_allclose(x, grey / 255.0, atol=1e-5)
            assert label_of_grey[grey] == y and grey not in seen
            seen[grey] = name
    assert set(seen) == set(label_of_grey)
    train_greys = np.array([g for g, name in seen.items() if name == "train"]) / 255.0
    assert ds.normalization["mean"] == pytest.approx([train_greys.mean()], abs=1e-6)
    assert ds.normalization["std"] == pytest.approx([train_greys.std()], abs=1e-6)  # flat images
    assert ds.normalization["computed_on"] == "train split (8 images)"


def test_image_size_and_split_seed(tmp_path):
    write_aptos(tmp_path / "aptos", DIAGNOSES)
    assert load(tmp_path / "aptos", image_size=16).input_shape == (1, 16, 16)

    def test_greys(split_seed):
        ds = load(tmp_path / "aptos", split_seed=split_seed, image_size=8)
        return tuple(np.round(unscaled(ds, ds.test).mean(axis=(1, 2, 3)) * 255).astype(int))

    assert test_greys(0) == test_greys(0)
    assert len({test_greys(s) for s in range(6)}) > 1


def test_missing_path_and_files_are_named(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_dataset(DataConfig(name="aptos"))
    assert err.value.key == "data.path"
    with pytest.raises(ConfigError, match="nowhere.*does not exist"):
        load(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"train\.csv.*does not exist"):
        load(tmp_path / "empty")


def test_missing_column_is_named(tmp_path):
    write_aptos(tmp_path / "aptos", DIAGNOSES)
    (tmp_path / "aptos" / "train.csv").write_text("id_code,level\nabc,0\n")
    with pytest.raises(ConfigError, match=r"train\.csv.*no column 'diagnosis'"):
        load(tmp_path / "aptos")


def test_listed_image_that_does_not_exist_is_named(tmp_path):
    truth = write_aptos(tmp_path / "aptos", DIAGNOSES)
    gone = sorted(truth)[3]
    (tmp_path / "aptos" / "train_images" / f"{gone}.png").unlink()
    with pytest.raises(ConfigError, match=f"{gone}.png.*does not exist") as err:
        load(tmp_path / "aptos")
    assert err.value.key == "data.path"


def test_bad_grade_unreadable_image_and_classes_key_are_errors(tmp_path):
    truth = write_aptos(tmp_path / "aptos", DIAGNOSES)
    with pytest.raises(ConfigError) as err:
        load(tmp_path / "aptos", classes=["no_dr", "dr"])
    assert err.value.key == "data.classes"
    first = sorted(truth)[0]
    (tmp_path / "aptos" / "train_images" / f"{first}.png").write_bytes(b"not a png")
    with pytest.raises(ConfigError, match=f"cannot read image .*{first}.png"):
        load(tmp_path / "aptos")
    write_png(tmp_path / "aptos" / "train_images" / f"{first}.png", 10)
    csv = tmp_path / "aptos" / "train.csv"
    csv.write_text(csv.read_text().replace(f"{first},0", f"{first},5"))
    with pytest.raises(ConfigError, match=r"train\.csv' line 2: diagnosis '5'"):
        load(tmp_path / "aptos")


def test_class_too_small_to_hold_out_is_an_error(tmp_path):
    write_aptos(tmp_path / "aptos", [0, 0, 0, 0, 0, 1])
    with pytest.raises(ConfigError, match="class 'dr' has 1 cases") as err:
        load(tmp_path / "aptos")
    assert err.value.key == "data.test_fraction"
