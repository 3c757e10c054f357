#!/usr/bin/env bash
# Run every pending run of a sweep file, one after another, on this workstation.
#   bash jobs/sweep.sh configs/sweep-pneumoniamnist.yaml
# Finished runs (results file with all rounds) are skipped and every run starts with --resume, so
# re-running continues an interrupted run from its checkpoint. A failed run is reported and the
# sweep goes on; the exit status says whether any failed. Ctrl-C (or SIGTERM) stops the sweep: the
# current run checkpoints after its round (exit 130) and no further run starts; a second Ctrl-C
# ends the run at once, keeping its last checkpoint. Before and after each run a line shows the
# progress: run i of N pending, finished/failed, elapsed, time left.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
sweep=${1:?usage: jobs/sweep.sh SWEEP.yaml}
mpicd() { .venv/bin/python -m mpicd "$@"; }
duration() {  # seconds -> 12s, 4m05s, 3h07m (as mpicd.sweep.grid.duration)
  local s=$1
  if ((s < 60)); then echo "${s}s"; elif ((s < 3600)); then printf '%dm%02ds\n' $((s / 60)) $((s % 60))
  else printf '%dh%02dm\n' $((s / 3600)) $((s % 3600 / 60)); fi
}
progress() {  # as mpicd.sweep.grid.progress: time left = mean seconds of the runs ended x runs not ended
  local ended=$((finished + ${#failed[@]})) left="time left unknown"
  ((ended > 0)) && left="about $(duration $(((run_seconds * (total - ended) + ended / 2) / ended))) left"
  echo "$finished of $total finished, ${#failed[@]} failed; $(duration $((SECONDS - started))) elapsed, $left"
}
pending=$(mpicd sweep "$sweep" --pending) || exit 2
total=$(echo "$pending" | wc -w)
failed=() finished=0 run_seconds=0 started=$SECONDS i=0 interrupted=0
# Ctrl-C reaches mpirun too (same terminal process group): bash runs this after the run returns.
trap 'interrupted=1' INT TERM
stop_here() {  # $1: the run that was interrupted
  echo "=== sweep interrupted at run $1 ($(progress)); continue with: bash jobs/sweep.sh $sweep" \
       "(finished runs are skipped, run $1 resumes from its checkpoint)" >&2
  exit 130
}
for run in $pending; do
  i=$((i + 1))
  ranks=$(mpicd sweep "$sweep" --ranks "$run") || exit 2
  eval "args=($(mpicd sweep "$sweep" --args "$run"))"
  echo "=== run $run ($i of $total pending; $(progress)): ${args[*]}"
  began=$SECONDS
  bash jobs/mpirun.sh "$ranks" "${args[@]}" --resume
  status=$?
  if [ "$interrupted" = 1 ] || [ "$status" = 130 ] || [ "$status" = 75 ]; then
    run_seconds=$((run_seconds + SECONDS - began))
    stop_here "$run"
  elif [ "$status" = 0 ]; then
    finished=$((finished + 1)) outcome="finished"
  else
    failed+=("$run") outcome="failed (exit $status)"
  fi
  took=$((SECONDS - began))  # read once: the line's time and the estimate must agree
  run_seconds=$((run_seconds + took))
  echo "--- run $run $outcome in $(duration "$took") ($(progress))"
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "failed runs: ${failed[*]}" >&2
  exit 1
fi
echo "sweep complete: tables with mpicd report $(dirname "$(mpicd sweep "$sweep" --args 0 | awk '{print $NF}')")/*.h5;" \
     "mpicd ledger $sweep keeps every finished run's scores in its runs ledger (for git; mpicd report reads it too)"
