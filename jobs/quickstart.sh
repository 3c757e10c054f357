#!/usr/bin/env bash
# Set everything up (idempotent) and run the quick start: co-distillation, 4 ranks, built-in data.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash jobs/setup.sh
exec bash jobs/mpirun.sh 4 run configs/quickstart.yaml "$@"
