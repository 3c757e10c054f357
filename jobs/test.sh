#!/usr/bin/env bash
# Set everything up (idempotent) and run the whole test suite (real mpiexec, 1-6 ranks).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash jobs/setup.sh
if [ "$(id -u)" = 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
exec .venv/bin/python -m pytest -q --durations=30 "$@"  # the 30 slowest tests, to keep the suite short
