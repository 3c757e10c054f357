"""Clean endings (mpicd/mpi/ending.py): through jobs/mpirun.sh a config error, a stop on request and
a packed sweep's stop end with their exit status and without mpirun's abort banner; a crash keeps
its traceback; bare mpirun is as before; the hand-over itself under real mpiexec (agreed status,
statuses that differ, no rank on the wrapper's host, a missing file); hints name what was typed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import QUICKSTART, ROOT, mpi_env, mpiexec
from mpicd.mpi import launch
from mpicd.run.runner import launch_hint

BANNER = ("Primary job", "mpirun detected", "non-zero exit code", "non-zero status")
OPEN_MPI = launch.mpirun()[1]


def mpirun_sh(*args: str, tmp: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    """``bash jobs/mpirun.sh ARGS`` with its temporary files in ``tmp`` (checked for leftovers)."""
    try:
        return subprocess.run(
            ["bash", "jobs/mpirun.sh", *args],
            cwd=ROOT,
            env={**mpi_env(), "TMPDIR": str(tmp)},
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as err:
        pytest.fail(f"jobs/mpirun.sh {' '.join(args)} did not finish within {timeout} s:\n{err.stdout}\n{err.stderr}")


def no_banner(text: str) -> bool:
    return not any(line in text for line in BANNER)


def test_a_config_error_through_mpirun_sh_ends_with_2_and_no_banner(tmp_path):
    result = mpirun_sh("2", "run", str(QUICKSTART), "data.skew=2", tmp=tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("mpicd: config error") == 1, result.stderr
    assert "data.skew: must be < 1.0, got 2.0" in result.stderr
    assert no_banner(result.stdout + result.stderr), result.stderr
    assert list(tmp_path.iterdir()) == []  # the status file is gone


def test_a_wrong_rank_count_through_mpirun_sh_names_mpirun_sh(tmp_path):
    result = mpirun_sh("2", "run", str(QUICKSTART), "rounds=3", tmp=tmp_path)
    assert result.returncode == 2, result.stderr
    hint = f"run jobs/mpirun.sh 4 run {QUICKSTART} rounds=3, or set clients=2"
    assert hint in result.stderr and no_banner(result.stderr), result.stderr


def test_a_usage_error_through_mpirun_sh_ends_with_2_and_no_banner(tmp_path):
    result = mpirun_sh("2", "run", str(QUICKSTART), "--no-such-flag", tmp=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "unrecognized arguments: --no-such-flag" in result.stderr and no_banner(result.stderr), result.stderr


def test_bare_mpirun_is_as_before(tmp_path):
    result = mpiexec(2, "-m", "mpicd", "run", str(QUICKSTART), "data.skew=2")
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("mpicd: config error") == 1, result.stderr
    if OPEN_MPI:  # the banner the wrapper's file avoids: without it, there it is
        assert "mpirun detected that one or more processes exited with non-zero status" in result.stderr


def test_a_crash_through_mpirun_sh_keeps_its_traceback(tmp_path):
    out = tmp_path / "crash.h5"
    crash = ("clients=2", "rounds=3", "debug.fail_rank=1", "debug.fail_round=1", "--out", str(out))
    result = mpirun_sh("2", "run", str(QUICKSTART), *crash, tmp=tmp_path)
    assert result.returncode not in (0, 2), result.stderr
    assert "mpicd: rank 1, round 1 failed: injected fault" in result.stderr, result.stderr
    assert "Traceback (most recent call last)" in result.stderr, result.stderr


def stop_with_usr1(command: list[str], log: Path, tmp: Path, text: str = "round    2/") -> int:
    """Start ``command`` (jobs/mpirun.sh ...), SIGUSR1 once ``text`` is in its output; its exit status."""
    with open(log, "w") as output:
        proc = subprocess.Popen(
            command,
            cwd=ROOT,
            env={**mpi_env(), "TMPDIR": str(tmp)},
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + 180
    while text not in log.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"{text!r} never appeared:\n{log.read_text()}")
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGUSR1)  # the script passes it to mpirun, which passes it to the ranks
    try:
        return proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"the job did not stop after SIGUSR1:\n{log.read_text()}")


def test_a_stop_through_mpirun_sh_ends_with_75_and_no_banner_naming_the_resume_command(tmp_path):
    out, log, tmp = tmp_path / "run.h5", tmp_path / "run.log", tmp_path / "tmp"
    tmp.mkdir()
    command = ["bash", "jobs/mpirun.sh", "2", "run", str(QUICKSTART), "clients=2", "rounds=300", "--out", str(out)]
    assert stop_with_usr1(command, log, tmp) == 75, log.read_text()
    text = log.read_text()
    again = f"jobs/mpirun.sh 2 run {QUICKSTART} clients=2 rounds=300 --out {out} --resume"
    assert f"; resume with: {again}\n" in text and no_banner(text), text
    assert list(tmp.iterdir()) == []


def test_a_packed_sweeps_stop_names_the_pack_command_and_no_flag(tmp_path):
    sweep, log, tmp = tmp_path / "sweep.yaml", tmp_path / "pack.log", tmp_path / "tmp"
    tmp.mkdir()
    sweep.write_text(f"config: {QUICKSTART}\noutput_dir: {tmp_path / 'out'}\ngrid:\n  clients: [2]\n  rounds: [300]\n")
    assert stop_with_usr1(["bash", "jobs/mpirun.sh", "2", "pack", str(sweep)], log, tmp) == 75, log.read_text()
    text = log.read_text()
    assert f"; resume with: jobs/mpirun.sh 2 pack {sweep}\n" in text, text
    assert f"stopped early; resume with: jobs/mpirun.sh 2 pack {sweep}\n" in text, text
    assert "--resume" not in text and no_banner(text), text


# --------------------------------------------------------------------------- the hand-over itself


def hand_over(codes: list[int], tmp_path: Path, host: str | None = None, keep_file: bool = True):
    """Two ranks that call ending.hand_over(codes[rank]) under mpirun with the wrapper's variables;
    (mpirun's status, the status file's text or None, stderr)."""
    status = tmp_path / "status"
    if keep_file:
        status.write_text("")
    program = (
        "import sys\nfrom mpi4py import MPI\nfrom mpicd.mpi import ending\n"
        f"sys.exit(ending.hand_over({codes!r}[MPI.COMM_WORLD.Get_rank()]))\n"
    )
    env = {**mpi_env(), "MPICD_EXIT_STATUS_FILE": str(status), "MPICD_EXIT_STATUS_HOST": host or os.uname().nodename}
    command = launch.command(2, [sys.executable, "-c", program], launcher="mpirun")
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    return result.returncode, status.read_text() if status.exists() else None, result.stderr


def test_an_agreed_status_goes_to_the_file_and_every_rank_exits_0(tmp_path):
    assert hand_over([2, 2], tmp_path)[:2] == (0, "2\n")
    assert [p.name for p in tmp_path.iterdir()] == ["status"]  # no temporary file left beside it


def test_an_agreed_0_writes_nothing(tmp_path):
    assert hand_over([0, 0], tmp_path)[:2] == (0, "")


def test_statuses_that_differ_are_each_ranks_own(tmp_path):
    rc, text, _ = hand_over([3, 4], tmp_path)
    assert rc != 0 and text == ""


def test_without_a_rank_on_the_wrappers_host_each_rank_exits_with_the_status(tmp_path):
    rc, text, _ = hand_over([2, 2], tmp_path, host="not-this-host")
    assert rc == 2 and text == ""


def test_a_status_file_that_is_not_there_is_not_made_and_the_status_stays(tmp_path):
    rc, text, stderr = hand_over([75, 75], tmp_path, keep_file=False)
    assert rc == 75 and text is None and "could not pass exit status 75 to the wrapper" in stderr, stderr


# --------------------------------------------------------------------------- hints name what was typed


def test_launch_hint_names_the_wrapper_that_was_run():
    words = ["run", "xrays.yaml", "rounds=3"]
    assert launch_hint(4, {}, words) == "run mpirun -n 4"
    assert launch_hint(4, {"MPICD_COMMAND": "jobs/mpirun.sh"}, words) == "run jobs/mpirun.sh 4 run xrays.yaml rounds=3"
    slurm = {"MPICD_COMMAND": "jobs/mpirun.sh", "SLURM_JOB_ID": "17"}
    assert launch_hint(6, slurm, words) == "submit with sbatch --ntasks=6 (inside an allocation: srun -n 6)"


def test_again_names_the_wrapper_else_the_launcher():
    words = ["run", "my runs/x.yaml", "--resume"]
    assert (
        launch.again(4, words, {"MPICD_COMMAND": "jobs/mpirun.sh"}) == "jobs/mpirun.sh 4 run 'my runs/x.yaml' --resume"
    )
    assert launch.again(4, words, {}) == "mpirun -n 4 mpicd run 'my runs/x.yaml' --resume"
    assert launch.again(2, ["pack", "s.yaml"], {"SLURM_JOB_ID": "9"}) == "srun -n 2 mpicd pack s.yaml"


def test_a_broken_image_of_an_image_folder_is_one_line_through_mpirun_sh(tmp_path):
    """The user's own images (data.name imagefolder) with a file that is not an image: under
    jobs/mpirun.sh every rank stops before training, one line names the file, exit 2, no banner."""
    from fixtures_data import write_imagefolder

    write_imagefolder(tmp_path / "scans", {"train": {"a": 12, "b": 12}, "test": {"a": 3, "b": 3}})
    broken = tmp_path / "scans" / "train" / "b" / "007.png"
    broken.write_bytes(b"this is not a PNG")
    out = tmp_path / "out"
    out.mkdir()
    result = mpirun_sh(
        "2",
        "run",
        str(ROOT / "configs" / "imagefolder.yaml"),
        "clients=2",
        f"data.path={tmp_path / 'scans'}",
        "--out",
        str(out / "r.h5"),
        tmp=out,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert lines == [
        f"mpicd: config error: data.path: cannot read image {str(broken)!r}: cannot identify image file"
    ], lines
    assert list(out.iterdir()) == []  # no results file, no status file left
