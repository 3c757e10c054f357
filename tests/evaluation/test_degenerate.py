"""Degenerate results are flagged, not reported as results: a client that predicts one
class for its whole held-out set (one-hot test recall) in its last evaluated rounds is named in
the run's output and the file, warned about by the report, and a cell made only of runs in which
every client does so gets no verdict."""

from __future__ import annotations

import shutil

import h5py
import numpy as np
import pytest

from mpicd.evaluation.degenerate import one_hot, single_class_clients

from conftest import QUICKSTART, mpicd_cli, mpicd_run


def test_one_hot_recall_is_exactly_one_class_at_1_and_the_rest_at_0():
    recall = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.014], [0.5, 0.5], [1.0, 1.0], [0.0, 0.0]])
    assert one_hot(recall).tolist() == [True, True, False, False, False, False]
    three = np.array([[0.0, 1.0, 0.0], [0.0, 1.0, 0.2]])
    assert one_hot(three).tolist() == [True, False]


def test_a_client_is_flagged_only_if_one_hot_in_each_of_its_last_evaluated_rounds():
    hot, soft = [1.0, 0.0], [0.9, 0.3]
    # rounds x clients x classes; client 0 one-hot in rounds 2-4, client 1 only in rounds 3-4
    recall = np.array([[soft, soft], [soft, soft], [hot, soft], [hot, hot], [hot, hot]])
    assert single_class_clients(recall, np.arange(5), last=3) == [0]
    assert single_class_clients(recall, np.arange(5), last=2) == [0, 1]
    assert single_class_clients(recall, np.array([0, 1, 2]), last=3) == []  # rounds 3-4 not evaluated


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """lr 10 (Adam) drives quick-start client 0 to one class; lr 1e-3 learns. 2 clients."""
    folder = tmp_path_factory.mktemp("degenerate")
    diverged = folder / "diverged.h5"
    result = mpicd_run(2, QUICKSTART, diverged, "clients=2", "rounds=3", "train.lr=10")
    normal = {}
    for algorithm in ("codistill", "local"):
        for seed in (0,):
            path = folder / f"{algorithm}{seed}.h5"
            mpicd_run(2, QUICKSTART, path, "clients=2", "rounds=3", f"algorithm={algorithm}", f"seed={seed}")
            normal[algorithm, seed] = path
    return folder, diverged, result.stdout, normal


def test_the_run_names_single_class_clients_in_its_output_and_its_file(runs):
    _, diverged, stdout, normal = runs
    with h5py.File(diverged, "r") as f:
        recall = f["metrics/recall"][()]
        flagged = f.attrs["single_class_clients"].tolist()
    # the expectation from the raw recall: each of the last 3 rounds exactly one class at 1, one at 0
    expected = [c for c in range(2) if all(sorted(recall[r, c].tolist()) == [0.0, 1.0] for r in (0, 1, 2))]
    assert expected and flagged == expected
    assert f"mpicd: warning: client {expected[0]} predicted a single class" in stdout
    with h5py.File(normal["codistill", 0], "r") as f:
        assert f.attrs["single_class_clients"].tolist() == []


def test_the_report_warns_and_gives_a_collapsed_cell_no_verdict(runs):
    folder, _, _, normal = runs
    collapsed = {}
    for seed in (0,):  # codistill's run made to predict class 1 everywhere: recall (0, 1) for each client
        path = folder / f"collapsed{seed}.h5"
        shutil.copy(normal["codistill", seed], path)
        with h5py.File(path, "r+") as f:
            f["metrics/recall"][...] = np.array([0.0, 1.0])
        collapsed[seed] = path
    fine = mpicd_cli("report", *map(str, normal.values()), "--versus", "local", "--versus-only")
    assert fine.returncode == 0 and "warning" not in fine.stdout and "degenerate" not in fine.stdout
    flagged = mpicd_cli("report", *map(str, collapsed.values()), str(normal["local", 0]), "--versus", "local")
    assert flagged.returncode == 0, flagged.stderr
    for path in collapsed.values():
        assert f"warning: {path}: every client predicted a single class" in flagged.stdout
    row = next(line for line in flagged.stdout.splitlines() if line.startswith("| codistill | local"))
    assert row.rstrip().endswith("| degenerate (every client predicts one class: no verdict) |")
