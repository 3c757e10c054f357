#!/usr/bin/env bash
# A GPU node in five minutes: placement (local rank -> GPU, CUDA_VISIBLE_DEVICES), a run repeated bit for
# bit, throughput of 1, 8 and 32 clients on one GPU and of one rank per GPU with peak memory, and K clients
# in turn against one batched (vmap) computation. Prints the tables and writes them to --out.
#   bash jobs/gpu_check.sh                      # on a node with GPUs (inside an allocation: srun -N1 --gpus=N ...)
#   bash jobs/gpu_check.sh --cpu                # the same checks on CPU, smaller (CI runs this)
#   bash jobs/gpu_check.sh --out FILE --config CONFIG   # default results/gpu_check.md, configs/pneumoniamnist.yaml
# Exit 0: every check passed; 1: a check failed (the report says which); 2: no GPU (use --cpu).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [ "$(id -u)" = 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
exec .venv/bin/python tools/gpu_check.py "$@"
