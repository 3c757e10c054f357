#!/usr/bin/env bash
# mpirun for a workstation: N ranks of the project's venv Python running mpicd.
#   jobs/mpirun.sh 4 run configs/quickstart.yaml rounds=5
# Oversubscribes (more ranks than cores is fine for small models) and, as root, adds the
# confirmation Open MPI insists on.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
n=${1:?usage: jobs/mpirun.sh NRANKS mpicd-arguments...}; shift
if [ "$(id -u)" = 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
exec mpirun -n "$n" --oversubscribe .venv/bin/python -m mpicd "$@"
