"""Checkpoint and resume: a run killed (SIGKILL) or stopped (SIGUSR1) mid-way and resumed with
--resume writes exactly the metrics and bytes of an uninterrupted run, for every algorithm that
carries state from round to round (FedProto, FedDistill, FedAMP) as for codistill and fedavg."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest

from mpicd.mpi import launch
from mpicd.results.reader import Results
from mpicd.run import checkpoint

from conftest import DRIVERS, PNEUMONIA, QUICKSTART, ROOT, mpi_env, mpicd_run, mpiexec
from resume_steps import assert_same_run, start, stop_on_request, wait_for_checkpoint


def workload():
    """A config whose rounds last long enough to be interrupted: real X-rays when present."""
    if PNEUMONIA.is_file():
        return ROOT / "configs" / "pneumoniamnist.yaml", [
            "rounds=8",
            "data.images_per_class=60",
            f"data.path={PNEUMONIA}",
        ]
    return QUICKSTART, ["rounds=200"]


def descendants_alive(pids):
    alive = []
    for pid in pids:
        try:
            os.kill(pid, 0)
            with open(f"/proc/{pid}/stat") as fh:
                if fh.read().split()[2] != "Z":
                    alive.append(pid)
        except (ProcessLookupError, FileNotFoundError):
            pass
    return alive


def session_pids(sid):
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getsid(int(entry)) == sid:
                    pids.append(int(entry))
            except (ProcessLookupError, PermissionError):
                pass
    return pids


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    config, overrides = workload()
    folder = tmp_path_factory.mktemp("reference")
    out = {}
    for algorithm in ("codistill", "fedavg"):
        out[algorithm] = folder / f"{algorithm}.h5"
        mpicd_run(4, config, out[algorithm], *overrides, f"algorithm={{name: {algorithm}}}", timeout=400)
    return out


@pytest.mark.parametrize("algorithm", ["codistill", "fedavg"])
def test_sigkill_mid_round_then_resume_equals_uninterrupted(tmp_path, reference, algorithm):
    config, overrides = workload()
    overrides = [*overrides, f"algorithm={{name: {algorithm}}}"]
    out = tmp_path / "run.h5"
    proc = start(out, config, overrides)
    wait_for_checkpoint(proc, out, 2)
    pids = session_pids(proc.pid)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    deadline = time.monotonic() + 10
    while descendants_alive(pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not descendants_alive(pids), "processes of the killed job are still running"
    with h5py.File(out, "r") as f:  # the interrupted file is readable and holds its finished rounds
        done = int(f.attrs["completed_rounds"])
        assert 2 <= done < f.attrs["rounds"]
        assert np.isfinite(f["metrics/minority_acc"][:done]).all()
    resumed = mpicd_run(4, config, out, *overrides, "--resume", timeout=400)
    assert "resuming at round" in resumed.stdout
    assert_same_run(Results(out), Results(reference[algorithm]))
    assert list(Results(out).attrs["resumed_at"])[0] >= 2
    assert not checkpoint.folder_for(out).exists(), "a complete run keeps no checkpoints"


def test_sigusr1_stops_at_a_round_boundary_and_resume_completes(tmp_path, reference):
    config, overrides = workload()
    overrides = [*overrides, "algorithm={name: codistill}"]
    out = tmp_path / "run.h5"
    proc = start(out, config, overrides)
    wait_for_checkpoint(proc, out, 1)
    stdout = stop_on_request(proc)
    assert "stopped on request" in stdout
    done = Results(out).completed_rounds
    assert done in checkpoint.held(checkpoint.folder_for(out), 0)
    mpicd_run(4, config, out, *overrides, "--resume", timeout=400)
    assert_same_run(Results(out), Results(reference["codistill"]))


def test_resume_of_a_complete_run_does_nothing(tmp_path):
    out = tmp_path / "run.h5"
    mpicd_run(2, QUICKSTART, out, "clients=2", "rounds=2")
    before = out.stat().st_mtime_ns
    again = mpicd_run(2, QUICKSTART, out, "clients=2", "rounds=2", "--resume")
    assert "nothing to do" in again.stdout and out.stat().st_mtime_ns == before


def test_resume_with_a_different_config_is_refused_naming_the_key(tmp_path):
    out = tmp_path / "run.h5"
    proc = start(out, *workload_quick())
    wait_for_checkpoint(proc, out, 2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    config, overrides = workload_quick()
    result = mpiexec(
        4,
        "-m",
        "mpicd",
        "run",
        str(config),
        *overrides,
        "algorithm.lambda=0.5",
        "--out",
        str(out),
        "--resume",
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    messages = [line for line in result.stderr.splitlines() if line.startswith("mpicd:")]
    assert len(messages) == 1 and "algorithm.lambda" in messages[0], result.stderr


def workload_quick():
    return QUICKSTART, ["rounds=400"]


def test_checkpoint_is_atomic_and_torn_files_are_ignored(tmp_path):
    folder, run = tmp_path / "x.h5.ckpt", "0123456789abcdef"
    for completed in (1, 2, 3):
        checkpoint.save(folder, 0, completed, {"round": completed}, run)
    assert checkpoint.available(folder, 0, run) == [3, 2]  # only the newest two are kept
    checkpoint.path_for(folder, 0, 3, run).write_bytes(b"torn")
    assert checkpoint.load(folder, 0, 3, run, "cpu") is None
    assert checkpoint.load(folder, 0, 2, run, "cpu") == {"round": 2, "run_id": run}
    (folder / f".rank0.round4.{run}.pt.123.tmp").write_bytes(b"partial")
    assert checkpoint.available(folder, 0, run) == [3, 2]


# Algorithms whose ``carried`` state a checkpoint must hold (mpicd/algorithms/*.py state_dict):
# FedProto's global prototypes, FedDistill's soft targets, FedAMP's cloud model u_i. A resume that
# lost any of them would train its first round without the algorithm's term and diverge from the
# uninterrupted run. Short runs (quick-start data, 2 ranks); each job is stopped deterministically in
# the middle of round CARRIED_HANG (rank 1 hangs after its local epoch, rank 0 waits for it in the
# exchange; debug.* is operational, so the resume may drop it), then SIGKILLed whole. The reference
# runs share one MPI job and so do the resumes (tests/drivers/runs.py): one start-up each.
CARRIED = ("fedproto", "feddistill", "fedamp", "fedrod")  # fedrod: its personal head and its moments
CARRIED_ROUNDS = 6
CARRIED_HANG = 3  # counted from 0: rounds 0-2 are in the file and checkpointed when the job dies
HANG_MESSAGE = "injected fault debug.fail_kind=hang"


def carried_args(algorithm: str, out, *extra: str) -> list[str]:
    return [
        "run",
        str(QUICKSTART),
        "clients=2",
        f"rounds={CARRIED_ROUNDS}",
        f"algorithm={{name: {algorithm}}}",
        "--out",
        str(out),
        *extra,
    ]


def run_in_one_job(argument_lists: list[list[str]], timeout: float = 400) -> subprocess.CompletedProcess:
    result = mpiexec(2, str(DRIVERS / "runs.py"), json.dumps(argument_lists), timeout=timeout)
    assert result.returncode == 0, f"runs driver failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
    return result


def kill_whole_job(proc) -> None:
    """SIGKILL to every process of the job (mpiexec and its ranks); none may be left."""
    pids = session_pids(proc.pid)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    deadline = time.monotonic() + 10
    while descendants_alive(pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not descendants_alive(pids), "processes of the killed job are still running"


def hang_then_kill(args: list[str], log, timeout: float = 180) -> None:
    """Start ``mpicd ARGS`` on 2 ranks, wait until rank 1 hangs in round CARRIED_HANG, kill the job."""
    with open(log, "w") as output:  # a file, not a pipe: read while the job runs, never full
        proc = subprocess.Popen(
            launch.command(2, [sys.executable, "-m", "mpicd", *args], launcher="mpirun"),
            cwd=ROOT,
            env=mpi_env(),
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + timeout
    while HANG_MESSAGE not in log.read_text():
        if proc.poll() is not None:
            pytest.fail(f"the run ended before it hung in round {CARRIED_HANG}:\n{log.read_text()}")
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"no hang in round {CARRIED_HANG} within {timeout} s:\n{log.read_text()}")
        time.sleep(0.05)
    time.sleep(0.5)  # rank 0 may still be writing its checkpoint of round 3: either resume point will do
    kill_whole_job(proc)


@pytest.fixture(scope="module")
def carried(tmp_path_factory):
    """{algorithm: (uninterrupted file, killed-and-resumed file)} and the resumes' stdout."""
    folder = tmp_path_factory.mktemp("carried")
    files = {a: (folder / f"{a}-reference.h5", folder / f"{a}-resumed.h5") for a in CARRIED}
    run_in_one_job([carried_args(a, reference) for a, (reference, _) in files.items()])
    hang = [
        "debug.fail_rank=1",
        f"debug.fail_round={CARRIED_HANG}",
        "debug.fail_kind=hang",
        "debug.fail_at=after_epoch",
    ]
    for a, (_, out) in files.items():
        hang_then_kill(carried_args(a, out, *hang), folder / f"{a}-killed.log")
        with h5py.File(out, "r") as f:  # the killed file holds exactly the rounds before the hang
            assert int(f.attrs["completed_rounds"]) == CARRIED_HANG, a
    resumed = run_in_one_job([carried_args(a, out, "--resume") for a, (_, out) in files.items()])
    return files, resumed.stdout


@pytest.mark.parametrize("algorithm", CARRIED)
def test_sigkill_then_resume_restores_the_carried_state(carried, algorithm):
    files, stdout = carried
    reference, out = (Results(path) for path in files[algorithm])
    # resumed from a checkpoint made after at least one exchange, so the carried state mattered
    assert list(out.attrs["resumed_at"]) in ([CARRIED_HANG - 1], [CARRIED_HANG]), out.attrs["resumed_at"]
    folder = re.escape(str(checkpoint.folder_for(files[algorithm][1])))
    assert re.search(rf"resuming .*at round {out.attrs['resumed_at'][0] + 1} from {folder}", stdout), stdout
    # the algorithm's term is active in every round after the first: without its carried state
    # (prototypes, targets, cloud model; FedRoD's personal head) the first resumed round would differ
    assert (reference.metrics["train_extra"][1:] > 0).all(), reference.metrics["train_extra"]
    assert_same_run(out, reference)
    assert not checkpoint.folder_for(files[algorithm][1]).exists(), "a complete run keeps no checkpoints"
