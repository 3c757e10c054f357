#!/usr/bin/env bash
# Set everything up (idempotent) and run the quick start: co-distillation, 4 ranks, built-in data.
# It writes results/quickstart.h5 (the config's output) and replaces the one an earlier quick start
# wrote (--overwrite); with your own --out, --resume or --overwrite it passes yours instead, and
# an existing file at your --out is then refused unless you say which.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash jobs/setup.sh
flags=(--overwrite)
for arg in "$@"; do
  case "$arg" in --out|--out=*|--resume|--overwrite) flags=() ;; esac
done
exec bash jobs/mpirun.sh 4 run configs/quickstart.yaml "$@" "${flags[@]}"
