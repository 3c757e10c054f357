"""COVID-19 Radiography loader on a fixture tree in the database's layout: class folders, label order."""

import numpy as np
import pytest

from fixtures_data import write_covid
from mpicd.config.sections import ConfigError, DataConfig
from mpicd.data import load_dataset

COUNTS = {"Normal": 11, "COVID": 8, "Lung_Opacity": 3}


def load(path, **kw):
    return load_dataset(DataConfig(name="covid", path=str(path), **kw))


def greys(ds, split):
    """Grey levels of a split's flat images, undoing the standardisation the dataset records."""
    x = split.x * np.float32(ds.normalization["std"][0]) + np.float32(ds.normalization["mean"][0])
    return [int(round(float(image.mean()) * 255)) for image in x]


def test_default_classes_are_normal_then_covid(tmp_path):
    levels = write_covid(tmp_path / "db", COUNTS)
    ds = load(tmp_path / "db")
    assert ds.name == "covid" and ds.class_names == ("Normal", "COVID") and ds.num_classes == 2
    # Normal 11: 2 test (2.2), 1 val (1.1), 8 train; COVID 8: 2 test (1.6), 1 val (0.8), 5 train
    assert ds.train.x.shape == (13, 1, 64, 64) and ds.test.x.shape == (4, 1, 64, 64)
    assert np.bincount(ds.test.y).tolist() == [2, 2] and "(4 images)" in ds.eval_split
    assert np.bincount(ds.val.y).tolist() == [1, 1] and "(2 images)" in ds.val_split
    label_of = {g: c for c, name in enumerate(ds.class_names) for g in levels[name]}
    for split in (ds.train, ds.val, ds.test):
        assert [label_of[g] for g in greys(ds, split)] == split.y.tolist()
    assert sorted(greys(ds, ds.train) + greys(ds, ds.val) + greys(ds, ds.test)) == sorted(label_of)
    train = np.array(greys(ds, ds.train)) / 255.0
    assert ds.normalization["mean"] == pytest.approx([train.mean()], abs=1e-6)
    assert ds.normalization["std"] == pytest.approx([train.std()], abs=1e-6)


def test_classes_key_sets_label_order_and_size(tmp_path):
    levels = write_covid(tmp_path / "db", COUNTS)
    ds = load(
        tmp_path / "db",
        classes=["COVID", "Lung_Opacity", "Normal"],
        image_size=12,
        test_fraction=0.34,
        val_fraction=0.34,
    )
    assert ds.class_names == ("COVID", "Lung_Opacity", "Normal") and ds.input_shape == (1, 12, 12)
    assert np.bincount(ds.test.y).tolist() == [3, 1, 4] and np.bincount(ds.val.y).tolist() == [3, 1, 4]
    every = greys(ds, ds.train) + greys(ds, ds.val) + greys(ds, ds.test)
    assert sorted(every) == sorted(sum(levels.values(), []))


def test_three_images_of_a_class_cannot_fill_three_splits_at_the_default_fractions(tmp_path):
    write_covid(tmp_path / "db", COUNTS)
    with pytest.raises(ConfigError, match=r"class 'Lung_Opacity' has 3 cases in .*db.*0 for validation") as err:
        load(tmp_path / "db", classes=["Normal", "Lung_Opacity"])  # 1 test (0.6), 0 val (0.3)
    assert err.value.key == "data.val_fraction"


def test_split_is_deterministic(tmp_path):
    write_covid(tmp_path / "db", COUNTS)

    def split_greys(**kw):
        ds = load(tmp_path / "db", image_size=8, **kw)
        return tuple(greys(ds, ds.val)), tuple(greys(ds, ds.test))

    assert split_greys() == split_greys()
    assert len({split_greys(split_seed=s)[1] for s in range(5)}) > 1
    assert len({split_greys(split_seed=s)[0] for s in range(5)}) > 1
    assert split_greys(val_fraction=0.3)[1] == split_greys()[1]  # test set unchanged by val_fraction


def test_missing_or_empty_class_folder_is_named(tmp_path):
    write_covid(tmp_path / "db", {"Normal": 5})
    with pytest.raises(ConfigError, match=r"'COVID'.*COVID/images.*does not exist") as err:
        load(tmp_path / "db")
    assert err.value.key == "data.path"
    (tmp_path / "db" / "Viral" / "images").mkdir(parents=True)
    with pytest.raises(ConfigError, match=r"Viral/images.*has no \.png images") as err:
        load(tmp_path / "db", classes=["Normal", "Viral"])
    assert err.value.key == "data.classes"


def test_bad_path_and_bad_classes(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_dataset(DataConfig(name="covid"))
    assert err.value.key == "data.path"
    with pytest.raises(ConfigError, match="nowhere.*does not exist"):
        load(tmp_path / "nowhere")
    write_covid(tmp_path / "db", COUNTS)
    for classes in (["Normal"], ["Normal", "Normal"]):
        with pytest.raises(ConfigError) as err:
            load(tmp_path / "db", classes=classes)
        assert err.value.key == "data.classes"
