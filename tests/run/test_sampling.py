"""``train.sampler``: shuffle (a permutation, as before the key existed) or balanced (class-balanced
draws with replacement), for every method; refused with DP-SGD, accepted with the representation
releases, whose Poisson sample is their own.

Expected values: the probabilities 1 / (K n_c) worked by hand; class frequencies against their
expectation with a bound of several standard deviations of the binomial (fixed seeds, so the test is
deterministic; a uniform draw over images, the mutation that matters, lands far outside it).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from mpicd.config.loading import load_config
from mpicd.config.sections import ADDED_LATER, ConfigError, TrainConfig
from mpicd.core import seeds
from mpicd.run.client import Client
from mpicd.run.plan import prepare
from mpicd.run.sampling import class_balanced_probabilities, epoch_order

from conftest import QUICKSTART


def test_probabilities_by_hand():
    # 3 of class 0, 1 of class 1 (K = 2): 1 / (2 * 3) each for class 0, 1 / (2 * 1) for class 1
    np.testing.assert_allclose(class_balanced_probabilities(np.array([0, 1, 0, 0])), [1 / 6, 1 / 2, 1 / 6, 1 / 6])
    # classes 0 and 2 held, 1 lacked (K = 2): 1 / (2 * 2) and 1 / (2 * 1)
    np.testing.assert_allclose(class_balanced_probabilities(np.array([2, 0, 0])), [1 / 2, 1 / 4, 1 / 4])
    assert class_balanced_probabilities(np.array([1, 1, 1])).tolist() == [1 / 3] * 3


def test_shuffle_is_the_permutation_runs_always_drew():
    labels = np.array([0, 1, 1, 0, 1])
    want = seeds.rng(7, seeds.SHUFFLE, 2, 3, 0).permutation(5)
    got = epoch_order(len(labels), "shuffle", seeds.rng(7, seeds.SHUFFLE, 2, 3, 0))
    assert np.array_equal(got, want) and sorted(got.tolist()) == list(range(5))


def test_balanced_draws_every_held_class_equally_often():
    labels = np.array([0] * 900 + [1] * 100)  # 90% / 10%
    order = epoch_order(len(labels), "balanced", seeds.rng(0, seeds.SHUFFLE, 0, 0, 0), labels)
    assert len(order) == 1000 and order.dtype.kind == "i"
    share = (labels[order] == 1).mean()
    assert abs(share - 0.5) < 4 * np.sqrt(0.25 / 1000), share  # 0.5 +- 0.063; a uniform draw gives 0.1
    # three classes, one of them lacking: the two held share the draws, the lacking one stays absent
    labels = np.array([0] * 50 + [2] * 950)
    drawn = labels[epoch_order(len(labels), "balanced", seeds.rng(1, seeds.SHUFFLE, 0, 0, 0), labels)]
    assert set(drawn.tolist()) == {0, 2} and abs((drawn == 0).mean() - 0.5) < 0.063
    empty = np.zeros(0, dtype=np.int64)
    assert len(epoch_order(0, "balanced", seeds.rng(0, seeds.SHUFFLE, 0, 0, 0), empty)) == 0


EPOCHS = 20


def seen_labels(sampler: str) -> np.ndarray:
    """The labels a real client (local training, quick start, client 0) trains on in one round of
    EPOCHS epochs (its 51 images once would bound a share only to +-0.28)."""
    overrides = [
        "clients=4",
        "device=cpu",
        "algorithm=local",
        f"train.sampler={sampler}",
        f"train.local_epochs={EPOCHS}",
    ]
    plan = prepare(load_config(QUICKSTART, overrides))
    c = Client(plan, SimpleNamespace(rank=0, size=4), "cpu")
    seen = []
    c.algorithm.observe_batch = lambda batch: seen.append(batch.y.numpy().copy())
    c.local_epochs(0)
    return np.concatenate(seen), plan.dataset.train.y[plan.partition.train_indices[0]]


def test_a_clients_epoch_draws_balanced_batches():
    shuffled, own = seen_labels("shuffle")
    assert np.array_equal(np.bincount(shuffled), EPOCHS * np.bincount(own))  # each image once per epoch
    minority = np.bincount(own).min() / len(own)
    assert minority < 0.35, "the quick start's client 0 must be skewed"
    balanced, _ = seen_labels("balanced")
    assert len(balanced) == EPOCHS * len(own)  # the same number of draws, so the same batches per epoch
    share = np.bincount(balanced, minlength=2).min() / len(balanced)
    assert abs(share - 0.5) < 4 * np.sqrt(0.25 / len(balanced)), (share, minority)  # +-0.063; shuffle: 0.275


def test_the_key_its_default_and_older_files():
    assert TrainConfig().sampler == "shuffle" and ADDED_LATER["train.sampler"] == (None, "shuffle")
    with pytest.raises(ConfigError) as err:
        load_config(QUICKSTART, ["train.sampler=oversample"])
    assert err.value.key == "train.sampler"


def test_dpsgd_refuses_balanced_sampling_and_the_representation_releases_accept_it():
    private = "privacy={epsilon: 8, noise_multiplier: 1.0}"
    for name in ("fedavg", "fedamp"):
        with pytest.raises(ConfigError) as err:
            prepare(load_config(QUICKSTART, [f"algorithm={name}", private, "train.sampler=balanced", "model.name=mlp"]))
        assert err.value.key == "train.sampler" and "Poisson" in str(err.value), name
    releases = "privacy={epsilon: 8}"
    for section in ("{name: codistill, k: all}", "{name: fedproto}", "{name: feddistill}"):
        plan = prepare(load_config(QUICKSTART, [f"algorithm={section}", releases, "train.sampler=balanced"]))
        assert plan.privacy is not None and plan.config.train.sampler == "balanced"
