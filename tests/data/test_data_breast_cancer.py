"""Built-in breast cancer data: 569 cases, disjoint stratified val and test splits, train-only scaling."""

import typing

import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer

from mpicd.config.sections import ConfigError, DataConfig
from mpicd.data import LOADERS, load_dataset
from mpicd.data.base import stratified_split
from mpicd.data.partition import make_partition


@pytest.fixture(scope="module")
def dataset():
    return load_dataset(DataConfig())


def rows(x):
    return {r.tobytes() for r in x}


def test_shapes_labels_and_metadata(dataset):
    assert len(dataset.train.y) + len(dataset.val.y) + len(dataset.test.y) == 569
    assert dataset.input_shape == (30,) and dataset.kind == "tabular"
    assert dataset.class_names == ("malignant", "benign") and dataset.num_classes == 2
    assert dataset.train.x.dtype == np.float32 and dataset.train.y.dtype == np.int64
    assert dataset.eval_split == "stratified 0.2 of each class held out with split_seed=0 (113 cases)"
    assert dataset.val_split == (
        "stratified 0.1 of each class, drawn with split_seed=0 from what is not held out (57 cases)"
    )
    assert dataset.normalization["computed_on"] == "train split (399 cases)"


def test_splits_are_stratified_and_disjoint(dataset):
    # sklearn: 212 malignant, 357 benign; 20% of each class held out, 10% for validation, rounded
    assert np.bincount(dataset.test.y).tolist() == [42, 71]
    assert np.bincount(dataset.val.y).tolist() == [21, 36]  # 21.2, 35.7
    assert np.bincount(dataset.train.y).tolist() == [149, 250]
    train, val, test = rows(dataset.train.x), rows(dataset.val.x), rows(dataset.test.x)
    assert not train & val and not train & test and not val & test


def test_standardised_with_training_statistics_only(dataset):
    raw = load_breast_cancer()
    train, val, test = stratified_split(raw.target, DataConfig(), ("malignant", "benign"), "sklearn")
    mean, std = raw.data[train].mean(axis=0), raw.data[train].std(axis=0)
    for split, idx in ((dataset.train, train), (dataset.val, val), (dataset.test, test)):
        np.testing.assert_allclose(split.x, (raw.data[idx] - mean) / std, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dataset.normalization["mean"], mean, rtol=1e-5)
    np.testing.assert_allclose(dataset.normalization["std"], std, rtol=1e-5)
    np.testing.assert_allclose(dataset.train.x.mean(axis=0), 0.0, atol=1e-5)
    np.testing.assert_allclose(dataset.train.x.std(axis=0), 1.0, atol=1e-5)
    assert np.abs(dataset.test.x.mean(axis=0)).max() > 1e-3


def test_split_follows_split_seed_and_fraction(dataset):
    again = load_dataset(DataConfig())
    np.testing.assert_array_equal(again.test.x, dataset.test.x)
    other = load_dataset(DataConfig(split_seed=1))
    assert rows(other.test.x) != rows(dataset.test.x)
    half = load_dataset(DataConfig(test_fraction=0.5))
    assert np.bincount(half.test.y).tolist() == [106, 179]  # 0.5 * 357 = 178.5 rounds up
    wider = load_dataset(DataConfig(val_fraction=0.3))
    assert np.bincount(wider.val.y).tolist() == [64, 107]  # 63.6, 107.1
    unscaled = [
        d.test.x * np.float32(d.normalization["std"]) + np.float32(d.normalization["mean"]) for d in (dataset, wider)
    ]
    np.testing.assert_allclose(unscaled[1], unscaled[0], rtol=1e-4, atol=1e-3)  # same test cases


def test_no_held_out_or_validation_case_reaches_a_client(dataset):
    part = make_partition(dataset.train.y, 2, 4, 0.6, None, seed=0)
    held_out = rows(dataset.test.x) | rows(dataset.val.x)
    for idx in part.train_indices:
        assert idx.max() < len(dataset.train.y)
        assert not rows(dataset.train.x[idx]) & held_out


@pytest.mark.parametrize("key, value", [("path", "/tmp/x"), ("classes", ["a", "b"]), ("image_size", 32)])
def test_keys_it_does_not_use_are_errors(key, value):
    with pytest.raises(ConfigError) as err:
        load_dataset(DataConfig(**{key: value}))
    assert err.value.key == f"data.{key}" and "breast_cancer" in str(err.value)


def test_registry_covers_every_configurable_format():
    names = typing.get_args(typing.get_type_hints(DataConfig)["name"])
    assert set(LOADERS) == set(names)
    with pytest.raises(ConfigError) as err:
        load_dataset(DataConfig(name="imagenet"))
    assert err.value.key == "data.name"


def test_the_bundled_csv_read_directly_equals_scikit_learns_loader():
    """mpicd reads scikit-learn's breast_cancer.csv without importing scikit-learn (start-up)."""
    from sklearn.datasets import load_breast_cancer

    from mpicd.data.breast_cancer import bundled

    data, target = bundled()
    bunch = load_breast_cancer()
    assert np.array_equal(data, bunch.data) and data.dtype == bunch.data.dtype
    assert np.array_equal(target, bunch.target)
