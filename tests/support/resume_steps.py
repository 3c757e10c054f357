"""The steps of a resume test: start ``mpicd run`` on 4 ranks in a session of its own, wait for a
round's checkpoint, stop it on request (SIGUSR1, exit 75), and compare two finished runs."""

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import ROOT, is_timing, mpi_env
from mpicd.mpi import launch
from mpicd.results.reader import Results
from mpicd.run import checkpoint


def assert_same_run(a: Results, b: Results):
    assert a.completed_rounds == b.completed_rounds == a.attrs["rounds"]
    assert set(a.metrics) == set(b.metrics)
    for name in a.metrics:
        if not is_timing(name):
            np.testing.assert_array_equal(a.metrics[name], b.metrics[name], err_msg=name)
    np.testing.assert_array_equal(a.bytes_sent_by_kind, b.bytes_sent_by_kind)
    np.testing.assert_array_equal(a.bytes_recv_by_kind, b.bytes_recv_by_kind)
    np.testing.assert_array_equal(a.teacher, b.teacher)


def start(out, config, overrides, *extra):
    command = [
        *launch.command(4, launcher="mpirun"),
        sys.executable,
        "-m",
        "mpicd",
        "run",
        str(config),
        *overrides,
        "--out",
        str(out),
        *extra,
    ]
    return subprocess.Popen(
        command,
        cwd=ROOT,
        env=mpi_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def wait_for_checkpoint(proc, out, completed: int, timeout: float = 180):
    """Until every rank holds a checkpoint of round ``completed`` or later. (Not "of exactly that
    round": ranks keep their newest two, so a poller starved on a loaded box can miss the window
    in which all four hold the same one.)"""
    folder = checkpoint.folder_for(out)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(max(checkpoint.held(folder, r), default=-1) >= completed for r in range(4)):
            return
        if proc.poll() is not None:
            pytest.fail(f"the run ended before round {completed} was checkpointed:\n{proc.communicate()}")
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    pytest.fail(f"no checkpoint of round {completed} within {timeout} s")


def stop_on_request(proc) -> str:
    """SIGUSR1 to mpiexec (it forwards it to every rank); the job must end with exit 75 within
    120 s. Returns its stdout."""
    os.kill(proc.pid, signal.SIGUSR1)
    try:
        stdout, stderr = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail("the run did not stop after SIGUSR1")
    assert proc.returncode == 75, (proc.returncode, stdout, stderr)
    return stdout
