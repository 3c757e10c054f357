"""Partition: exact skew counts in both skew modes, nesting across skews, disjoint clients,
determinism, and the configuration errors; the natural and Dirichlet partitions against the
prevalence, the Dirichlet's moments and rounding by hand."""

import hashlib

import numpy as np
import pytest

from mpicd.config.sections import Config, config_difference, ConfigError, DataConfig, to_mapping
from mpicd.core.schema import from_mapping
from mpicd.data import load_dataset
from mpicd.data.partition import (
    class_proportions,
    expertise_classes,
    kept_after_skew,
    largest_remainder,
    make_partition,
)


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


# --------------------------------------------------------------------------- natural and Dirichlet partitions


def digest(part):
    return hashlib.sha256(b"".join(idx.tobytes() for idx in part.train_indices)).hexdigest()


@pytest.mark.parametrize(
    "counts, clients, skew, cap, seed, mode, sha",
    [  # sha256 of the indices, computed with the partition code before data.partition existed
        (
            [130, 200, 150],
            6,
            0.4,
            20,
            11,
            "symmetric",
            "3bb624f18a05bc57d62894430bcf1568503a130dc546ab467a2d9257dd21d576",
        ),
        ([300, 700], 4, 0.6, None, 3, "authors", "931723d4484118c10e471144c180874109ff84c86e4aed47ef128b94ee24d41c"),
    ],
)
def test_the_default_partition_is_the_one_before_the_new_schemes(counts, clients, skew, cap, seed, mode, sha):
    labels = labels_with(counts, seed=5 if len(counts) == 3 else 0)
    assert digest(make_partition(labels, len(counts), clients, skew, cap, seed, mode)) == sha


def test_largest_remainder_by_hand():
    assert largest_remainder(10, np.array([[0.55, 0.45]])).tolist() == [[6, 4]]  # 5.5, 4.5: tie -> class 0
    assert largest_remainder(10, np.array([[1 / 3, 1 / 3, 1 / 3]])).tolist() == [[4, 3, 3]]
    assert largest_remainder(7, np.array([[0.1, 0.2, 0.7], [0.5, 0.5, 0.0]])).tolist() == [[1, 1, 5], [4, 3, 0]]
    assert largest_remainder(0, np.array([[0.2, 0.8]])).tolist() == [[0, 0]]


def check_disjoint_and_counted(labels, part, classes):
    everything = np.concatenate(part.train_indices)
    assert len(np.unique(everything)) == len(everything) and everything.max() < len(labels)
    for idx, row in zip(part.train_indices, part.train_counts.tolist()):
        assert np.bincount(labels[idx], minlength=classes).tolist() == row
        assert len(idx) > 0


