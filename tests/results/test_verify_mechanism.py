"""``mpicd verify`` holds a private file's recorded releases to the run's mechanism (mpicd/results/verify.py,
``_releases``): each release's multiplier, q and steps are the ones the mechanism makes, and a client that
sent its payload in a round has a release recorded there. The epsilon check alone composes whatever is
recorded, so a release recorded cheaper, or not at all, passes it; these copies are built to pass it.

One MPI job of 2 ranks (tests/drivers/runs.py) writes four private quick-start files, 2 clients each:
co-distillation and FedProto (one release a round at q 0.5, multiplier sigma / sqrt 2 = sqrt 2 with
noised counts, a budget of 3 spent in round 3), FedAvg with DP-SGD (2 local epochs; 103 images a
client at batch 32: q = 1 / ceil(103 / 32) = 1 / 4 and 2 x 4 = 8 steps, multiplier sigma = 2, a
budget of 2 spent in round 2) and CCVR (DP-SGD, then in its last round the statistics: q 1,
multiplier 2 / sqrt 3). The expected values are these, by hand, not read from mpicd.
"""

from __future__ import annotations

import json
import math
import re
import shutil

import h5py
import numpy as np
import pytest

from mpicd import cli

from conftest import DRIVERS, QUICKSTART, mpiexec

RANKS = 2
N, BATCH = 103, 32  # each client's training images in the 2-client quick start (60% of the other class kept)
DPSGD_Q, DPSGD_STEPS = 1 / 4, 2 * 4  # 1 / ceil(103 / 32); 2 local epochs of 4 Poisson steps each
MESSAGE = 4 * 200  # co-distillation: one (1, D = 200) float32 R per student, its one student the other client


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mechanism")
    common = ["run", str(QUICKSTART), f"clients={RANKS}"]
    budget = "privacy={epsilon: 3, noise_multiplier: 2.0, sample_rate: 0.5}"
    runs = {
        "codistill": ["rounds=4", budget],
        "fedproto": ["rounds=4", "algorithm=fedproto", budget],
        "fedavg": [
            "rounds=4",
            "algorithm=fedavg",
            "privacy={epsilon: 2, noise_multiplier: 2.0}",
            "train.local_epochs=2",
        ],
        "ccvr": ["rounds=2", "algorithm=ccvr", "privacy={noise_multiplier: 2.0}"],
    }
    jobs = [[*common, *extra, "--out", str(folder / f"{name}.h5")] for name, extra in runs.items()]
    result = mpiexec(RANKS, str(DRIVERS / "runs.py"), json.dumps(jobs), timeout=300)
    assert result.returncode == 0, f"runs driver failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
    return {name: folder / f"{name}.h5" for name in runs}


def verdict(capsys, path) -> tuple[int, list[str], str]:
    """(exit status, problems, output) of ``mpicd verify PATH`` through the CLI's entry point, in this process."""
    code = cli.main(["verify", str(path)])
    out = capsys.readouterr().out
    return code, [line[len("  problem: ") :] for line in out.splitlines() if line.startswith("  problem: ")], out


def tampered(source, tmp_path, change):
    path = tmp_path / f"tampered-{source.name}"
    shutil.copyfile(source, path)
    with h5py.File(path, "r+") as f:
        change(f)
    return path


def mechanism_problem(problems: list[str]) -> str:
    found = [p for p in problems if "record releases the run's mechanism does not make" in p]
    assert len(found) == 1, problems
    return found[0]


def test_the_files_hold_what_the_tests_assume(files):
    with h5py.File(files["codistill"], "r") as f:
        assert f["partition/train_counts"][()].sum(axis=1).tolist() == [N, N]
        steps, stopped = f["metrics/privacy_steps"][:, :, 0], f["metrics/privacy_stopped"][()]
        assert steps[:2].tolist() == [[1, 1], [1, 1]] and stopped[2:].all()
        np.testing.assert_allclose(f["metrics/privacy_multiplier"][:2, :, 0], math.sqrt(2), rtol=1e-12)
        assert (f["metrics/bytes_sent"][:2] == MESSAGE).all()
    for name in ("fedproto", "fedavg"):  # stopped clients still send (zeros): no release there, not flagged
        with h5py.File(files[name], "r") as f:
            stopped = f["metrics/privacy_stopped"][()] == 1
            assert stopped.any() and (f["metrics/bytes_sent"][()][stopped] > 0).all(), name
            assert (f["metrics/privacy_steps"][()][stopped] == 0).all(), name
    with h5py.File(files["fedavg"], "r") as f:
        assert f["metrics/privacy_steps"][0, :, 0].tolist() == [DPSGD_STEPS] * 2
        np.testing.assert_array_equal(f["metrics/privacy_q"][0, :, 0], DPSGD_Q)
    with h5py.File(files["ccvr"], "r") as f:  # the last round's second slot: the statistics
        assert f["metrics/privacy_steps"][()].tolist() == [[[4, 0], [4, 0]], [[4, 1], [4, 1]]]
        assert f["metrics/privacy_multiplier"][1, 0, 1] == pytest.approx(2 / math.sqrt(3), rel=1e-12)


