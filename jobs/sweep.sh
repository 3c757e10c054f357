#!/usr/bin/env bash
# Run every pending run of a sweep file, one after another, on this workstation.
#   bash jobs/sweep.sh configs/sweep-pneumoniamnist.yaml
# Finished runs (results file with all rounds) are skipped, so re-running resumes. A failed run
# is reported and the sweep goes on; the exit status says whether any failed.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
sweep=${1:?usage: jobs/sweep.sh SWEEP.yaml}
mpicd() { .venv/bin/python -m mpicd "$@"; }
pending=$(mpicd sweep "$sweep" --pending) || exit 2
failed=()
for i in $pending; do
  ranks=$(mpicd sweep "$sweep" --ranks "$i") || exit 2
  eval "args=($(mpicd sweep "$sweep" --args "$i"))"
  echo "=== run $i: ${args[*]}"
  bash jobs/mpirun.sh "$ranks" "${args[@]}" || failed+=("$i")
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "failed runs: ${failed[*]}" >&2
  exit 1
fi
echo "sweep complete: mpicd report $(dirname "$(mpicd sweep "$sweep" --args 0 | awk '{print $NF}')")/*.h5"
