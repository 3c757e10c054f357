"""The guide docs/how-to/add-a-launcher.md carried out as written, in a copy of the tree: its edits (each
shown in the guide, each old snippet still in the code), its example test and the launcher tests that
were there before, the command lines flux gets (each written out here, not derived from launch.py),
the scan that finds a flux line built by hand, and the batch scripts' `launch` with a stand-in
`flux` that records its arguments and exits 75. Flux itself is never run, nor needed."""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys

from conftest import ROOT
from guide_example import apply_edits, write_example_files

GUIDE = "docs/how-to/add-a-launcher.md"
EDITS = [  # what the guide tells the reader to change in existing files: (file, old, new)
    (
        "mpicd/mpi/launch.py",
        'LAUNCHERS = ("srun", "mpirun")\nSRUN_DEFAULT = "--mpi=pmix --kill-on-bad-exit=1"\n',
        'LAUNCHERS = ("srun", "mpirun", "flux")\nSRUN_DEFAULT = "--mpi=pmix --kill-on-bad-exit=1"\n'
        'FLUX_DEFAULT = "-o cpu-affinity=per-task"\n',
    ),
    (
        "mpicd/mpi/launch.py",
        '        return ["srun", *options, *(["-n", str(ranks)] if ranks is not None else []), *program]\n',
        '        return ["srun", *options, *(["-n", str(ranks)] if ranks is not None else []), *program]\n'
        '    if kind == "flux":\n'
        "        if ranks is None:\n"
        '            raise LaunchError("flux run needs a rank count (-n)")\n'
        '        options = shlex.split(os.environ.get("MPICD_FLUX_ARGS") or FLUX_DEFAULT)\n'
        '        options += ["-o", "cpu-affinity=off"] if unbound else []\n'
        '        return ["flux", "run", *options, "-n", str(ranks), *program]\n',
    ),
    (
        "tests/mpi/test_launch.py",
        "    with pytest.raises(launch.LaunchError, match=\"MPICD_LAUNCHER must be one of srun, mpirun, got 'aprun'\"):\n",
        "    with pytest.raises(launch.LaunchError, match=\"MPICD_LAUNCHER must be one of srun, mpirun, flux, got 'aprun'\"):\n",
    ),
    (
        "tests/mpi/test_launch.py",
        'LAUNCHERS = {"mpirun", "mpiexec", "srun"}\n',
        'LAUNCHERS = {"mpirun", "mpiexec", "srun", "flux"}\n',
    ),
    (
        "tests/mpi/test_launch.py",
        r"""        if re.search(r"(^|[\s(\"'])(mpirun|mpiexec|srun)\s+(-n|--ntasks)\b", code):""" "\n",
        r"""        if re.search(r"(^|[\s(\"'])(mpirun|mpiexec|srun|flux run)\s+(-n|--ntasks)\b", code):""" "\n",
    ),
]

# What launch.py must build once the guide is carried out: written out by hand, as the user would type it.
EXPECTED = {
    "default": "flux run -o cpu-affinity=per-task -n 4 python -m mpicd run 'a b'",
    "unbound": "flux run -o cpu-affinity=per-task -o cpu-affinity=off -n 2 p",  # hostfile, export: not flux's
    "environment": "flux run -o pmi=pmix --signal=USR1@2m -n 2 p",  # MPICD_LAUNCHER, MPICD_FLUX_ARGS
    "srun": "srun --mpi=pmix --kill-on-bad-exit=1 -n 4 p",  # the launchers that were there are unchanged
    "batch": "flux run -o cpu-affinity=per-task -n 4",  # what slurm/launch.sh asks mpicd.mpi.launch for
    "cli": "flux run -o cpu-affinity=per-task -n 3 p 'a b'",
}
CHECKS = """
import json, os, subprocess, sys
from pathlib import Path
sys.path[:0] = ["tests", "tests/mpi"]
from mpicd.mpi import launch
import test_launch

assert Path(launch.__file__).resolve().is_relative_to(Path.cwd().resolve()), launch.__file__
out = {
    "default": launch.command(4, ["python", "-m", "mpicd", "run", "a b"], launcher="flux"),
    "unbound": launch.command(2, ["p"], launcher="flux", unbound=True, hostfile="h", export=["A"]),
    "srun": launch.command(4, ["p"], launcher="srun"),
}
refused = {"no_ranks": lambda: launch.command(None, launcher="flux"), "unknown": lambda: launch.chosen("x")}
for name, call in refused.items():
    try:
        call()
    except launch.LaunchError as err:
        out[name] = str(err)
form = [sys.executable, "-m", "mpicd.mpi.launch"]
cli = subprocess.run([*form, "--launcher", "flux", "-n", "3", "--", "p", "a b"], capture_output=True, text=True)
out["cli"] = cli.stdout.splitlines()
os.environ.update(MPICD_LAUNCHER="flux", MPICD_FLUX_ARGS="-o pmi=pmix --signal=USR1@2m")
out["environment"] = launch.command(2, ["p"])
del os.environ["MPICD_FLUX_ARGS"]
batch = [*form, "--no-oversubscribe", "--srun-all-tasks", "-n", "4"]
out["batch"] = subprocess.run(batch, capture_output=True, text=True).stdout.splitlines()
missing = subprocess.run(form, capture_output=True, text=True)
out["missing"] = [missing.returncode, missing.stderr]
Path("probe.py").write_text('command = ["flux", "run", "-n", "2", "python"]\\n')
Path("probe.sh").write_text("#!/bin/sh\\nflux run -n 4 python -m mpicd\\n")
out["scan"] = test_launch.built_in_python(Path("probe.py").resolve()) + test_launch.built_in_shell(Path("probe.sh").resolve())
print(json.dumps(out))
"""
FAKE_FLUX = """#!/bin/sh
printf '%s\\n' "$@" > "$FLUX_ARGV"
echo "mpicd: stopped on request after round 3; resume with --resume"
exit 75
"""