@pytest.mark.parametrize("clients, cap", [(1, None), (4, None), (6, None), (4, 60)])
def test_natural_keeps_the_training_prevalence_within_rounding(clients, cap):
    counts = [500, 300, 97]
    labels = labels_with(counts, seed=3)
    part = make_partition(labels, 3, clients, 0.0, None, seed=2, scheme="natural", images_per_client=cap)
    check_disjoint_and_counted(labels, part, 3)
    prevalence = np.array(counts) / sum(counts)
    m = part.images_per_client
    assert (part.train_counts.sum(axis=1) == m).all()
    if cap is None:  # the most every class allows: one more image per client would overdraw a class
        one_more = clients * largest_remainder(m + 1, prevalence[None, :])[0]
        assert np.any(one_more > np.array(counts)), "one more image per client would still fit"
        assert m >= sum(c // clients for c in counts) - 3  # at most one image of each class lost to rounding
    else:
        assert m == cap
    # |n_ic - m p_c| < 1 for every client and class (largest remainders), so the prevalence is within 1/m
    assert np.all(np.abs(part.train_counts - m * prevalence) < 1)
    assert np.all(np.abs(part.train_counts / m - prevalence) < 1 / m)
    assert part.expertise.tolist() == [0] * clients  # the majority class everywhere
    assert part.base_per_class == 0 and "natural prevalence" in part.description


def test_natural_is_nested_across_images_per_client():
    labels = labels_with([300, 200], seed=1)
    small, large = (make_partition(labels, 2, 4, 0.0, None, 0, scheme="natural", images_per_client=m) for m in (20, 50))
    for a, b in zip(as_sets(small), as_sets(large)):
        assert a < b


def test_dirichlet_draws_are_deterministic_per_seed():
    labels = labels_with([400, 300, 200])
    a, b, c = (make_partition(labels, 3, 5, 0.0, None, s, scheme="dirichlet", alpha=0.5) for s in (7, 7, 8))
    np.testing.assert_array_equal(a.proportions, b.proportions)
    assert digest(a) == digest(b) and a.train_counts.tolist() == b.train_counts.tolist()
    assert not np.allclose(a.proportions, c.proportions) and digest(a) != digest(c)
    check_disjoint_and_counted(labels, a, 3)
    # the same seed, another stream: the draw is not the class permutation's first numbers reused
    assert a.proportions.shape == (5, 3) and np.allclose(a.proportions.sum(axis=1), 1)


def test_dirichlet_counts_round_the_drawn_proportions():
    labels = labels_with([400, 300, 200])
    part = make_partition(labels, 3, 5, 0.0, None, 1, scheme="dirichlet", alpha=0.3, images_per_client=40)
    assert (part.train_counts.sum(axis=1) == 40).all()
    assert np.all(np.abs(part.train_counts - 40 * part.proportions) < 1)
    # the expertise class is the most frequent one, ties -> the lowest index, found here by a loop
    for row, expert in zip(part.train_counts.tolist(), part.expertise.tolist()):
        assert expert == next(c for c in range(3) if row[c] == max(row))
    assert part.description == "dirichlet (alpha 0.3), 40 images per client"


@pytest.mark.parametrize("alpha", [0.1, 1.0, 10.0])
def test_dirichlet_proportions_have_the_dirichlet_mean_and_variance(alpha):
    """E[q_c] = p_c and Var[q_c] = p_c (1 - p_c) / (alpha + 1) for q ~ Dirichlet(alpha p)."""
    counts = np.array([600, 300, 100])
    p = counts / counts.sum()
    labels = labels_with(counts.tolist())
    q = class_proportions(labels, 3, 20_000, "dirichlet", alpha, seed=4)  # 20,000 clients' draws
    n = len(q)
    var = p * (1 - p) / (alpha + 1)
    assert np.all(np.abs(q.mean(axis=0) - p) < 5 * np.sqrt(var / n))  # 5 standard errors
    assert np.all(np.abs(q.var(axis=0) / var - 1) < 0.1)


def test_every_client_gets_an_image_or_a_clear_error():
    with pytest.raises(ConfigError) as err:
        make_partition(labels_with([3, 2]), 2, 6, 0.0, None, 0, scheme="natural")
    assert err.value.key == "clients" and "6 clients" in str(err.value) and "5 training images" in str(err.value)
    part = make_partition(labels_with([5, 5]), 2, 10, 0.0, None, 0, scheme="dirichlet", alpha=0.1)
    assert all(len(idx) == 1 for idx in part.train_indices)
    with pytest.raises(ConfigError) as err:
        make_partition(labels_with([100, 10]), 2, 4, 0.0, None, 0, scheme="natural", images_per_client=40)
    message = str(err.value)  # 40 x (100, 10)/110 = (36.4, 3.6) -> (36, 4): x 4 = (144, 16) for (100, 10)
    assert err.value.key == "data.images_per_client" and "needs 144 images of class 0, which has 100" in message
    assert "(short: classes 0, 1)" in message
    # 27 x (100, 10)/110 = (24.55, 2.45) -> (25, 2), x 4 = (100, 8) fits; 28: (25.45, 2.55) -> (25, 3): 12 > 10
    assert "the largest that fits is 27" in message


@pytest.mark.parametrize(
    "data, key, words",
    [
        ({"partition": "dirichlet"}, "data.dirichlet_alpha", "needs a concentration"),
        ({"partition": "dirichlet", "dirichlet_alpha": 0}, "data.dirichlet_alpha", "must be > 0"),
        ({"dirichlet_alpha": 0.5}, "data.dirichlet_alpha", "partition dirichlet only"),
        ({"partition": "natural", "skew": 0.5}, "data.skew", "partition expertise only"),
        ({"partition": "natural", "skew_mode": "authors"}, "data.skew_mode", "partition expertise only"),
        ({"partition": "dirichlet", "dirichlet_alpha": 1, "images_per_class": 5}, "data.images_per_class", "only"),
        ({"images_per_client": 50}, "data.images_per_client", "natural or dirichlet only"),
        ({"partition": "iid"}, "data.partition", "expertise"),
    ],
)
def test_partition_keys_are_checked_with_clear_errors(data, key, words):
    with pytest.raises(ConfigError) as err:
        from_mapping(Config, {"data": data})
    assert err.value.key == key and words in str(err.value)


def test_files_before_the_partition_keys_count_as_the_expertise_partition():
    now, before = to_mapping(Config()), to_mapping(Config())
    now["algorithm"] = before["algorithm"] = {"name": "local"}  # no algorithm keys added later
    for key in ("partition", "dirichlet_alpha", "images_per_client"):
        del before["data"][key]
    assert config_difference(before, now, "the file", "this run") is None
    now["data"]["partition"] = "natural"
    assert "data.partition" in config_difference(before, now, "the file", "this run")