@pytest.mark.parametrize("name", ["codistill", "fedproto", "fedavg", "ccvr"])
def test_real_private_files_are_ok(capsys, files, name):
    code, problems, out = verdict(capsys, files[name])
    assert code == 0 and not problems, out


def test_a_release_recorded_with_twice_the_multiplier_is_named(capsys, files, tmp_path):
    """Twice the noise claimed for client 1's round-2 release: a smaller epsilon recomputed, so the
    file's own epsilon (left as written) passes the epsilon check; only the mechanism names it."""

    def double(f):
        f["metrics/privacy_multiplier"][1, 1, 0] *= 2

    code, problems, out = verdict(capsys, tampered(files["codistill"], tmp_path, double))
    assert code == 1 and len(problems) == 1, out
    assert re.search(
        rf"in 1 \(round, client, slot\) cells, first round 2, client 1, slot 0: multiplier {2 * math.sqrt(2):.12g} "
        rf"recorded, {math.sqrt(2):.12g} made \(its release\)$",
        problems[0],
    ), out


def test_a_halved_dpsgd_multiplier_is_named(capsys, files, tmp_path):
    def halve(f):
        f["metrics/privacy_multiplier"][0, 0, 0] /= 2

    code, problems, out = verdict(capsys, tampered(files["fedavg"], tmp_path, halve))
    assert code == 1, out
    assert mechanism_problem(problems).endswith(
        "first round 1, client 0, slot 0: multiplier 1 recorded, 2 made (DP-SGD)"
    )


def test_a_smaller_sample_rate_is_named(capsys, files, tmp_path):
    def halve(f):
        f["metrics/privacy_q"][0, 1, 0] = 0.25

    code, problems, out = verdict(capsys, tampered(files["fedproto"], tmp_path, halve))
    assert code == 1 and len(problems) == 1, out
    assert mechanism_problem(problems).endswith(
        "first round 1, client 1, slot 0: q 0.25 recorded, 0.5 made (its release)"
    )


def test_fewer_dpsgd_steps_are_named(capsys, files, tmp_path):
    def fewer(f):
        f["metrics/privacy_steps"][0, 1, 0] = DPSGD_STEPS // 2

    code, problems, out = verdict(capsys, tampered(files["fedavg"], tmp_path, fewer))
    assert code == 1 and len(problems) == 1, out
    assert mechanism_problem(problems).endswith(
        f"first round 1, client 1, slot 0: steps {DPSGD_STEPS // 2} recorded, {DPSGD_STEPS} made (DP-SGD)"
    )


def test_a_cheaper_ccvr_statistics_release_is_named(capsys, files, tmp_path):
    def double(f):
        f["metrics/privacy_multiplier"][1, 0, 1] *= 2

    code, problems, out = verdict(capsys, tampered(files["ccvr"], tmp_path, double))
    assert code == 1 and len(problems) == 1, out
    assert mechanism_problem(problems).endswith(
        f"first round 2, client 0, slot 1: multiplier {4 / math.sqrt(3):.12g} recorded, "
        f"{2 / math.sqrt(3):.12g} made (CCVR's statistics)"
    )


def test_a_statistics_release_outside_the_last_round_is_named(capsys, files, tmp_path):
    """The statistics' (q 1, multiplier 2 / sqrt 3, one step) are made in the last round only."""

    def early(f):
        for name in ("privacy_q", "privacy_multiplier", "privacy_steps"):
            f[f"metrics/{name}"][0, 1, 1] = f[f"metrics/{name}"][1, 1, 1]

    code, problems, out = verdict(capsys, tampered(files["ccvr"], tmp_path, early))
    assert code == 1, out
    assert "first round 1, client 1, slot 1: multiplier" in mechanism_problem(problems), out


def test_a_payload_sent_without_its_release_is_named(capsys, files, tmp_path):
    """Client 0's round-2 release erased and its epsilon lowered to that of its one remaining release
    (round 1's, as the file itself records it): the epsilon check passes, the bytes it sent do not."""

    def erase(f):
        f["metrics/privacy_steps"][1, 0, 0] = 0
        f["metrics/privacy_q"][1, 0, 0] = np.nan
        f["metrics/privacy_multiplier"][1, 0, 0] = np.nan
        eps = f["metrics/epsilon"]
        eps[1:, 0] = eps[0, 0]

    code, problems, out = verdict(capsys, tampered(files["codistill"], tmp_path, erase))
    assert code == 1 and len(problems) == 1, out
    assert problems[0] == (
        f"private payloads sent with no release recorded in 1 (round, client) cells, first round 2, client 0: "
        f"{MESSAGE} bytes sent, 0 releases (/metrics/privacy_steps), neither stopped by its budget nor skipped nor "
        "sitting out"
    ), out
