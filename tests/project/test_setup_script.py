"""jobs/setup.sh on someone else's machine (jobs/setup_lib.sh, driven alone: no apt, no network): the
policy-rc.d that keeps apt from starting daemons is gone on every way out, a site's own is never
touched, and a cut-short cached wheel is rebuilt, never installed."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import zipfile

import pytest

from conftest import ROOT

MARK = "# written by mpicd jobs/setup.sh"


def guarded(tmp_path, apt: str) -> subprocess.Popen:
    """bash running ``with_policy_rc_d FAKE_APT`` with the policy file in tmp_path."""
    fake = tmp_path / "apt-get"
    fake.write_text(f"#!/bin/sh\n{apt}\n")
    fake.chmod(0o755)
    script = f"set -euo pipefail; source jobs/setup_lib.sh; with_policy_rc_d {fake}; echo after"
    env = {**os.environ, "MPICD_POLICY_RC_D": str(tmp_path / "policy-rc.d")}
    return subprocess.Popen(
        ["bash", "-c", script], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True, start_new_session=True
    )


def wait_for(path, timeout=10):
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_signal_while_apt_runs_removes_the_policy_file(tmp_path, sig):
    proc = guarded(tmp_path, "exec sleep 30")
    policy = tmp_path / "policy-rc.d"
    wait_for(policy)
    assert MARK in policy.read_text() and "exit 101" in policy.read_text()
    began = time.monotonic()
    proc.send_signal(sig)  # to setup's shell only, as `kill PID` would
    out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 128 + sig, (proc.returncode, out)
    assert time.monotonic() - began < 10, "the signal waited for apt to finish"
    assert not policy.exists() and "after" not in out


@pytest.mark.parametrize("apt, status", [("exit 0", 0), ("exit 3", 3)])
def test_apt_ending_or_failing_removes_the_policy_file(tmp_path, apt, status):
    policy = tmp_path / "policy-rc.d"
    proc = guarded(tmp_path, f"test -x {policy} || exit 9; {apt}")  # the file is there while apt runs
    out, _ = proc.communicate(timeout=20)
    assert proc.returncode == status, out
    assert not policy.exists()


def test_a_site_policy_file_is_left_exactly_as_it_was(tmp_path):
    policy = tmp_path / "policy-rc.d"
    site = b"#!/bin/sh\n# the site's own\nexit 101\n"
    policy.write_bytes(site)
    out, _ = guarded(tmp_path, "exit 0").communicate(timeout=20)
    assert policy.read_bytes() == site and "after" in out


def test_a_leftover_of_a_killed_run_is_recognised_as_its_own_and_removed(tmp_path):
    policy = tmp_path / "policy-rc.d"
    policy.write_text(f"#!/bin/sh\n{MARK}\nexit 101\n")  # what a SIGKILLed setup.sh leaves
    out, _ = guarded(tmp_path, "exit 0").communicate(timeout=20)
    assert not policy.exists() and "after" in out


def bash(script: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "-c", f"source jobs/setup_lib.sh; {script}"],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_truncated_cached_wheel_is_rebuilt_not_installed(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    wheel = cache / "demo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("demo/__init__.py", "x = 1\n" * 2000)
    good = wheel.read_bytes()
    assert bash(f"wheel_ok {wheel}").returncode == 0
    wheel.write_bytes(good[: len(good) // 2])
    assert bash(f"wheel_ok {wheel}").returncode != 0
    # BUILD writes a sound wheel into the folder it is given; the cut-short one must be replaced by it
    build = f'build() {{ cp {tmp_path}/fresh.whl "$1/demo-1.0-py3-none-any.whl"; }}; cached_wheel {cache} demo build'
    (tmp_path / "fresh.whl").write_bytes(good)
    done = bash(build)
    assert done.returncode == 0 and "corrupt" in done.stderr, done.stderr
    assert wheel.read_bytes() == good and [p.name for p in cache.iterdir()] == [wheel.name]
    done = bash(f"build() {{ echo built >&2; }}; cached_wheel {cache} demo build")  # sound: no build
    assert done.returncode == 0 and "built" not in done.stderr


def test_a_wheel_with_a_damaged_member_is_corrupt_too(tmp_path):
    """The central directory intact, one member's bytes changed: ``python -m zipfile -t`` exits 0 on
    this, the check must not."""
    wheel = tmp_path / "demo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:  # stored, so the bytes are there to change
        z.writestr("demo/__init__.py", "x = 1\n" * 2000)
    assert bash(f"wheel_ok {wheel}").returncode == 0
    data = bytearray(wheel.read_bytes())
    data[data.index(b"x = 1")] = ord("y")
    wheel.write_bytes(bytes(data))
    assert bash(f"wheel_ok {wheel}").returncode != 0


def test_a_build_that_says_ok_but_leaves_a_corrupt_wheel_is_not_moved_in(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    done = bash(f'build() {{ echo PK > "$1/demo-1.0-py3-none-any.whl"; }}; cached_wheel {cache} demo build')
    assert done.returncode != 0 and "failed" in done.stderr and list(cache.iterdir()) == []


def test_a_failed_build_leaves_no_partial_wheel_in_the_cache(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    done = bash(f'build() {{ echo half > "$1/demo-1.0-py3-none-any.whl"; return 1; }}; cached_wheel {cache} demo build')
    assert done.returncode != 0 and list(cache.iterdir()) == []


def test_the_wheel_cache_must_be_private(tmp_path):
    cache = tmp_path / "open"
    cache.mkdir()
    cache.chmod(0o777)
    done = bash(f"private_folder {cache}")
    assert done.returncode != 0 and "writable by others" in done.stderr
    fresh = tmp_path / "fresh"
    assert bash(f"private_folder {fresh}").returncode == 0
    assert oct(fresh.stat().st_mode & 0o777) == "0o700"


def test_a_site_slurm_is_told_from_debians(tmp_path):
    """sbatch that no Debian package owns is a site's Slurm: setup.sh installs nothing over it."""
    fake = tmp_path / "sbatch"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    assert bash("site_slurm", PATH=f"{tmp_path}:{os.environ['PATH']}").returncode == 0
    debian = subprocess.run(["dpkg", "-S", "/usr/bin/sbatch"], capture_output=True, text=True)
    if debian.returncode == 0 and debian.stdout.startswith("slurm"):  # this machine's own, from Debian
        assert bash("site_slurm").returncode == 1
