#!/usr/bin/env bash
# Pause, continue or show the study started by study/run.sh (run.sh writes its process group to
# results/study/study.pgid). jobs/mpirun.sh starts mpirun in a session of its own (setsid), so the
# ranks are not in run.sh's process group: this script signals run.sh's group AND every process
# group of an mpirun below it.
#   bash study/pause.sh stop     # SIGSTOP: everything freezes mid-round, nothing is lost
#   bash study/pause.sh cont     # SIGCONT: it goes on where it was
#   bash study/pause.sh status   # the processes and their state (T = stopped)
#   bash study/pause.sh finish   # SIGUSR2 to mpirun: the ranks end their round, checkpoint,
#                                       # exit 130; run.sh then stops; run.sh again resumes
# It signals only a group that is provably the study's: run.sh's study.proof names the leader's pid,
# start time and session; a leader gone or started at another time (a stale file, a reused pid), a
# leader that is not run.sh, not in that session or no longer leading the group, or the caller's own
# group or session: nothing is signalled (exit 1, the reason said).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
state=${STUDY_STATE:-results/study}  # another folder: for the tests
refuse() { echo "pause.sh: $*; nothing signalled" >&2; exit 1; }
start_of() { { sed 's/.*) //' "/proc/$1/stat" 2>/dev/null || true; } | cut -d' ' -f20; }  # empty: gone
[ -f "$state/study.pgid" ] && [ -f "$state/study.proof" ] || refuse "no $state/study.pgid and study.proof (run.sh writes them)"
pgid=$(cat "$state/study.pgid")
read -r leader started session < "$state/study.proof" || true  # an empty or cut-short proof: refused below
[[ "$pgid" =~ ^[0-9]+$ ]] && [ "$pgid" -gt 1 ] && [ "$leader" = "$pgid" ] || refuse "$state/study.pgid ($pgid) is not the group run.sh leads ($leader)"
own_group=$(ps -o pgid= -p $$ | tr -d ' '); own_session=$(ps -o sid= -p $$ | tr -d ' ')
[ "$pgid" != "$own_group" ] && [ "$session" != "$own_session" ] || refuse "process group $pgid is this script's own group or session"
now=$(start_of "$leader")
[ -n "$now" ] || refuse "the study's leader (pid $leader) is gone: the study has ended"
[ "$now" = "$started" ] || refuse "pid $leader started at $now, not at $started: another process (the study has ended)"
command=$(tr '\0' ' ' 2>/dev/null < "/proc/$leader/cmdline") || refuse "the study's leader (pid $leader) is gone: the study has ended"
[[ "$command" == *study/run.sh* || "$command" == *docs/results/run.sh* ]] || refuse "pid $leader is not run.sh: $command"
[ "$(ps -o sid= -p "$leader" | tr -d ' ')" = "$session" ] || refuse "pid $leader is not in the study's session $session"
[ "$(ps -o pgid= -p "$leader" | tr -d ' ')" = "$pgid" ] || refuse "pid $leader no longer leads process group $pgid"
descendants() { local p; for p in $(pgrep -P "$1"); do echo "$p"; descendants "$p"; done; }
groups() {
  local leaders; leaders=$(pgrep -g "$pgid" || true)
  { echo "$pgid"; for l in $leaders; do for d in $(descendants "$l"); do ps -o pgid= -p "$d" || true; done; done; } \
    | tr -d ' ' | { grep -vx "$own_group" || true; } | sort -un
}
case "${1:-status}" in
  stop) for g in $(groups | sort -rn); do kill -STOP -- "-$g" && echo "stopped group $g"; done ;;
  cont) for g in $(groups); do kill -CONT -- "-$g" && echo "continued group $g"; done ;;
  finish) for m in $(for g in $(groups); do pgrep -g "$g" -x mpirun || true; done); do kill -USR2 "$m" && echo "USR2 to mpirun $m"; done ;;
  status) for g in $(groups); do ps -o pid,pgid,stat,etime,args -g "$g" | tail -n +2 | cut -c1-160; done ;;
  *) echo "usage: $0 stop|cont|status|finish" >&2; exit 2 ;;
esac
