"""Centralised training: every rank trains on the union of all clients' data; nothing crosses MPI."""

import types

import numpy as np

from mpicd.algorithms.centralized import Centralized
from mpicd.config.loading import load_config
from mpicd.results.reader import Results
from mpicd.run.client import Client
from mpicd.run.plan import prepare

from conftest import QUICKSTART


def test_every_rank_trains_on_the_union_and_is_evaluated_on_the_held_out_set():
    plan = prepare(load_config(QUICKSTART, ["algorithm={name: centralized}"]))
    assert plan.algorithm_cls is Centralized and Centralized.trains_on_union
    union = np.concatenate(plan.partition.train_indices)
    assert len(np.unique(union)) == len(union) == plan.partition.train_counts.sum()
    for rank in (0, 3):
        client = Client(plan, types.SimpleNamespace(rank=rank, size=4), "cpu")
        np.testing.assert_array_equal(client.train_y.numpy(), plan.dataset.train.y[union])
        np.testing.assert_array_equal(client.eval_sets["test"][1], plan.dataset.test.y)
        assert client.expertise_class == plan.partition.expertise[rank]  # scored on its client's minority class


def test_no_bytes_and_a_better_minority_accuracy_than_local(baselines):
    ranks, out = baselines
    central, local = Results(out / "centralized_quick.h5"), Results(out / "local_quick.h5")
    assert central.metrics["bytes_sent"].sum() == 0 and central.metrics["bytes_recv"].sum() == 0
    assert (central.bytes_sent_by_kind == 0).all() and (central.bytes_recv_by_kind == 0).all()
    # the union holds ~ranks times as many images of every class: the upper reference
    assert central.metrics["minority_acc"][-1].mean() >= local.metrics["minority_acc"][-1].mean()