def copy_of_the_tree(tmp_path):
    """mpicd and what the launcher tests read: the tests, and every file the scan looks at."""
    copy = tmp_path / "copy"
    skip = shutil.ignore_patterns("__pycache__", "*.h5", "*.npz")
    for folder in ("mpicd", "configs", "tests", "tools", "jobs", "slurm"):
        shutil.copytree(ROOT / folder, copy / folder, ignore=skip)
    for path in (ROOT / "study").rglob("*.py"):  # the scan reads study's Python only; its data stays
        (copy / path.relative_to(ROOT)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, copy / path.relative_to(ROOT))
    shutil.copy(ROOT / "pyproject.toml", copy)
    return copy


def run(command, cwd, env, timeout=120):
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    return result, f"{command}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"


def test_the_guides_flux_launcher_builds_its_command_lines_in_a_copy_of_the_package(tmp_path):
    copy = copy_of_the_tree(tmp_path)
    assert write_example_files(GUIDE, copy) == ["tests/mpi/test_launch_flux.py"], GUIDE
    apply_edits(GUIDE, copy, EDITS)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MPICD_", "SLURM_", "FLUX_"))}
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", PYTHONDONTWRITEBYTECODE="1")

    checked, why = run([sys.executable, "-c", CHECKS], copy, env)
    assert checked.returncode == 0, why
    out = json.loads(checked.stdout.splitlines()[-1])
    for name, line in EXPECTED.items():
        assert out[name] == shlex.split(line), f"{name}: {shlex.join(out[name])!r}, the guide says {line!r}"
    assert out["no_ranks"] == "flux run needs a rank count (-n)"
    assert out["unknown"] == "MPICD_LAUNCHER must be one of srun, mpirun, flux, got 'x'"
    assert out["missing"][0] == 2 and "flux run needs a rank count" in out["missing"][1]  # exit 2, the reason
    assert out["scan"] == ["probe.py:1", "probe.sh:2"]  # a flux line built by hand is found

    # the example's test, and the launcher tests as they were (but the real MPI job): the scan over the
    # whole copied tree now looks for flux too, and must find no flux line built outside launch.py
    tests = ["tests/mpi/test_launch_flux.py", "tests/mpi/test_launch.py", "-k", "not real_job", "-rA"]
    tested, why = run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests], copy, env)
    assert tested.returncode == 0, why
    assert len(re.findall(r"^PASSED tests/mpi/test_launch_flux.py::", tested.stdout, re.M)) == 3, why

    # the batch scripts' launch (slurm/launch.sh, as slurm/mpicd.sbatch calls it) runs flux run, and reads
    # its status 75 as "checkpointed"
    (copy / "bin").mkdir()
    (copy / "bin" / "flux").write_text(FAKE_FLUX)
    (copy / "bin" / "flux").chmod(0o755)
    env.update(
        MPICD_LAUNCHER="flux",
        FLUX_ARGV=str(tmp_path / "argv"),
        PATH=os.pathsep.join([str(copy / "bin"), os.path.dirname(sys.executable), env["PATH"]]),
    )
    script = 'source slurm/launch.sh\nMPICD_NTASKS=4\nlaunch run configs/quickstart.yaml --out x.h5 "${resume[@]}"\n'
    launched, why = run(["bash", "-c", script], copy, env)
    assert launched.returncode == 75, why
    argv = (tmp_path / "argv").read_text().splitlines()
    assert argv == shlex.split(
        "run -o cpu-affinity=per-task -n 4 python -m mpicd run configs/quickstart.yaml --out x.h5 --resume"
    ), why
    assert "the ranks checkpointed and stopped; run the same command again to resume" in launched.stderr, why
