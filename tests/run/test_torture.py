"""Crash torture (tests/support/torture.py): an mpicd job SIGKILLed again and again at random moments (the
whole job, one rank, a rank inside its results write or its checkpoint write), resumed each time;
after every kill ``mpicd verify`` passes on the file and no round that every rank had checkpointed
is lost, and each completed job's file equals an uninterrupted run's. A small count here
(MPICD_TORTURE=N for more; MPICD_TORTURE_SEED=S to replay a run's draws, printed on failure)."""

import json
import os
import random
import re
import shutil
import subprocess
import sys

import pytest

from conftest import DRIVERS, ROOT, mpi_env

KILLS = int(os.environ.get("MPICD_TORTURE", "4"))
SUMMARY = re.compile(
    r"^torture: (\d+) kills \(job (\d+), rank (\d+), in_write (\d+), in_checkpoint (\d+);.*\), "
    r"(\d+) cycles completed, .* (\d+) failures, ",
    re.M,
)


def test_random_sigkills_then_resume_keep_every_promise(tmp_path):
    seed = int(os.environ.get("MPICD_TORTURE_SEED", random.randrange(2**31)))
    command = [
        sys.executable,
        str(ROOT / "tests" / "support" / "torture.py"),
        "--kills",
        str(KILLS),
        "--seed",
        str(seed),
    ]
    result = subprocess.run(
        [*command, "--out", str(tmp_path)],
        cwd=ROOT,
        env=mpi_env(),
        capture_output=True,
        text=True,
        timeout=240 + 40 * KILLS,
    )
    lines = [line for line in result.stdout.splitlines() if re.match(r"(kill |cycle |FAILURE|torture|  refused)", line)]
    shown = "\n".join(lines) + f"\n(replay: MPICD_TORTURE_SEED={seed})\n{result.stderr[-2000:]}"
    assert result.returncode == 0, shown
    summary = SUMMARY.search(result.stdout)
    assert summary, shown
    kills, job, rank, in_write, in_checkpoint, cycles, failures = map(int, summary.groups())
    assert kills == KILLS and failures == 0, shown
    assert min(job, rank, in_write, in_checkpoint) >= KILLS // 4, shown  # every kind, in turn
    assert cycles >= 1 and len([line for line in lines if line.startswith("kill ")]) == KILLS, shown


@pytest.mark.skipif(
    os.getuid() != 0 or shutil.which("unshare") is None, reason="the PID-namespace sandbox needs root and unshare"
)
def test_kill_job_kills_the_session_it_saw_and_never_a_reused_pid():
    """Attempt.kill_job in a PID-namespace sandbox (tests/drivers/torture_identity.py): a process
    seen before its exec is still killed after it, and a record naming the canary's pid with
    another start time (a pid reused since) kills nothing."""
    command = ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, str(DRIVERS / "torture_identity.py")]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"the sandbox failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    assert any(cmd[:2] == ["bash", "-c"] for cmd in facts["before"].values()), facts  # seen before its exec
    assert facts["leader_rc"] == -9 and facts["session_alive"] == [] and facts["left"] == [], facts
    assert facts["canary_alive"], facts
