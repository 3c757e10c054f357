"""Run under mpiexec: several ``mpicd run`` invocations, one after the other, in one MPI job (one
start-up and one ``import torch`` per rank instead of one per run; on a small CI box that is most
of a short run's time). argv: one JSON list of argument lists, each what would follow ``mpicd`` on
the command line, e.g. ``[["run", "configs/quickstart.yaml", "clients=2", "--out", "a.h5"]]``.

Each goes through :func:`mpicd.cli.main`, the entry point of ``python -m mpicd``; the first that
does not exit 0 ends the job with its status (every rank returns the same one).
"""

import json
import sys

from mpicd.cli import main

for args in json.loads(sys.argv[1]):
    code = main(args)
    if code != 0:
        print(f"runs driver: mpicd {' '.join(args)} exited with {code}", file=sys.stderr, flush=True)
        sys.exit(code)
