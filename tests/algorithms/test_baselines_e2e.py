"""Every algorithm end to end under a real mpiexec (2, 4 and 6 ranks), on the built-in data and on
PneumoniaMNIST: the bytes in the results file are exactly each protocol's payload.

One MPI job per rank count (``tests/drivers/baselines.py``, the session fixture ``baselines`` in
conftest.py) serves every baseline test module, because each mpiexec start costs ~10 s on a
small box.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest

from mpicd.algorithms import REGISTRY
from mpicd.config.loading import load_config
from mpicd.config.sections import ConfigError
from mpicd.results.reader import Results
from mpicd.run.plan import prepare

from conftest import QUICKSTART, require_pneumonia
from drivers.driver_settings import RUN_ROUNDS

ALGORITHMS = (
    "codistill", "local", "fedavg", "fedproto", "feddistill", "fedamp", "centralized", "fedlc", "fedrs", "fedntd",
    "fedrod", "ccvr",
)  # fmt: skip


def expected_bytes(name: str, res: Results) -> tuple[str | None, int, int]:
    """(kind, sent, received) per rank and round as the protocol says; kind None: nothing moves."""
    p, d, c, n = (int(res.attrs[k]) for k in ("num_parameters", "feature_dim", "num_classes", "clients"))
    return {
        "fedavg": ("allreduce", 4 * (p + 1), 4 * (p + 1)),
        "fedlc": ("allreduce", 4 * (p + 1), 4 * (p + 1)),
        "fedrs": ("allreduce", 4 * (p + 1), 4 * (p + 1)),
        "fedntd": ("allreduce", 4 * (p + 1), 4 * (p + 1)),
        "fedrod": ("allreduce", 4 * (p + 1), 4 * (p + 1)),  # body and generic head; the personal head stays
        "ccvr": ("allreduce", 4 * (p + 1), 4 * (p + 1)),  # and its statistics in the last round (last_round_bytes)
        "fedproto": ("allreduce", 4 * c * (d + 1), 4 * c * (d + 1)),
        "feddistill": ("allreduce", 4 * c * (c + 1), 4 * c * (c + 1)),
        "fedamp": ("allgather", 4 * p, 4 * n * p),
        "local": (None, 0, 0),
        "centralized": (None, 0, 0),
    }[name]


def last_round_bytes(name: str, res: Results) -> int:
    """What a method sends (and receives) in the run's last round on top of every round's: CCVR's
    [per-class feature sums ; upper triangle of their outer products ; counts], float64."""
    d, c = int(res.attrs["feature_dim"]), int(res.attrs["num_classes"])
    return 8 * (c * d + c * d * (d + 1) // 2 + c) if name == "ccvr" else 0


def check_bytes(name: str, res: Results, ranks: int) -> None:
    kind, sent, recv = expected_bytes(name, res)
    assert res.completed_rounds == RUN_ROUNDS
    extra = np.zeros((RUN_ROUNDS, ranks), dtype=np.int64)
    extra[-1] = last_round_bytes(name, res)
    assert np.array_equal(res.metrics["bytes_sent"], sent + extra), name
    assert np.array_equal(res.metrics["bytes_recv"], recv + extra), name
    for k, kind_name in enumerate(res.kinds):
        if kind_name != kind:
            assert not res.bytes_sent_by_kind[:, :, k].any() and not res.bytes_recv_by_kind[:, :, k].any(), name
        else:
            assert (res.bytes_sent_by_kind[:, :, k] == sent + extra).all(), name
            assert (res.bytes_recv_by_kind[:, :, k] == recv + extra).all(), name


BASELINES = (
    "fedavg", "fedproto", "feddistill", "fedamp", "local", "centralized", "fedlc", "fedrs", "fedntd", "fedrod", "ccvr",
)  # fmt: skip


@pytest.mark.parametrize("name", BASELINES)
def test_bytes_per_round_per_rank_are_the_protocol_payload(baselines, name):
    ranks, out = baselines
    check_bytes(name, Results(out / f"{name}_quick.h5"), ranks)


@pytest.mark.parametrize("name", BASELINES)
def test_bytes_on_pneumoniamnist(baselines, name):
    require_pneumonia()
    ranks, out = baselines
    res = Results(out / f"{name}_pneumonia.h5")
    assert res.attrs["dataset"] == "pneumoniamnist" and res.attrs["feature_dim"] == 200
    check_bytes(name, res, ranks)


def test_options_keep_the_payload(baselines):
    ranks, out = baselines
    check_bytes("fedproto", Results(out / "fedproto_nearest_quick.h5"), ranks)
    check_bytes("fedproto", Results(out / "fedproto_equal_quick.h5"), ranks)
    check_bytes("feddistill", Results(out / "feddistill_include_quick.h5"), ranks)
    check_bytes("fedamp", Results(out / "fedamp_lambda0_quick.h5"), ranks)


@pytest.mark.parametrize("dataset", ["quick", "pneumonia"])
def test_every_algorithm_runs_end_to_end(baselines, dataset):
    if dataset == "pneumonia":
        require_pneumonia()
    ranks, out = baselines
    for name in ALGORITHMS:
        res = Results(out / f"{name}_{dataset}.h5")
        assert res.attrs["algorithm"] == name and res.config["algorithm"]["name"] == name
        assert res.completed_rounds == RUN_ROUNDS and res.attrs["clients"] == ranks
        for metric in ("train_loss", "test_acc", "balanced_acc", "minority_acc"):
            values = res.metrics[metric]
            assert values.shape == (RUN_ROUNDS, ranks) and np.isfinite(values).all(), (name, metric)
        assert ((res.metrics["test_acc"] >= 0) & (res.metrics["test_acc"] <= 1)).all()


SCORED = ("train_loss", "train_ce", "test_acc", "balanced_acc", "minority_acc", "recall", "val_minority_acc")


@pytest.mark.parametrize("name, neutral", [("fedlc", "tau0"), ("fedrs", "alpha1"), ("fedrs", "hard")])
def test_the_neutral_setting_is_fedavg_bit_for_bit_and_the_default_is_not(baselines, name, neutral):
    """tau = 0 (FedLC) and alpha = 1 (FedRS) leave the softmax as it is, and so does FedRS's hard
    restriction where every client holds every class (the quick start's expertise partition): the
    same scores and losses as FedAvg's, bit for bit; the defaults train something else."""
    _, out = baselines
    fedavg = Results(out / "fedavg_quick.h5")
    same, default = Results(out / f"{name}_{neutral}_quick.h5"), Results(out / f"{name}_quick.h5")
    for metric in SCORED:
        assert np.array_equal(same.metrics[metric], fedavg.metrics[metric], equal_nan=True), (name, metric)
    assert not np.array_equal(default.metrics["train_ce"], fedavg.metrics["train_ce"]), name


@pytest.mark.parametrize("dataset", ["quick", "pneumonia"])
def test_ccvr_is_fedavg_until_its_last_rounds_recalibration(baselines, dataset):
    if dataset == "pneumonia":
        require_pneumonia()
    _, out = baselines
    fedavg, ccvr = Results(out / f"fedavg_{dataset}.h5"), Results(out / f"ccvr_{dataset}.h5")
    np.testing.assert_array_equal(ccvr.metrics["train_loss"], fedavg.metrics["train_loss"])
    for metric in ("recall", "test_acc", "val_minority_acc"):
        np.testing.assert_array_equal(ccvr.metrics[metric][:-1], fedavg.metrics[metric][:-1], err_msg=metric)
    assert (ccvr.metrics["test_acc"][-1] == ccvr.metrics["test_acc"][-1, 0]).all()  # one recalibrated model


def test_fedntd_on_two_classes_is_fedavg_bit_for_bit(baselines):
    """With two classes the not-true distribution has one class: nothing to distil (the quick start)."""
    _, out = baselines
    fedavg, fedntd = Results(out / "fedavg_quick.h5"), Results(out / "fedntd_quick.h5")
    assert fedntd.attrs["num_classes"] == 2
    for metric in SCORED:
        assert np.array_equal(fedntd.metrics[metric], fedavg.metrics[metric], equal_nan=True), metric


@pytest.mark.parametrize("dataset", ["quick", "pneumonia"])
def test_fedrod_scores_its_personal_and_its_generic_model(baselines, dataset):
    """The generic model (body and averaged head) is the same on every client after a round: its
    scores agree across clients; the personal models (with each client's head) are each its own."""
    if dataset == "pneumonia":
        require_pneumonia()
    ranks, out = baselines
    res = Results(out / f"fedrod_{dataset}.h5")
    for split in ("", "val_"):
        acc = res.metrics[f"generic_{split}acc" if split else "generic_test_acc"]
        assert acc.shape == (RUN_ROUNDS, ranks) and np.isfinite(acc).all()
        assert (acc == acc[:, :1]).all(), split  # one generic model
        assert np.isfinite(res.metrics[f"generic_{split}personal_acc"]).all()
    assert not np.array_equal(res.metrics["generic_recall"], res.metrics["recall"])  # the personal heads act
    assert "generic_test_acc" not in Results(out / "fedavg_quick.h5").metrics


@pytest.mark.parametrize("name", ALGORITHMS)
def test_balanced_sampling_runs_with_every_method_and_changes_only_the_training(baselines, name):
    ranks, out = baselines
    shuffled, balanced = Results(out / f"{name}_quick.h5"), Results(out / f"{name}_balanced_quick.h5")
    assert balanced.config["train"]["sampler"] == "balanced" and balanced.completed_rounds == RUN_ROUNDS
    assert np.isfinite(balanced.metrics["train_loss"]).all() and np.isfinite(balanced.metrics["minority_acc"]).all()
    assert not np.array_equal(balanced.metrics["train_loss"], shuffled.metrics["train_loss"]), name
    # the same protocol: the same bytes of the same kinds in every round
    assert np.array_equal(balanced.bytes_sent_by_kind, shuffled.bytes_sent_by_kind), name
    assert np.array_equal(balanced.bytes_recv_by_kind, shuffled.bytes_recv_by_kind), name


def test_resolved_hyper_parameters_are_in_the_results_file(baselines):
    _, out = baselines
    config = {name: Results(out / f"{name}_quick.h5").config["algorithm"] for name in BASELINES}
    assert config["fedavg"] == {"name": "fedavg", "reduction": "mpi"}
    assert config["fedproto"] == {
        "name": "fedproto",
        "lambda": 1.0,
        "weighting": "samples",
        "predict": "head",
        "reduction": "mpi",
    }
    assert config["feddistill"] == {"name": "feddistill", "lambda": 1.0, "exclude_self": True, "reduction": "mpi"}
    assert config["fedamp"] == {
        "name": "fedamp",
        "lambda": 0.1,
        "sigma": 1e-4,
        "alpha": "auto",
        "similarity": "gaussian",
        "self_weight": 0.5,
        "cosine_scale": 10.0,
        "exchange": "allgather",
    }
    assert config["centralized"] == {"name": "centralized"}


def test_registry_has_every_algorithm():
    assert set(ALGORITHMS) == set(REGISTRY)
    for name, cls in REGISTRY.items():
        assert cls.name == name
        assert len(sys.modules[cls.__module__].__doc__ or "") > 40, f"{name}: say what it sends and why"


@pytest.mark.parametrize(
    "override, key",
    [
        ("algorithm={name: fedproto, lambda: -1}", "algorithm.lambda"),
        ("algorithm={name: fedproto, predict: knn}", "algorithm.predict"),
        ("algorithm={name: feddistill, exclude_self: 1}", "algorithm.exclude_self"),
        ("algorithm={name: feddistill, temperature: 2}", "algorithm.temperature"),
        ("algorithm={name: fedamp, sigma: 0}", "algorithm.sigma"),
        ("algorithm={name: fedamp, alpha: -1}", "algorithm.alpha"),
        ("algorithm={name: fedamp, alpha: 1.0e-4}", "algorithm.alpha"),  # > sigma / (clients - 1): xi_ii < 0
        ("algorithm={name: fedamp, self_weight: 1.5}", "algorithm.self_weight"),
        ("algorithm={name: fedamp, similarity: dot}", "algorithm.similarity"),
        ("algorithm={name: fedavg, lambda: 1}", "algorithm.lambda"),
        ("algorithm={name: centralized, k: 3}", "algorithm.k"),
    ],
)
def test_bad_hyper_parameters_are_rejected_naming_the_key(override, key):
    with pytest.raises(ConfigError) as err:
        prepare(load_config(QUICKSTART, [override]))
    assert err.value.key == key, str(err.value)


def test_valid_alpha_is_accepted():
    prepare(load_config(QUICKSTART, ["algorithm={name: fedamp, alpha: 3.0e-5}"]))  # 3 * 3e-5 <= 1e-4
    prepare(load_config(QUICKSTART, ["algorithm={name: fedamp, alpha: 1.0, similarity: cosine}"]))
