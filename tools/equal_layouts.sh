#!/usr/bin/env bash
# N clients on 2 ranks against the same N clients on N ranks, bit for bit: FedAvg with
# reduction: exact and co-distillation, PneumoniaMNIST at 30 images per class. Needs about 0.4 GiB a
# rank (32 ranks: 13 GiB). Usage: CLIENTS=32 ROUNDS=3 OUT=/var/tmp/eq bash tools/equal_layouts.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 SLURM_CPUS_PER_TASK=1
out=${OUT:-/var/tmp/eq32}; mkdir -p "$out"
common=(configs/pneumoniamnist.yaml clients=${CLIENTS:-32} data.images_per_class=30 rounds=${ROUNDS:-3})
for tag in fedavg_exact codistill; do
  alg="{name: fedavg, reduction: exact}"; [ "$tag" = codistill ] && alg="{name: codistill}"
  for ranks in 2 "${CLIENTS:-32}"; do
    extra=(); [ "$ranks" = 2 ] && extra=(clients_per_rank=balanced)
    mapfile -t launcher < <(.venv/bin/python -m mpicd.mpi.launch --launcher mpirun -n "$ranks")
    /usr/bin/time -f "$tag ranks=$ranks wall %e s, largest process %M KiB" "${launcher[@]}" .venv/bin/python -m mpicd run \
      "${common[@]}" "algorithm=$alg" "${extra[@]}" --out "$out/$tag-r$ranks.h5" --overwrite > "$out/$tag-r$ranks.log" 2>&1 || { tail -20 "$out/$tag-r$ranks.log"; exit 1; }
    tail -1 "$out/$tag-r$ranks.log"
  done
  PYTHONPATH="$PWD/tests:$PWD" .venv/bin/python - "$out/$tag-r${CLIENTS:-32}.h5" "$out/$tag-r2.h5" <<'PY'
import sys
from test_clients_per_rank import compared, differences
a, b = compared(sys.argv[1]), compared(sys.argv[2])
wrong = differences(a, b)
print(f"{sys.argv[2]} vs {sys.argv[1]}: {len(a)} datasets/attrs compared, differing: {wrong or 'none'}")
sys.exit(1 if wrong else 0)
PY
done
