"""The one place a launcher command line is built (mpicd/mpi/launch.py): its flags per MPI, per user
and per environment variable, a real 2-rank job started from it, its command-line form (what the
shell scripts read), and that no other file builds an mpirun, mpiexec or srun command line."""

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, mpi_env
from mpicd.mpi import launch

ROOT_USER = hasattr(os, "geteuid") and os.geteuid() == 0


@pytest.fixture
def plain_env(monkeypatch):
    for name in ("MPICD_LAUNCHER", "MPICD_SRUN_ARGS", "MPICD_MPIRUN_ARGS", "SLURM_JOB_ID", "MPICD_SITE_KEY"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_mpirun_here_is_open_mpi_with_the_flags_it_needs(plain_env):
    path, openmpi = launch.mpirun()
    version = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
    assert openmpi == ("Open MPI" in version.stdout + version.stderr)
    line = launch.command(3, ["prog", "arg"])
    assert line[:3] == [path, "-n", "3"] and line[-2:] == ["prog", "arg"]
    if openmpi:
        assert "--oversubscribe" in line
        assert ("--allow-run-as-root" in line) == ROOT_USER
        assert "--oversubscribe" not in launch.command(3, oversubscribe=False)
        assert launch.command(2, unbound=True)[-2:] == ["--bind-to", "none"]
        exported = launch.command(2, ["p"], export=["PYTHONPATH", "A"])
        assert exported[-5:] == ["-x", "PYTHONPATH", "-x", "A", "p"]
        plain_env.setenv("MPICD_SITE_KEY", "/shared/site.key")  # every rank, on every node, reads one site key
        assert launch.command(2, ["p"], export=["A"])[-5:] == ["-x", "MPICD_SITE_KEY", "-x", "A", "p"]


def test_the_launcher_beside_this_python_comes_before_path(plain_env, tmp_path):
    """jobs/setup.sh --mpi=wheel puts Open MPI's mpirun in the venv's bin, not on PATH: it must be
    the one chosen, or a system mpirun on PATH starts ranks of another MPI than mpi4py loads."""
    bin_ = tmp_path / "venv" / "bin"
    bin_.mkdir(parents=True)
    fake = bin_ / "mpiexec"  # mpiexec only: a venv's launcher wins even over an mpirun found on PATH
    fake.write_text("#!/bin/sh\necho 'mpiexec (Open MPI) 5.0.11'\n")
    fake.chmod(0o755)
    plain_env.setattr(launch.sys, "executable", str(bin_ / "python"))
    launch.mpirun.cache_clear()
    try:
        assert launch.mpirun() == (str(fake), True)
        fake.unlink()
        launch.mpirun.cache_clear()
        assert launch.mpirun()[0] != str(fake)  # none beside it: PATH's
        plain_env.setenv("PATH", str(tmp_path))  # nothing anywhere: the message says how to get one
        launch.mpirun.cache_clear()
        with pytest.raises(launch.LaunchError, match=r"neither mpirun nor mpiexec.*--mpi=wheel needs no root"):
            launch.mpirun()
    finally:
        launch.mpirun.cache_clear()


def test_the_environment_chooses_the_launcher_and_its_options(plain_env):
    plain_env.setenv("MPICD_MPIRUN_ARGS", "--map-by node --display-map")
    line = launch.command(2, ["p"], hostfile="/tmp/hosts")
    assert line[-6:] == ["--hostfile", "/tmp/hosts", "--map-by", "node", "--display-map", "p"]  # the user's last
    plain_env.setenv("MPICD_LAUNCHER", "srun")
    assert launch.command(4, ["p"]) == ["srun", "--mpi=pmix", "--kill-on-bad-exit=1", "-n", "4", "p"]
    assert launch.command(None, ["p"]) == ["srun", "--mpi=pmix", "--kill-on-bad-exit=1", "p"]  # the allocation's tasks
    plain_env.setenv("MPICD_SRUN_ARGS", "--mpi=pmi2")
    assert launch.command(2, ["p"]) == ["srun", "--mpi=pmi2", "-n", "2", "p"]
    assert launch.command(2, ["p"], launcher="mpirun")[0] == launch.mpirun()[0]  # the caller's word wins
    plain_env.setenv("MPICD_LAUNCHER", "aprun")
    with pytest.raises(launch.LaunchError, match="MPICD_LAUNCHER must be one of srun, mpirun, got 'aprun'"):
        launch.command(2)
    plain_env.delenv("MPICD_LAUNCHER")
    with pytest.raises(launch.LaunchError, match="mpirun needs a rank count"):
        launch.command(None)


def test_inside_an_allocation_srun_is_the_default_only_where_it_exists(plain_env, tmp_path):
    plain_env.setenv("SLURM_JOB_ID", "7")
    fake = tmp_path / "srun"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    plain_env.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert launch.chosen() == "srun"
    plain_env.setenv("PATH", str(tmp_path / "empty"))
    assert launch.chosen() == "mpirun"  # an allocation without srun on PATH


def test_a_real_job_starts_from_the_command(plain_env):
    # One rank prints: Open MPI forwards each rank's stdout on its own, so three ranks printing can
    # interleave mid-line ("66" then a bare newline was seen in CI).
    code = "from mpi4py import MPI; c = MPI.COMM_WORLD; g = c.gather(c.allreduce(c.rank + 1)); c.rank or print(*g)"
    program = [sys.executable, "-c", code]
    done = subprocess.run(
        launch.command(3, program), env=mpi_env(), capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["6", "6", "6"]  # 1 + 2 + 3 on every rank


def test_the_command_line_form_prints_one_argument_per_line(plain_env):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MPICD_", "SLURM_"))}
    done = subprocess.run(
        [sys.executable, "-m", "mpicd.mpi.launch", "-n", "2", "--no-oversubscribe", "--", "a b", "c"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == launch.command(2, ["a b", "c"], oversubscribe=False)
    bad = subprocess.run(
        [sys.executable, "-m", "mpicd.mpi.launch", "--launcher", "srun"],
        env={**env, "MPICD_LAUNCHER": "x"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 0 and bad.stdout.splitlines()[0] == "srun"  # --launcher beats the environment
    whole = subprocess.run(
        [sys.executable, "-m", "mpicd.mpi.launch", "--srun-all-tasks", "-n", "2"],
        env={**env, "MPICD_LAUNCHER": "srun"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert whole.stdout.splitlines() == ["srun", "--mpi=pmix", "--kill-on-bad-exit=1"]  # the allocation's tasks
    missing = subprocess.run(
        [sys.executable, "-m", "mpicd.mpi.launch", "--launcher", "mpirun"], env=env, capture_output=True, text=True
    )
    assert missing.returncode == 2 and "mpirun needs a rank count" in missing.stderr and not missing.stdout


LAUNCHERS = {"mpirun", "mpiexec", "srun"}
LAUNCH_PY = ROOT / "mpicd" / "mpi" / "launch.py"


def built_in_python(path: Path, root: Path = ROOT) -> list[str]:
    """Lists whose first element is a launcher's name: a command line built by hand."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.List) and node.elts and isinstance(node.elts[0], ast.Constant):
            if node.elts[0].value in LAUNCHERS:
                found.append(f"{path.relative_to(root)}:{node.lineno}")
    return found


def built_in_shell(path: Path, root: Path = ROOT) -> list[str]:
    """Lines (not comments) that run a launcher with -n: a command line built by hand."""
    found = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        code = line.split("#", 1)[0] if not line.lstrip().startswith("echo") else ""
        code = "" if "mpicd.mpi.launch" in code else code  # the builder's own command-line form
        if re.search(r"(^|[\s(\"'])(mpirun|mpiexec|srun)\s+(-n|--ntasks)\b", code):
            found.append(f"{path.relative_to(root)}:{number}")
    return found


def test_no_other_file_builds_a_launcher_command_line():
    python = [p for d in ("mpicd", "tests", "tools", "jobs", "study") for p in (ROOT / d).rglob("*.py")]
    shell = [
        *ROOT.joinpath("jobs").glob("*.sh"),
        *ROOT.joinpath("tools").glob("*.sh"),
        *ROOT.joinpath("slurm").iterdir(),
    ]
    found = [hit for p in python if p not in (LAUNCH_PY, Path(__file__).resolve()) for hit in built_in_python(p)]
    found += [hit for p in shell if p.is_file() for hit in built_in_shell(p)]
    assert not found, f"launcher command lines built outside mpicd/mpi/launch.py: {found}"


def test_the_scan_finds_a_command_line_built_by_hand(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text('import sys\ncommand = ["mpiexec", "-n", "2", sys.executable]\nok = ["python", "mpirun"]\n')
    assert built_in_python(probe, tmp_path) == ["probe.py:2"]
    script = tmp_path / "probe.sh"
    script.write_text(
        "# mpirun -n 4 in a comment\necho 'mpirun -n 2 is what to type'\nsetsid mpirun -n 2 x\n"
        'mapfile -t c < <(python -m mpicd.mpi.launch --launcher mpirun -n "$n")\n'
    )
    assert built_in_shell(script, tmp_path) == ["probe.sh:3"]
