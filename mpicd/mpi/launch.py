"""The one place a launcher command line is built: ``mpirun`` (Open MPI or MPICH, whichever is on PATH)
or, inside a Slurm allocation, ``srun``. ``mpicd bench``, the developer tools, the tests and the shell
scripts (``jobs/mpirun.sh``, ``slurm/launch.sh`` through ``python -m mpicd.mpi.launch``) all take
their command line from :func:`command`, so a flag a machine needs is added once.

The environment chooses what a site needs: ``MPICD_LAUNCHER`` (``srun`` or ``mpirun``; default srun
inside an allocation that has it, else mpirun), ``MPICD_SRUN_ARGS`` (replaces srun's default
``--mpi=pmix --kill-on-bad-exit=1``), ``MPICD_MPIRUN_ARGS`` (added to mpirun's options).

``python -m mpicd.mpi.launch [-n N] [--launcher L] [--no-oversubscribe] [--unbound] [-x NAME]... [-- PROGRAM...]``
prints the command line, one argument per line (for ``mapfile -t``), with PROGRAM at its end.

:func:`again` is the other direction, for messages: the command a user types to start a job like
this one again (the wrapper they ran, which exports MPICD_COMMAND, else the launcher itself).
"""

from __future__ import annotations

import argparse
import functools
import itertools
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence

FORWARDED = ("MPICD_SITE_KEY",)
"""Set where mpirun runs, passed to every rank on every node: each rank MACs and checks checkpoints
under the site key it reads (mpicd.core.sitekey), so all must read the same one."""

LAUNCHERS = ("srun", "mpirun")
SRUN_DEFAULT = "--mpi=pmix --kill-on-bad-exit=1"


class LaunchError(RuntimeError):
    """No launcher can be built here: a launcher that is not on PATH, or an unknown one."""


def in_allocation() -> bool:
    """Inside a Slurm allocation that has srun (a batch job or salloc)."""
    return "SLURM_JOB_ID" in os.environ and shutil.which("srun") is not None


def chosen(launcher: str | None = None) -> str:
    """``launcher``, else MPICD_LAUNCHER, else srun inside an allocation and mpirun outside."""
    name = launcher or os.environ.get("MPICD_LAUNCHER") or ("srun" if in_allocation() else "mpirun")
    if name not in LAUNCHERS:
        raise LaunchError(f"MPICD_LAUNCHER must be one of {', '.join(LAUNCHERS)}, got {name!r}")
    return name


@functools.cache
def mpirun() -> tuple[str, bool]:
    """The path of mpirun (or mpiexec) and whether it is Open MPI's (which needs --oversubscribe
    beyond the cores and, as root, --allow-run-as-root; MPICH's Hydra needs neither).

    This Python's own bin folder is searched before PATH, as an activated venv would: where the MPI
    came from PyPI (``jobs/setup.sh --mpi=wheel``), the launcher that matches the library mpi4py
    loads lies there, and a system one on PATH would start ranks that cannot talk to each other."""
    here = os.path.dirname(sys.executable)
    for search, name in itertools.product((here, None), ("mpirun", "mpiexec")):  # None: PATH
        path = shutil.which(name, path=search)
        if path:
            break
    else:
        raise LaunchError(
            "neither mpirun nor mpiexec is beside this Python or on PATH (nor is this a Slurm allocation): install an MPI "
            "(bash jobs/setup.sh --mpi=wheel needs no root) or load your site's MPI module"
        )
    version = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
    said = version.stdout + version.stderr
    return path, "Open MPI" in said or "OpenRTE" in said


def command(
    ranks: int | None,
    program: Sequence[str] = (),
    *,
    launcher: str | None = None,
    oversubscribe: bool = True,
    unbound: bool = False,
    hostfile: str | None = None,
    export: Sequence[str] = (),
) -> list[str]:
    """The command that starts ``ranks`` ranks of ``program``.

    srun: ``ranks`` None takes the allocation's tasks. mpirun: ``oversubscribe`` more ranks than
    cores (a workstation; False inside an allocation, whose slots are the limit), ``unbound``: no
    binding of ranks to cores (Open MPI binds each of up to 2 ranks to one core), ``hostfile``: the
    nodes and their slots, ``export``: environment variables passed to every rank (Open MPI's ``-x``;
    MPICH's Hydra and srun pass the whole environment); :data:`FORWARDED` ones set here always are.
    """
    kind = chosen(launcher)
    if kind == "srun":
        options = shlex.split(os.environ.get("MPICD_SRUN_ARGS") or SRUN_DEFAULT)
        return ["srun", *options, *(["-n", str(ranks)] if ranks is not None else []), *program]
    if ranks is None:
        raise LaunchError("mpirun needs a rank count (-n; the batch scripts: call require_ntasks first)")
    path, openmpi = mpirun()
    flags = []
    if openmpi:
        flags += ["--oversubscribe"] if oversubscribe else []
        flags += ["--allow-run-as-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []
        flags += ["--bind-to", "none"] if unbound else []
        forwarded = [name for name in FORWARDED if os.environ.get(name) and name not in export]
        flags += [x for name in [*forwarded, *export] for x in ("-x", name)]
    flags += ["--hostfile", str(hostfile)] if hostfile else []
    flags += shlex.split(os.environ.get("MPICD_MPIRUN_ARGS", ""))
    return [path, "-n", str(ranks), *flags, *program]


def again(ranks: int, words: Sequence[str], environ: Mapping[str, str] | None = None) -> str:
    """``mpicd WORDS`` on ``ranks`` ranks as the user would start it: with the wrapper that exported
    MPICD_COMMAND (jobs/mpirun.sh: ``jobs/mpirun.sh 4 run x.yaml``), else with srun inside a Slurm
    job or mpirun (``mpirun -n 4 mpicd run x.yaml``). For hints: a message names what was typed."""
    environ = os.environ if environ is None else environ
    wrapper = environ.get("MPICD_COMMAND")
    if wrapper:
        return shlex.join([wrapper, str(ranks), *words])
    launcher = "srun" if "SLURM_JOB_ID" in environ else "mpirun"
    return shlex.join([launcher, "-n", str(ranks), "mpicd", *words])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mpicd.mpi.launch", description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, dest="ranks", help="ranks (srun: default the allocation's tasks)")
    parser.add_argument("--launcher", choices=LAUNCHERS, help="default: MPICD_LAUNCHER, else srun in an allocation")
    parser.add_argument("--no-oversubscribe", action="store_true", help="mpirun: no --oversubscribe (an allocation)")
    parser.add_argument("--unbound", action="store_true", help="mpirun: no binding of ranks to cores")
    parser.add_argument("--srun-all-tasks", action="store_true", help="srun: no -n (the allocation's tasks)")
    parser.add_argument(
        "-x",
        dest="export",
        action="append",
        default=[],
        metavar="NAME",
        help="pass environment variable NAME to every rank (Open MPI's -x; srun and MPICH pass all)",
    )
    parser.add_argument("program", nargs=argparse.REMAINDER, help="-- PROGRAM ARGS...")
    args = parser.parse_args(argv)
    program = args.program[1:] if args.program[:1] == ["--"] else args.program
    try:
        srun = chosen(args.launcher) == "srun"
        line = command(
            None if srun and args.srun_all_tasks else args.ranks,
            program,
            launcher=args.launcher,
            oversubscribe=not args.no_oversubscribe,
            unbound=args.unbound,
            export=args.export,
        )
    except LaunchError as err:
        print(f"mpicd: {err}", file=sys.stderr)
        return 2
    print("\n".join(line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
