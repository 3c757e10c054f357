#!/usr/bin/env bash
# Pause, continue or show the study started by docs/results/run.sh (run.sh writes its process group to
# results/study/study.pgid). jobs/mpirun.sh starts mpirun in a session of its own (setsid), so the
# ranks are not in run.sh's process group: this script signals run.sh's group AND every process
# group of an mpirun below it.
#   bash docs/results/pause.sh stop     # SIGSTOP: everything freezes mid-round, nothing is lost
#   bash docs/results/pause.sh cont     # SIGCONT: it goes on where it was
#   bash docs/results/pause.sh status   # the processes and their state (T = stopped)
#   bash docs/results/pause.sh finish   # SIGUSR2 to mpirun: the ranks end their round, checkpoint,
#                                       # exit 130; run.sh then stops; run.sh again resumes
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
pgid=$(cat results/study/study.pgid)
descendants() { local p; for p in $(pgrep -P "$1"); do echo "$p"; descendants "$p"; done; }
groups() {
  local leaders; leaders=$(pgrep -g "$pgid" || true)
  { echo "$pgid"; for l in $leaders; do for d in $(descendants "$l"); do ps -o pgid= -p "$d" || true; done; done; } \
    | tr -d ' ' | sort -un
}
case "${1:-status}" in
  stop) for g in $(groups | sort -rn); do kill -STOP -- "-$g" && echo "stopped group $g"; done ;;
  cont) for g in $(groups); do kill -CONT -- "-$g" && echo "continued group $g"; done ;;
  finish) for m in $(for g in $(groups); do pgrep -g "$g" -x mpirun || true; done); do kill -USR2 "$m" && echo "USR2 to mpirun $m"; done ;;
  status) for g in $(groups); do ps -o pid,pgid,stat,etime,args -g "$g" | tail -n +2 | cut -c1-160; done ;;
  *) echo "usage: $0 stop|cont|status|finish" >&2; exit 2 ;;
esac
