"""Partition: exact skew counts in both skew modes, nesting across skews, disjoint clients,
determinism, and the configuration errors."""

import numpy as np
import pytest

from mpicd.config import ConfigError, DataConfig
from mpicd.data import load_dataset
from mpicd.data.partition import expertise_classes, kept_after_skew, make_partition


def labels_with(counts, seed=0):
    labels = np.repeat(np.arange(len(counts)), counts)
    return np.random.default_rng(seed).permutation(labels)


@pytest.mark.parametrize(
    "n, skew, kept",
    [
        (10, 0.0, 10),
        (10, 0.6, 4),
        (10, 0.9, 1),
        (100, 0.2, 80),
        (600, 0.6, 240),
        (50, 0.8, 10),
        (3, 0.7, 0),
        (7, 0.5, 3),
    ],
)
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


def test_the_size_error_names_the_rarest_class_not_the_first_short_one():
    # class 0 (300) is short of 4 x 100 too, but the limit, 60 // 4 = 15, comes from class 2
    labels = labels_with([300, 500, 60])
    with pytest.raises(ConfigError) as err:
        make_partition(labels, 3, 4, 0.0, 100, seed=0)
    message = str(err.value)
    assert "class 2, the rarest, has 60" in message and "short: classes 0, 2" in message
    assert "largest allowed value is 15 = 60 // 4" in message


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


SKEWS = (0.0, 0.2, 0.4, 0.6, 0.8, 0.9)
KEPT_OF_20 = {0.0: 20, 0.2: 16, 0.4: 12, 0.6: 8, 0.8: 4, 0.9: 2}  # floor((1 - s) * 20), by hand


def as_sets(part):
    return [set(idx.tolist()) for idx in part.train_indices]


def by_class(labels, idx, c):
    return set(idx[labels[idx] == c].tolist())


@pytest.mark.parametrize("skew_mode", ["symmetric", "authors"])
@pytest.mark.parametrize("clients, counts", [(4, [300, 700]), (6, [130, 200, 150])])
def test_partitions_are_nested_across_skews(skew_mode, clients, counts):
    labels = labels_with(counts, seed=5)
    num_classes = len(counts)
    parts = [make_partition(labels, num_classes, clients, s, 20, seed=11, skew_mode=skew_mode) for s in SKEWS]
    for s, part in zip(SKEWS, parts):
        everything = np.concatenate(part.train_indices)
        assert len(np.unique(everything)) == len(everything)  # disjoint across clients
        assert everything.min() >= 0 and everything.max() < len(labels)
        for i, idx in enumerate(part.train_indices):
            expert = i % num_classes
            loses = skew_mode == "symmetric" or expert == 0
            expected = [20 if c == expert or not loses else KEPT_OF_20[s] for c in range(num_classes)]
            assert np.bincount(labels[idx], minlength=num_classes).tolist() == expected
    for lower, higher in zip(parts, parts[1:]):
        for i, (a, b) in enumerate(zip(as_sets(lower), as_sets(higher))):
            assert b <= a, f"client {i}: images at the higher skew are not a subset of the lower skew's"
            expert = i % num_classes
            assert by_class(labels, lower.train_indices[i], expert) == by_class(labels, higher.train_indices[i], expert)


def test_partitions_are_nested_across_images_per_class():
    labels = labels_with([300, 700], seed=2)
    small, large = (make_partition(labels, 2, 4, 0.6, n, seed=4) for n in (10, 30))
    for a, b in zip(as_sets(small), as_sets(large)):
        assert a < b


def test_authors_mode_counts_by_hand():
    labels = labels_with([100, 100])
    part = make_partition(labels, 2, 4, 0.6, 10, seed=0, skew_mode="authors")
    assert part.train_counts.tolist() == [[10, 4], [10, 10], [10, 4], [10, 10]]
    labels = labels_with([100, 90, 80])
    part = make_partition(labels, 3, 4, 0.5, None, seed=0, skew_mode="authors")
    assert part.train_counts.tolist() == [[20, 10, 10], [20, 20, 20], [20, 20, 20], [20, 10, 10]]
    for idx, expected in zip(part.train_indices, part.train_counts.tolist()):
        assert np.bincount(labels[idx], minlength=3).tolist() == expected


def test_authors_mode_takes_the_same_images_as_symmetric_mode():
    """Expert-in-0 clients lose exactly what the symmetric rule takes; the others keep their skew-0 set."""
    labels = labels_with([200, 300])
    authors = make_partition(labels, 2, 4, 0.8, 40, seed=9, skew_mode="authors")
    symmetric = make_partition(labels, 2, 4, 0.8, 40, seed=9)
    unskewed = make_partition(labels, 2, 4, 0.0, 40, seed=9)
    for i in range(4):
        reference = symmetric if i % 2 == 0 else unskewed
        np.testing.assert_array_equal(authors.train_indices[i], reference.train_indices[i])


def test_authors_mode_still_refuses_an_emptied_class():
    with pytest.raises(ConfigError) as err:
        make_partition(labels_with([100, 100]), 2, 4, 0.9, 5, seed=0, skew_mode="authors")
    assert err.value.key == "data.skew" and "client 0" in str(err.value)
    # at the same skew, only expert-in-0 clients lose images: 2 clients expert in 1 would be fine
    assert make_partition(
        labels_with([100, 100]), 2, 2, 0.9, 10, seed=0, skew_mode="authors"
    ).train_counts.tolist() == [[10, 1], [10, 10]]


def test_unknown_skew_mode_is_an_error():
    with pytest.raises(ConfigError) as err:
        make_partition(labels_with([100, 100]), 2, 4, 0.0, None, seed=0, skew_mode="asymmetric")
    assert err.value.key == "data.skew_mode" and "asymmetric" in str(err.value)


def test_partition_of_a_loaded_dataset_indexes_only_its_training_split():
    ds = load_dataset(DataConfig())
    held = {r.tobytes() for r in np.concatenate([ds.val.x, ds.test.x])}
    for s in SKEWS[:4]:
        part = make_partition(ds.train.y, 2, 4, s, None, seed=0)
        for idx in part.train_indices:
            assert idx.max() < len(ds.train.y)
            assert not {r.tobytes() for r in ds.train.x[idx]} & held
