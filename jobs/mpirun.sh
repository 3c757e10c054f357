#!/usr/bin/env bash
# mpirun for a workstation: N ranks of the project's venv Python running mpicd.
#   jobs/mpirun.sh 4 run configs/quickstart.yaml rounds=5
# Oversubscribes (more ranks than cores is fine for small models) and, as root, adds the
# confirmation Open MPI insists on. It stays in the caller's folder: config and --out paths are
# relative to where you stand, as with mpirun itself.
# Ctrl-C: Open MPI's mpirun answers SIGINT with SIGTERM to the ranks after odls_base_sigkill_timeout
# (1 s) and SIGKILL after twice that, too soon for a round to finish. So mpirun runs in its own
# session here, out of the terminal's reach, and a Ctrl-C becomes SIGUSR2, which mpirun passes on
# at once: every rank finishes its round, checkpoints and stops; this script exits 130.
# A second Ctrl-C sends mpirun the SIGINT itself: the job ends at once, the last checkpoint stays.
# Clean endings (a config error: 2, a stop: 75 or 130, failed packed runs: 1) come without mpirun's
# abort banner: the ranks write the agreed status into a temporary file and exit 0, and this script
# exits with the file's status (mpicd/mpi/ending.py); a crash keeps its traceback and the banner.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
n=${1:?usage: jobs/mpirun.sh NRANKS mpicd-arguments...}; shift
if [ "$(id -u)" = 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
status=$(mktemp "${TMPDIR:-/tmp}/mpicd-status.XXXXXX")
trap 'rm -f "$status"' EXIT
# MPICD_COMMAND: how hints name this script; uname -n: the host name the ranks compare with theirs
export MPICD_EXIT_STATUS_FILE=$status MPICD_EXIT_STATUS_HOST=$(uname -n) MPICD_COMMAND=$0
mapfile -t launcher < <("$root/.venv/bin/python" -m mpicd.mpi.launch --launcher mpirun -n "$n" \
  -x MPICD_EXIT_STATUS_FILE -x MPICD_EXIT_STATUS_HOST -x MPICD_COMMAND)
[ ${#launcher[@]} -gt 0 ] || exit 2  # mpicd.mpi.launch has said why
setsid "${launcher[@]}" "$root/.venv/bin/python" -m mpicd "$@" &
pid=$! interrupts=0
on_interrupt() {
  interrupts=$((interrupts + 1))
  if [ "$interrupts" = 1 ]; then
    echo "mpicd: interrupt: the ranks stop after this round, checkpointed (Ctrl-C again: stop now)" >&2
    kill -USR2 "$pid" 2>/dev/null || true
  else
    kill -INT "$pid" 2>/dev/null || true
  fi
}
trap on_interrupt INT TERM
trap 'kill -USR1 "$pid" 2>/dev/null || true' USR1
while :; do
  wait "$pid" && rc=0 || rc=$?
  kill -0 "$pid" 2>/dev/null || break  # wait returned for the job's end, not for a trap
done
read -r handed < "$status" || true
if [ "$rc" = 0 ] && [[ "${handed:-}" =~ ^[0-9]+$ ]]; then
  rc=$handed  # the ranks' agreed status; they exited 0, so mpirun printed no banner
fi
if [ "$interrupts" -gt 0 ] && [ "$rc" != 0 ]; then
  rc=130  # mpirun itself reports 1 for ranks that exit 130
fi
exit "$rc"
