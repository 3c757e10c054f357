"""Faults: a rank that raises, exits, is killed, hangs or goes NaN never hangs the job and never
leaves a lying file. Every case runs the real `mpicd run` under mpiexec with built-in fault
injection (debug.fail_*), repeated MPICD_STRESS times (default 1; more only when asked)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from conftest import QUICKSTART, ROOT, mpi_env

from mpicd.mpi.launch import command as launch_command

REPEATS = int(os.environ.get("MPICD_STRESS", "1"))
RANKS = 3
FAIL_RANK, FAIL_ROUND = 1, 2
SMALL = ["clients=3", "rounds=5", "device=cpu"]
WHERE = f"rank {FAIL_RANK}, round {FAIL_ROUND}"
# Each place is tried with the algorithm whose peers wait in a different operation there.
PLACES = {
    "before_exchange": "codistill",  # peers wait in the p2p exchange
    "in_exchange": "fedavg",  # peers wait in the Allreduce
    "after_epoch": "fedamp",  # peers wait in the Allgather
    "in_write": "codistill",
}  # peers wait in the collective HDF5 write


class Outcome:
    """A finished job: its merged output, exit status and when each line appeared."""

    def __init__(self, returncode: int, lines: list[tuple[float, str]], ended: float):
        self.returncode, self.lines, self.ended = returncode, lines, ended
        self.stdout = self.stderr = "".join(line for _, line in lines)

    def seconds_after(self, text: str) -> float:
        """From the first line containing ``text`` (the fault) to the end of the job."""
        first = next(t for t, line in self.lines if text in line)
        return self.ended - first


def launch(out: Path, *overrides: str, timeout: float = 180) -> Outcome:
    """mpicd run under mpiexec, every output line time-stamped as it arrives (start-up on this
    loaded 2-core box can take long; what matters is the time from the fault to the job's end)."""
    command = [
        *launch_command(RANKS, launcher="mpirun"),
        sys.executable,
        "-m",
        "mpicd",
        "run",
        str(QUICKSTART),
        *SMALL,
        *overrides,
        "--out",
        str(out),
    ]
    process = subprocess.Popen(
        command, cwd=ROOT, env=mpi_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines: list[tuple[float, str]] = []
    reader = threading.Thread(target=lambda: lines.extend((time.monotonic(), line) for line in process.stdout))
    reader.start()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        reader.join()
        pytest.fail(f"{' '.join(overrides)}: no exit within {timeout} s (hang)\n{''.join(text for _, text in lines)}")
    ended = time.monotonic()
    reader.join()
    return Outcome(process.returncode, lines, ended)


def processes_mentioning(token: str) -> list[int]:
    """Pids of live processes whose command line contains ``token`` (this test's unique output path)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if token.encode() in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


def completed_rounds(out: Path) -> int:
    with h5py.File(out, "r") as f:
        done = int(f.attrs["completed_rounds"])
        assert np.isfinite(f["metrics/minority_acc"][:done]).all()
        return done


SLOWEST: list[float] = []


def assert_failed_cleanly(result: Outcome, out: Path, message: str) -> None:
    text = result.stdout
    assert result.returncode != 0, text
    assert message in text, text
    seconds = result.seconds_after(f"mpicd: {WHERE}")
    SLOWEST.append(seconds)
    print(f"ended {seconds:.1f} s after the fault's message")
    assert seconds < 30, f"took {seconds:.1f} s from the fault to the end of the job"
    time.sleep(0.5)
    assert processes_mentioning(str(out)) == [], "processes of the job are still running"
    assert completed_rounds(out) == FAIL_ROUND


@pytest.mark.parametrize("repeat", range(REPEATS))
@pytest.mark.parametrize("kind", ["exception", "exit", "kill"])
@pytest.mark.parametrize("place", list(PLACES))
def test_a_failing_rank_ends_the_job_and_keeps_the_finished_rounds(tmp_path, place, kind, repeat):
    out = tmp_path / f"{place}-{kind}-{repeat}.h5"
    result = launch(
        out,
        f"algorithm={PLACES[place]}",
        f"debug.fail_rank={FAIL_RANK}",
        f"debug.fail_round={FAIL_ROUND}",
        f"debug.fail_kind={kind}",
        f"debug.fail_at={place}",
    )
    expected = (
        f"mpicd: {WHERE} failed: injected fault"
        if kind == "exception"
        else f"mpicd: {WHERE}: injected fault debug.fail_kind={kind} at {place}"
    )
    assert_failed_cleanly(result, out, expected)


@pytest.mark.parametrize("place", ["before_exchange", "in_exchange"])
def test_a_hung_rank_is_ended_by_the_watchdog_naming_rank_and_round(tmp_path, place):
    out = tmp_path / f"hang-{place}.h5"
    result = launch(
        out,
        f"algorithm={PLACES[place]}",
        f"debug.fail_rank={FAIL_RANK}",
        f"debug.fail_round={FAIL_ROUND}",
        "debug.fail_kind=hang",
        f"debug.fail_at={place}",
        "timeout.round_seconds=4",
    )
    assert_failed_cleanly(result, out, f"mpicd: {WHERE}: the round took longer than timeout.round_seconds=4 s")
    assert (
        "while this rank was hanging on purpose" in result.stderr or "while this rank was waiting in" in result.stderr
    )


def test_the_watchdog_lets_a_normal_run_finish(tmp_path):
    out = tmp_path / "ok.h5"
    result = launch(out, "timeout.round_seconds=30")
    assert result.returncode == 0, result.stderr
    assert completed_rounds(out) == 5


@pytest.mark.parametrize(
    "place, algorithm, message",
    [
        ("after_epoch", "fedavg", "the model holds NaN or inf after the local epoch"),
        ("in_exchange", "fedavg", "values about to be sent (allreduce) are NaN or inf; nothing was sent"),
        ("before_exchange", "codistill", "the model holds NaN or inf at the start of the round"),
    ],
)
def test_nan_aborts_by_default_naming_rank_and_round(tmp_path, place, algorithm, message):
    out = tmp_path / f"nan-{place}.h5"
    result = launch(
        out,
        f"algorithm={algorithm}",
        f"debug.fail_rank={FAIL_RANK}",
        f"debug.fail_round={FAIL_ROUND}",
        "debug.fail_kind=nan",
        f"debug.fail_at={place}",
    )
    assert_failed_cleanly(result, out, f"mpicd: {WHERE}")
    assert message in result.stderr


def test_a_diverging_loss_aborts_before_its_backward_pass(tmp_path):
    out = tmp_path / "diverge.h5"
    result = launch(out, "algorithm=local", "train.optimizer=sgd", "train.lr=1e38", "train.momentum=0", "rounds=3")
    assert result.returncode != 0
    assert "the training loss is nan" in result.stderr or "the training loss is inf" in result.stderr, result.stderr
    assert "mpicd: rank " in result.stderr and ", round " in result.stderr


def read(out: Path) -> dict:
    with h5py.File(out, "r") as f:
        return {
            "skipped": f["metrics/skipped"][()],
            "train_extra": f["metrics/train_extra"][()],
            "minority": f["metrics/minority_acc"][()],
            "teacher": f["comm/teacher"][()],
            "sent": f["metrics/bytes_sent"][()],
            "recv": f["metrics/bytes_recv"][()],
            "done": int(f.attrs["completed_rounds"]),
        }


def test_skip_drops_a_fedavg_update_and_records_it(tmp_path):
    clean, faulty = tmp_path / "clean.h5", tmp_path / "faulty.h5"
    for out, extra in (
        (clean, []),
        (
            faulty,
            [
                f"debug.fail_rank={FAIL_RANK}",
                f"debug.fail_round={FAIL_ROUND}",
                "debug.fail_kind=nan",
                "debug.fail_at=after_epoch",
            ],
        ),
    ):
        result = launch(out, "algorithm=fedavg", "on_nonfinite=skip", *extra)
        assert result.returncode == 0, result.stderr
    a, b = read(clean), read(faulty)
    expected = np.zeros((5, RANKS), dtype=np.int64)
    expected[FAIL_ROUND, FAIL_RANK] = 1
    np.testing.assert_array_equal(b["skipped"], expected)
    np.testing.assert_array_equal(a["skipped"], 0)
    assert b["done"] == 5 and np.isfinite(b["minority"]).all()
    np.testing.assert_array_equal(a["minority"][:FAIL_ROUND], b["minority"][:FAIL_ROUND])  # same until the fault
    assert not np.array_equal(a["minority"][FAIL_ROUND:], b["minority"][FAIL_ROUND:])  # a different average
    np.testing.assert_array_equal(a["sent"], b["sent"])  # the protocol's bytes: the dropped rank sends zeros
    assert "on_nonfinite=skip: this client's update of the round is dropped" in result.stdout


def test_skip_makes_a_codistill_teacher_send_nothing(tmp_path):
    out = tmp_path / "codistill.h5"
    result = launch(
        out,
        "algorithm=codistill",
        "on_nonfinite=skip",
        f"debug.fail_rank={FAIL_RANK}",
        f"debug.fail_round={FAIL_ROUND}",
        "debug.fail_kind=nan",
        "debug.fail_at=before_exchange",
    )
    assert result.returncode == 0, result.stderr
    r = read(out)
    teacher = r["teacher"][FAIL_ROUND]
    students = np.flatnonzero(teacher == FAIL_RANK)
    assert r["skipped"][FAIL_ROUND, FAIL_RANK] == 1 and r["skipped"].sum() == 1
    assert r["sent"][FAIL_ROUND, FAIL_RANK] == 0  # nothing left the skipped teacher
    for s in range(RANKS):
        if s in students:  # an empty message: no bytes, no distillation term
            assert r["recv"][FAIL_ROUND, s] == 0 and r["train_extra"][FAIL_ROUND, s] == 0.0
        elif s != FAIL_RANK:  # D = 200 float32 from its own teacher
            assert r["recv"][FAIL_ROUND, s] == 4 * 200
    assert np.isnan(r["train_extra"][FAIL_ROUND, FAIL_RANK])  # it did not train this round
    assert np.isfinite(r["minority"]).all()


def test_collective_layouts_are_agreed_and_a_mismatch_names_the_rank():
    driver = ROOT / "tests" / "drivers" / "layout_mismatch.py"
    result = subprocess.run(
        launch_command(3, [sys.executable, str(driver)], launcher="mpirun"),
        cwd=ROOT,
        env=mpi_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert (
        "allreduce layouts differ: rank 2 passes 12 bytes of float32, rank 0 passes 8 bytes of float32" in result.stderr
    ), result.stderr


@pytest.mark.parametrize(
    "where, extra, message",
    [
        ("under_a_file", [], "output: cannot write in"),
        ("no_room", ["rounds=1000000000"], "MiB free; this run needs about"),
    ],
)
def test_an_output_location_that_cannot_hold_the_results_is_refused_before_training(tmp_path, where, extra, message):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    out = blocker / "run.h5" if where == "under_a_file" else tmp_path / "run.h5"
    result = launch(out, *extra)
    lines = [line for line in result.stdout.splitlines() if "config error" in line]
    assert result.returncode == 2 and len(lines) == 1 and message in lines[0], result.stdout
    assert "round    1" not in result.stdout and not (tmp_path / "run.h5").exists()


def test_model_is_finite_finds_every_kind_of_non_finite_and_no_false_one():
    """Against numpy's element-wise test: one NaN, +inf, -inf, +inf with -inf, in a parameter or a
    buffer, float32, float16, bfloat16 or float64; and huge finite values whose sum would overflow float32
    (or float64, for a float64 tensor) are finite."""
    import torch

    from mpicd.run.nonfinite import model_is_finite

    def model(dtype, values, where="weight"):
        m = torch.nn.BatchNorm1d(len(values)).to(dtype)
        with torch.no_grad():
            target = m.weight if where == "weight" else m.running_var
            target.copy_(torch.tensor(values, dtype=torch.float64).to(dtype))
        return m

    big = {torch.float32: 3.0e38, torch.float16: 6.0e4, torch.bfloat16: 3.0e38, torch.float64: 1.7e308}
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        for where in ("weight", "running_var"):
            cases = [
                [1.0, 2.0, 3.0],
                [1.0, float("nan"), 3.0],
                [float("inf"), 2.0, 3.0],
                [1.0, 2.0, -float("inf")],
                [float("inf"), -float("inf"), 3.0],
                [big[dtype]] * 3,  # finite, its sum in the tensor's own type is not
                [-big[dtype], big[dtype], big[dtype]],
            ]
            for values in cases:
                m = model(dtype, values, where)
                expected = all(
                    np.isfinite(t.detach().double().numpy()).all() for t in [*m.parameters(), *m.buffers()]
                    if t.is_floating_point()
                )  # fmt: skip
                assert model_is_finite(m) == expected, (dtype, where, values)
                assert expected == all(np.isfinite(values))
