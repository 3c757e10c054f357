"""COVID-19 Radiography loader on a fixture tree in the database's layout: class folders, label order."""

import numpy as np
import pytest

from fixtures_data import write_covid
from mpicd.config import ConfigError, DataConfig
from mpicd.data import load_dataset

COUNTS = {"Normal": 11, "COVID": 8, "Lung_Opacity": 3}


def load(path, **kw):
    return load_dataset(DataConfig(name="covid", path=str(path), **kw))


def greys(split):
    return [int(round(float(x.mean()) * 255)) for x in split.x]


def test_default_classes_are_normal_then_covid(tmp_path):
    levels = write_covid(tmp_path / "db", COUNTS)
    ds = load(tmp_path / "db")
    assert ds.name == "covid" and ds.class_names == ("Normal", "COVID") and ds.num_classes == 2
    assert ds.train.x.shape == (15, 1, 64, 64) and ds.test.x.shape == (4, 1, 64, 64)
    assert np.bincount(ds.test.y).tolist() == [2, 2] and "(4 images)" in ds.eval_split
    label_of = {g: c for c, name in enumerate(ds.class_names) for g in levels[name]}
    for split in (ds.train, ds.test):
        assert [label_of[g] for g in greys(split)] == split.y.tolist()
    assert sorted(greys(ds.train) + greys(ds.test)) == sorted(label_of)


def test_classes_key_sets_label_order_and_size(tmp_path):
    levels = write_covid(tmp_path / "db", COUNTS)
    ds = load(tmp_path / "db", classes=["COVID", "Lung_Opacity", "Normal"], image_size=12, test_fraction=0.34)
    assert ds.class_names == ("COVID", "Lung_Opacity", "Normal") and ds.input_shape == (1, 12, 12)
    assert np.bincount(ds.test.y).tolist() == [3, 1, 4]
    assert set(greys(ds.train)) | set(greys(ds.test)) == set(sum(levels.values(), []))


def test_split_is_deterministic(tmp_path):
    write_covid(tmp_path / "db", COUNTS)
    assert greys(load(tmp_path / "db").test) == greys(load(tmp_path / "db").test)
    assert len({tuple(greys(load(tmp_path / "db", split_seed=s).test)) for s in range(5)}) > 1


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
