"""``python -m mpicd.bench SPEC``: the MPI job itself (the launcher starts it)."""

import sys

from mpicd.bench.job import worker

sys.exit(worker(sys.argv[1]))
