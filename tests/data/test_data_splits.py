"""Stratified train/val/test splits and train-only standardisation, checked against hand counts
and statistics recomputed from the raw arrays."""

import numpy as np
import pytest
import yaml

from mpicd.config.loading import load_config
from mpicd.config.sections import ConfigError, DataConfig
from mpicd.data.base import Arrays, standardise, stratified_split

NAMES = ("a", "b", "c")


def labels(counts, seed=0):
    return np.random.default_rng(seed).permutation(np.repeat(np.arange(len(counts)), counts))


def split(y, **kw):
    return stratified_split(y, DataConfig(**kw), NAMES[: int(y.max()) + 1], "fixture.csv")


def test_splits_are_disjoint_cover_everything_and_stratified_by_hand():
    y = labels([20, 35, 10])
    train, val, test = split(y, test_fraction=0.2, val_fraction=0.25)
    # test: round(0.2 n) = 4, 7, 2; val: round(0.25 n) half up = 5, 9 (8.75), 3 (2.5); train the rest
    assert np.bincount(y[test]).tolist() == [4, 7, 2]
    assert np.bincount(y[val]).tolist() == [5, 9, 3]
    assert np.bincount(y[train]).tolist() == [11, 19, 5]
    assert not set(train) & set(val) and not set(train) & set(test) and not set(val) & set(test)
    assert sorted(np.concatenate([train, val, test]).tolist()) == list(range(len(y)))
    for idx in (train, val, test):
        assert idx.dtype.kind == "i" and np.all(np.diff(idx) > 0)


def test_default_fractions_by_hand():
    y = labels([50, 30])
    train, val, test = split(y)  # test 0.2: 10, 6; val 0.1: 5, 3
    assert [np.bincount(y[i]).tolist() for i in (train, val, test)] == [[35, 21], [5, 3], [10, 6]]


def test_split_seed_fixes_the_split_and_changes_it():
    y = labels([40, 60])
    a, b, c = split(y, split_seed=3), split(y, split_seed=3), split(y, split_seed=4)
    assert all(np.array_equal(p, q) for p, q in zip(a, b))
    assert not np.array_equal(a[1], c[1]) and not np.array_equal(a[2], c[2])


@pytest.mark.parametrize("val_fraction", [0.02, 0.1, 0.3, 0.69])
def test_val_fraction_never_changes_the_test_set(val_fraction):
    y = labels([100, 57, 31])
    reference = split(y, val_fraction=0.1)[2]
    np.testing.assert_array_equal(split(y, val_fraction=val_fraction)[2], reference)


def test_a_class_too_small_for_a_split_names_the_key_and_source():
    with pytest.raises(ConfigError, match=r"class 'b' has 4 cases in fixture\.csv.*0 for validation") as err:
        split(labels([20, 4]), test_fraction=0.25, val_fraction=0.1)  # b: 1 test, round(0.4) = 0 val
    assert err.value.key == "data.val_fraction"
    with pytest.raises(ConfigError, match=r"class 'b' has 3 cases.*0 for training") as err:
        split(labels([20, 3]), test_fraction=0.34, val_fraction=0.5)  # b: 1 test, 2 val, 0 train
    assert err.value.key == "data.val_fraction"
    with pytest.raises(ConfigError, match=r"class 'a' has 2 cases.*0 for test") as err:
        split(labels([2, 20]))
    assert err.value.key == "data.test_fraction"


def test_fractions_summing_to_one_are_a_config_error():
    with pytest.raises(ConfigError) as err:
        DataConfig(test_fraction=0.5, val_fraction=0.5)
    assert err.value.key == "data.val_fraction"
    with pytest.raises(ConfigError) as err:
        load_config(None, ["data.test_fraction=0.3", "data.val_fraction=0.75"])
    assert err.value.key == "data.val_fraction" and "0.3 + 0.75" in str(err.value)
    for bad in ("0", "1", "-0.1"):
        with pytest.raises(ConfigError) as err:
            load_config(None, [f"data.val_fraction={bad}"])
        assert err.value.key == "data.val_fraction"
    assert load_config(None, ["data.val_fraction=0.3"]).data.val_fraction == 0.3


def test_skew_mode_is_a_checked_config_key():
    assert load_config(None, []).data.skew_mode == "symmetric"
    assert load_config(None, ["data.skew_mode=authors"]).data.skew_mode == "authors"
    with pytest.raises(ConfigError) as err:
        load_config(None, ["data.skew_mode=both"])
    assert err.value.key == "data.skew_mode"


def naive_stats(x):
    """Mean and population std of each channel (axis 1) over every other axis, by explicit loops."""
    means, stds = [], []
    for c in range(x.shape[1]):
        values = [float(v) for v in x[:, c].ravel()]
        mean = sum(values) / len(values)
        means.append(mean)
        stds.append((sum((v - mean) ** 2 for v in values) / len(values)) ** 0.5)
    return np.array(means), np.array(stds)


def test_images_are_standardised_per_channel_with_training_statistics():
    rng = np.random.default_rng(0)
    raw = [rng.random((n, 3, 5, 4)).astype(np.float32) * np.float32([0.5, 2.0, 1.0])[:, None, None] for n in (12, 5, 7)]
    raw[0][:, 2] = 0.25  # a constant training channel: std 0 -> 1
    raw[2][:, 2] = 0.75
    raw[1] += 1.0  # val lies off the training distribution
    splits = [Arrays(x, np.zeros(len(x), np.int64)) for x in raw]
    train, val, test, stats = standardise(*splits, unit="images")
    mean, std = naive_stats(raw[0])
    assert std[2] == 0.0
    std[2] = 1.0
    np.testing.assert_allclose(stats["mean"], mean, rtol=1e-6)
    np.testing.assert_allclose(stats["std"], std, rtol=1e-6)
    assert stats["computed_on"] == "train split (12 images)"
    shape = (1, 3, 1, 1)
    for got, x in zip((train, val, test), raw):
        np.testing.assert_allclose(got.x, (x - mean.reshape(shape)) / std.reshape(shape), rtol=1e-5, atol=1e-5)
        assert got.x.dtype == np.float32 and got.x.shape == x.shape
    np.testing.assert_allclose(train.x.mean(axis=(0, 2, 3)), 0.0, atol=1e-5)
    np.testing.assert_allclose(train.x.std(axis=(0, 2, 3)), [1.0, 1.0, 0.0], atol=1e-5)
    np.testing.assert_allclose(test.x[:, 2], 0.5, atol=1e-6)  # (0.75 - 0.25) / 1
    assert val.x.mean(axis=(0, 2, 3)).min() > 0.4  # val is not re-centred on itself


def test_tabular_data_is_standardised_per_feature_and_stats_are_plain_yaml():
    rng = np.random.default_rng(1)
    raw = [(rng.normal(size=(n, 4)) * [1, 10, 100, 0.1] + [5, -3, 1000, 0]).astype(np.float32) for n in (30, 6, 9)]
    train, val, test, stats = standardise(*(Arrays(x, np.zeros(len(x), np.int64)) for x in raw), unit="cases")
    mean, std = naive_stats(raw[0][:, :, None])
    np.testing.assert_allclose(stats["mean"], mean, rtol=1e-6)
    np.testing.assert_allclose(stats["std"], std, rtol=1e-6)
    for got, x in zip((train, val, test), raw):
        np.testing.assert_allclose(got.x, (x - mean) / std, rtol=1e-4, atol=1e-4)
    assert stats["computed_on"] == "train split (30 cases)"
    assert all(type(v) is float for v in stats["mean"] + stats["std"])
    assert yaml.safe_load(yaml.safe_dump(stats)) == stats
