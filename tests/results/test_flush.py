"""Buffered results rows (checkpoint.flush_every): what a crash leaves, what a close writes, which
checkpoint survives for the resume, and a real run killed between flushes and resumed."""

import h5py
import numpy as np
import pytest
import torch

from mpicd.results.reader import Results
from mpicd.results.verify import verify
from mpicd.results.writer import flush_interval
from mpicd.run import checkpoint

from conftest import DRIVERS, QUICKSTART, is_timing, mpicd_run, mpiexec
from drivers.driver_settings import HELD

HOSTS = {c: f"host{rank}" for rank, held in HELD.items() for c in held}


@pytest.mark.parametrize(("ranks", "every"), [(1, 1), (2, 1), (4, 1), (5, 2), (8, 2), (9, 3), (32, 8), (33, 9)])
def test_auto_interval_is_ceil_ranks_over_four(ranks, every):
    assert flush_interval("auto", ranks) == every
    assert flush_interval(7, ranks) == 7


def run_driver(tmp_path, mode: str, driver: str) -> h5py.File:
    done = mpiexec(3, str(DRIVERS / "buffered_writer.py"), str(tmp_path), mode, driver, timeout=120)
    if mode == "close":
        assert done.returncode == 0, done.stdout + done.stderr
    return tmp_path / f"{mode}.{driver}.h5"


@pytest.mark.parametrize("driver", ["mpio", "serial"])
def test_a_crash_leaves_the_flushed_rounds_and_nothing_after(tmp_path, driver):
    path = run_driver(tmp_path, "crash", driver)
    with h5py.File(path, "r") as f:
        assert f.attrs["completed_rounds"] == 4  # the flush at round index 3 claimed rounds 1..4
        loss = f["metrics/train_loss"][()]
        minority = f["metrics/minority_acc"][()]
        sent = f["comm/bytes_sent"][()]
        for client in range(5):
            for r in range(4):
                assert loss[r, client] == pytest.approx(client + r / 10)
                assert minority[r, client] == pytest.approx(client / 10 + r)
                assert sent[r, client, 0] == 100 * client + r
        assert np.isnan(loss[4:]).all() and np.isnan(minority[4:]).all()  # round 5 was only buffered
        assert (sent[4:] == -1).all()
        seconds = f["metrics/write_seconds"][()]
        # each call's seconds go out with the next flush: rounds 1..3's with the flush of round 4
        assert np.isfinite(seconds[:3]).all() and np.isnan(seconds[3:]).all()
        assert [h.decode() for h in f["placement/host"][()]] == [HOSTS[c] for c in range(5)]
    assert verify(path).ok, verify(path).text()


@pytest.mark.parametrize("driver", ["mpio", "serial"])
def test_a_close_writes_every_buffered_row(tmp_path, driver):
    path = run_driver(tmp_path, "close", driver)
    with h5py.File(path, "r") as f:
        assert f.attrs["completed_rounds"] == 6
        loss, teacher = f["metrics/train_loss"][()], f["comm/teacher"][()]
        expected = np.array([[c + r / 10 for c in range(5)] for r in range(6)])
        np.testing.assert_allclose(loss, expected)
        np.testing.assert_array_equal(teacher, np.tile((np.arange(5) + 1) % 5, (6, 1)))
        assert np.isfinite(f["metrics/write_seconds"][()]).all()
        outside = f["comm/outside_rounds"][()]
        assert (outside[[0, 1, 2]] >= 0).all()  # each rank's ledger, recorded for its first client


def test_retention_keeps_the_newest_checkpoint_the_file_can_resume_from(tmp_path):
    run = "0123456789abcdef"
    for completed in range(1, 7):
        checkpoint.save(tmp_path, 0, completed, {"x": torch.zeros(1)}, run, claimed=2)
    assert sorted(checkpoint.available(tmp_path, 0, run)) == [2, 5, 6]
    checkpoint.save(tmp_path, 0, 7, {"x": torch.zeros(1)}, run, claimed=6)
    assert sorted(checkpoint.available(tmp_path, 0, run)) == [6, 7]
    checkpoint.save(tmp_path, 0, 8, {"x": torch.zeros(1)}, run)  # no claim: the newest two
    assert sorted(checkpoint.available(tmp_path, 0, run)) == [7, 8]


def test_a_run_killed_between_flushes_resumes_from_the_flushed_round(tmp_path):
    """flush_every 3 on 2 ranks: rows claimed after rounds 3 and 6; rank 1 exits in round 9 (index
    8), after the checkpoints of rounds 7 and 8: the file claims 6, the checkpoint of round 6
    survived though it is not among the newest two; --resume starts at round 7 and the file
    equals an uninterrupted run's."""
    common = ["clients=2", "rounds=10", "checkpoint.flush_every=3"]
    whole = tmp_path / "whole.h5"
    assert mpicd_run(2, QUICKSTART, whole, *common).returncode == 0
    out = tmp_path / "cut.h5"
    failed = mpiexec(
        2, "-m", "mpicd", "run", str(QUICKSTART), *common, "debug.fail_rank=1", "debug.fail_round=8",
        "debug.fail_kind=exit", "--out", str(out),
    )  # fmt: skip
    assert failed.returncode != 0, failed.stdout
    assert Results(out).completed_rounds == 6
    assert verify(out).ok, verify(out).text()
    assert checkpoint.available(checkpoint.folder_for(out), 0, Results(out).attrs["run_id"]) == [8, 7, 6]
    mpicd_run(2, QUICKSTART, out, *common, "--resume")
    a, b = Results(whole), Results(out)
    assert list(b.attrs["resumed_at"]) == [6]
    for name in a.metrics:
        if not is_timing(name):
            np.testing.assert_array_equal(a.metrics[name], b.metrics[name], err_msg=name)
    np.testing.assert_array_equal(a.bytes_sent_by_kind, b.bytes_sent_by_kind)
