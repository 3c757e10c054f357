"""Partition: exact skew counts, disjoint clients, determinism, and the two configuration errors."""

import numpy as np
import pytest

from mpicd.config import ConfigError
from mpicd.data.partition import expertise_classes, kept_after_skew, make_partition


def labels_with(counts, seed=0):
    labels = np.repeat(np.arange(len(counts)), counts)
    return np.random.default_rng(seed).permutation(labels)


@pytest.mark.parametrize("n, skew, kept", [(10, 0.0, 10), (10, 0.6, 4), (10, 0.9, 1), (100, 0.2, 80),
                                          (600, 0.6, 240), (50, 0.8, 10), (3, 0.7, 0), (7, 0.5, 3)])
def test_kept_after_skew_is_floor_of_kept_fraction(n, skew, kept):
    assert kept_after_skew(n, skew) == kept


def test_expertise_is_round_robin():
    assert expertise_classes(6, 2).tolist() == [0, 1, 0, 1, 0, 1]
    assert expertise_classes(4, 3).tolist() == [0, 1, 2, 0]
    assert expertise_classes(1, 2).dtype == np.int64


@pytest.mark.parametrize("clients", [1, 2, 4, 6])
@pytest.mark.parametrize("skew", [0.0, 0.2, 0.6, 0.9])
@pytest.mark.parametrize("images_per_class", [None, 30])
def test_counts_follow_the_skew_formula_exactly(clients, skew, images_per_class):
    labels = labels_with([300, 700])
    part = make_partition(labels, 2, clients, skew, images_per_class, seed=3)
    base = images_per_class if images_per_class is not None else 300 // clients
    assert part.base_per_class == base
    assert part.expertise.tolist() == [i % 2 for i in range(clients)]
    for i, idx in enumerate(part.train_indices):
        expected = [base if c == i % 2 else kept_after_skew(base, skew) for c in range(2)]
        assert part.train_counts[i].tolist() == expected
        assert np.bincount(labels[idx], minlength=2).tolist() == expected
        assert idx.dtype == np.int64 and np.all(np.diff(idx) > 0)
    assert part.train_counts.dtype == np.int64 and part.train_counts.shape == (clients, 2)


def test_three_classes_four_clients():
    labels = labels_with([100, 90, 80])
    part = make_partition(labels, 3, 4, 0.5, None, seed=0)
    assert part.base_per_class == 20
    assert part.train_counts.tolist() == [[20, 10, 10], [10, 20, 10], [10, 10, 20], [20, 10, 10]]


def test_clients_are_disjoint_and_index_the_training_labels_only():
    labels = labels_with([60, 100])
    part = make_partition(labels, 2, 6, 0.2, None, seed=1)
    everything = np.concatenate(part.train_indices)
    assert len(np.unique(everything)) == len(everything)
    assert everything.min() >= 0 and everything.max() < len(labels)


def test_deterministic_from_the_seed_and_sensitive_to_it():
    labels = labels_with([200, 200])
    a = make_partition(labels, 2, 4, 0.6, 25, seed=7)
    b = make_partition(labels, 2, 4, 0.6, 25, seed=7)
    c = make_partition(labels, 2, 4, 0.6, 25, seed=8)
    assert all(np.array_equal(x, y) for x, y in zip(a.train_indices, b.train_indices))
    assert not all(np.array_equal(x, y) for x, y in zip(a.train_indices, c.train_indices))


def test_too_many_images_per_class_names_class_count_clients_and_limit():
    labels = labels_with([50, 200])
    with pytest.raises(ConfigError) as err:
        make_partition(labels, 2, 4, 0.0, 20, seed=0)
    assert err.value.key == "data.images_per_class"
    message = str(err.value)
    assert "class 0" in message and "50" in message and "4 clients" in message
    assert "largest allowed value is 12" in message


def test_skew_that_empties_a_class_on_a_client_is_an_error():
    labels = labels_with([100, 100])
    with pytest.raises(ConfigError) as err:
        make_partition(labels, 2, 4, 0.9, 5, seed=0)
    assert err.value.key == "data.skew"
    message = str(err.value)
    assert "client 0" in message and "class 1" in message and "0.9" in message and "5" in message


def test_class_rarer_than_the_client_count_is_an_error():
    with pytest.raises(ConfigError) as err:
        make_partition(labels_with([3, 100]), 2, 4, 0.0, None, seed=0)
    assert err.value.key == "clients" and "class 0 has 3" in str(err.value)
