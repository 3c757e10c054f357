"""Shared test helpers: run mpicd (or a driver script) under a real mpiexec, with a timeout."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from mpicd.mpi import launch

# the tests' own modules (data fixtures, clusters, shared steps) stand in tests/support/
sys.path.insert(0, str(Path(__file__).resolve().parent / "support"))

# the suite's own site key (mpicd.core.sitekey), in a fresh 0700 folder: the user's stays untouched
os.environ["MPICD_SITE_KEY"] = str(Path(tempfile.mkdtemp(prefix="mpicd-site-")) / "site.key")

ROOT = Path(__file__).resolve().parents[1]
DRIVERS = Path(__file__).resolve().parent / "drivers"
QUICKSTART = ROOT / "configs" / "quickstart.yaml"
PNEUMONIA = ROOT.parent / "shared" / "data" / "pneumoniamnist.npz"
RETINA = ROOT.parent / "shared" / "data" / "retinamnist.npz"


def is_timing(name: str) -> bool:
    """A results dataset that holds measured seconds (every one is named ``*_seconds``): never
    compared between runs."""
    return name.split("/")[-1].endswith("_seconds")


def mpi_env() -> dict:
    env = dict(os.environ)
    env.update(
        OMPI_ALLOW_RUN_AS_ROOT="1",
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
        OMPI_MCA_rmaps_base_oversubscribe="1",
        PYTHONUNBUFFERED="1",
    )
    return env


def mpiexec(n: int, *args: str, timeout: float = 240, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """``mpiexec -n n python ARGS`` as a subprocess; a hang fails the test instead of stalling CI."""
    command = launch.command(n, [sys.executable, *args], launcher="mpirun")
    try:
        return subprocess.run(command, cwd=cwd, env=mpi_env(), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as err:
        pytest.fail(
            f"mpiexec -n {n} {' '.join(args)} did not finish within {timeout} s (hang?)\n"
            f"stdout: {err.stdout}\nstderr: {err.stderr}"
        )


def mpicd_run(n: int, config: Path, out: Path, *overrides: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """Run ``mpicd run`` under mpiexec and insist that it succeeded."""
    result = mpiexec(n, "-m", "mpicd", "run", str(config), *overrides, "--out", str(out), timeout=timeout)
    assert result.returncode == 0, f"mpicd run failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
    return result


def mpicd_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """``python -m mpicd ARGS`` without MPI (for check)."""
    return subprocess.run(
        [sys.executable, "-m", "mpicd", *args], cwd=ROOT, env=mpi_env(), capture_output=True, text=True, timeout=timeout
    )


def require_pneumonia() -> Path:
    if not PNEUMONIA.is_file():
        pytest.skip(f"real data absent: {PNEUMONIA} (see ../shared/data/README.md)")
    return PNEUMONIA


BASELINE_RANKS = [2, 4, 6]


@pytest.fixture(scope="session", params=BASELINE_RANKS)
def baselines(request, tmp_path_factory):
    """(ranks, folder) of one ``tests/drivers/baselines.py`` job under ``mpiexec -n ranks``.

    Session-wide and shared by every baseline test module: one MPI start-up per rank count.
    """
    ranks = request.param
    out = tmp_path_factory.mktemp(f"baselines{ranks}")
    data = str(PNEUMONIA) if PNEUMONIA.is_file() else "-"
    result = mpiexec(ranks, str(DRIVERS / "baselines.py"), str(out), data, timeout=120 + 60 * ranks)
    assert result.returncode == 0, f"baselines driver failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
    return ranks, out


def rank_dumps(out: Path, variant: str, ranks: int) -> list[dict]:
    """The baselines driver's per-rank .npz dumps of one variant, as dicts."""
    return [dict(np.load(out / f"{variant}_rank{r}.npz")) for r in range(ranks)]


@pytest.fixture(scope="session")
def slurm(request, tmp_path_factory):
    """A throw-away single-node Slurm (tests/support/slurm_cluster.py) for the session, stopped at its end."""
    from slurm_cluster import SlurmCluster, missing_binaries

    missing = missing_binaries()
    reason = (
        f"Slurm is not installed (no {', '.join(missing)}): bash jobs/setup.sh installs it, as root"
        if missing
        else ""
        if os.getuid() == 0
        else "the test Slurm runs slurmd, which needs root"
    )
    if reason:
        request.config.pluginmanager.get_plugin("terminalreporter").write_line(f"SKIPPED slurm tests: {reason}")
        pytest.skip(reason)
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    try:
        cluster.start()
    except RuntimeError as err:
        pytest.fail(f"could not start the test Slurm: {err}")
    yield cluster
    cluster.stop()


def _netns_cluster(request, nodes: int):
    """A throw-away cluster of ``nodes`` namespace nodes (tests/support/netns_cluster.py), removed at the end
    whatever happened; skipped, with the reason printed, where it cannot run."""
    sys.path.insert(0, str(ROOT / "tests" / "support"))
    from netns_cluster import NetnsCluster, missing_binaries

    missing = missing_binaries()
    reason = (
        f"the multi-node tests need {', '.join(missing)} (bash jobs/setup.sh installs Slurm, as root)"
        if missing
        else ""
        if os.getuid() == 0
        else "the multi-node tests make network namespaces and run slurmd: they need root"
    )
    if reason:
        request.config.pluginmanager.get_plugin("terminalreporter").write_line(f"SKIPPED multinode tests: {reason}")
        pytest.skip(reason)
    import shutil
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix=f"mpicd-netns{nodes}-", dir="/var/tmp"))  # shared: not under /tmp
    cluster = NetnsCluster(folder, nodes)
    try:
        cluster.up()
    except RuntimeError as err:
        pytest.fail(f"could not start the {nodes}-node namespace cluster: {err}")
    try:
        yield cluster
    finally:
        problems = cluster.down()
        shutil.rmtree(folder, ignore_errors=True)
        assert not problems, f"the namespace cluster left {problems}"


@pytest.fixture(scope="session")
def netns2(request):
    """Two namespace nodes (node1, node2) with Slurm, shared by the multi-node tests of a session."""
    yield from _netns_cluster(request, 2)


@pytest.fixture(scope="module")
def netns4(request):
    """Four namespace nodes, for the one-rank-per-node layout."""
    yield from _netns_cluster(request, 4)
