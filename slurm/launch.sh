# Sourced by the batch scripts (after `cd` to the project folder): the venv, thread counts, and
#   require_ntasks N WHAT   stop (exit 2) unless this job has N tasks, naming --ntasks
#   config_clients ARGS...  the `clients` of `mpicd run ARGS...` (exit 2 on a bad config)
#   launch ARGS...          `python -m mpicd ARGS...` on every task, with srun or mpirun
# launch runs the launcher in the background and waits, so that a SIGUSR1 from Slurm (the
# scripts ask for one 120 s before the time limit) is forwarded to the ranks; they finish their
# round, checkpoint and exit with 75, and the job requeues itself to resume from there.
# The launcher's stdout also goes through tee into a temporary file, to tell a failed launch (no
# rank got as far as its start-up line, "mpicd: rank R on HOST" or "mpicd pack: N runs in") from
# a job that started and then failed: a rank's error, or a node lost mid-run.
# Clean endings (a config error: 2, a stop: 75 or 130, failed packed runs: 1) reach launch through
# a temporary file instead of the ranks' exit status (mpicd/mpi/ending.py): the ranks exit 0, so
# srun --kill-on-bad-exit and mpirun neither end the others early nor print their abort banner.
if [ -f .venv/bin/activate ]; then source .venv/bin/activate; fi
export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-1}
resume=(${MPICD_RESUME_FLAG---resume})  # always resume: a checkpoint if there is one, else a fresh start
MPICD_STOPPED=75                           # the ranks' status for "checkpointed at a round boundary"
MPICD_INTERRUPTED=130                      # the same after SIGINT/SIGTERM (Ctrl-C, scancel): no requeue

require_ntasks() {
  local have=${SLURM_NTASKS:-}
  if [ -n "$have" ] && [ "$have" != "$1" ]; then
    echo "mpicd: $2 needs $1 tasks, this job has $have (--ntasks=$have): submit it with sbatch --ntasks=$1" >&2
    exit 2
  fi
  MPICD_NTASKS=$1
}

config_clients() {
  python - "$@" <<'PY'
import sys
from mpicd.cli import _parsers
from mpicd.config import ConfigError, load_config
args = _parsers()["run"].parse_intermixed_args(sys.argv[1:])
try:
    print(load_config(args.config, args.overrides).clients)
except ConfigError as err:
    print(f"mpicd: {err}", file=sys.stderr)
    sys.exit(2)
PY
}

launch() {
  local launcher cmd rc out tee_pid seen started status handed=
  # the command line from mpicd.mpi.launch (MPICD_LAUNCHER, MPICD_SRUN_ARGS, MPICD_MPIRUN_ARGS), with
  # no --oversubscribe: inside an allocation its slots are the limit
  mapfile -t cmd < <(python -m mpicd.mpi.launch --no-oversubscribe --srun-all-tasks ${MPICD_NTASKS:+-n "$MPICD_NTASKS"} \
                       -x MPICD_EXIT_STATUS_FILE -x MPICD_EXIT_STATUS_HOST)
  [ ${#cmd[@]} -gt 0 ] || return 2  # mpicd.mpi.launch has said why
  launcher=$([ "${cmd[0]}" = srun ] && echo srun || echo mpirun)
  local a
  for a in "$@"; do
    if [ "$a" = --overwrite ] && [ ${#resume[@]} -gt 0 ]; then
      echo "mpicd: --overwrite: the batch scripts always pass --resume (a requeued job must continue, not" \
           "start again); to replace a results file, delete it and its .ckpt folder before submitting" >&2
      return 2
    fi
  done
  echo "mpicd: launching ${cmd[*]} python -m mpicd $*"
  seen=$(mktemp "${TMPDIR:-/tmp}/mpicd-launch.XXXXXX")
  status=$(mktemp "${TMPDIR:-/tmp}/mpicd-status.XXXXXX")  # the ranks' agreed status, if they hand it over
  # tee ignores the signals that scancel and the forwarding below send, so the launcher never
  # writes into a closed pipe; it ends when the launcher's output does
  exec {out}> >(trap '' INT TERM USR1 HUP; exec tee -a "$seen")
  tee_pid=$!
  MPICD_EXIT_STATUS_FILE=$status MPICD_EXIT_STATUS_HOST=$(uname -n) "${cmd[@]}" python -m mpicd "$@" >&"$out" {out}>&- &
  _mpicd_pid=$! _mpicd_signalled=0 _mpicd_interrupted=0 _mpicd_usr1=0
  exec {out}>&-
  trap '_mpicd_forward USR1' USR1
  trap '_mpicd_forward TERM' TERM INT
  while :; do
    wait "$_mpicd_pid" && rc=0 || rc=$?
    if [ "$_mpicd_signalled" = 1 ] && [ "$rc" -gt 128 ]; then _mpicd_signalled=0; continue; fi  # wait was cut short
    break
  done
  trap - USR1 TERM INT
  read -r handed < "$status" || true
  rm -f "$status"
  if [ "$rc" = 0 ] && [[ "$handed" =~ ^[0-9]+$ ]]; then rc=$handed; fi  # the ranks exited 0 after handing it over
  for _ in {1..100}; do kill -0 "$tee_pid" 2>/dev/null || break; sleep 0.1; done  # tee has passed it all on
  started=no stopped=no
  if grep -qE 'mpicd: rank [0-9]+ on |mpicd pack: [0-9]+ runs in ' "$seen"; then started=yes; fi
  # Every rank has checkpointed and closed the file (a barrier) before rank 0 prints this line and
  # the ranks exit (0 with the status handed over, else 75); where they exit 75, srun
  # --kill-on-bad-exit may still end the slower ranks once the first one has exited (srun then
  # returns 143, not 75): after a USR1 the line is what says "stopped".
  if grep -q 'mpicd: stopped on request after round' "$seen"; then stopped=yes; fi
  rm -f "$seen"
  if [ "$rc" = "$MPICD_STOPPED" ] || { [ "$stopped" = yes ] && [ "$_mpicd_usr1" = 1 ] && [ "$_mpicd_interrupted" = 0 ]; }; then
    rc=$MPICD_STOPPED
    if [ -n "${SLURM_JOB_ID:-}" ]; then
      echo "mpicd: the ranks checkpointed and stopped; requeueing job $SLURM_JOB_ID to resume" >&2
      _mpicd_requeue "$SLURM_JOB_ID" || return "$rc"
    else
      echo "mpicd: the ranks checkpointed and stopped; run the same command again to resume" >&2
    fi
  elif [ "$rc" = "$MPICD_INTERRUPTED" ] || { [ "$_mpicd_interrupted" = 1 ] && [ "$rc" != 0 ] && [ "$started" = yes ]; }; then
    echo "mpicd: interrupted (SIGINT/SIGTERM): the ranks stopped after a round, checkpointed; run or submit" \
         "the same command again to resume (not requeued: an interrupt means stop)" >&2
  elif [ "$rc" != 0 ] && [ "$rc" != 2 ] && [ "$started" = yes ]; then
    echo "mpicd: ${cmd[*]} exited with status $rc after the ranks had started: not a launch problem, but a" \
         "rank that failed or a node lost mid-run (the first error above says which: mpicd's \"rank R, round N" \
         "failed\", or the launcher's, e.g. srun's \"Node failure\"). The results file keeps the finished" \
         "rounds; the same job, run or submitted again, resumes from the newest checkpoint." >&2
  elif [ "$rc" != 0 ] && [ "$rc" != 2 ] && [ "$launcher" = mpirun ]; then
    echo "mpicd: ${cmd[*]} exited with status $rc. If the ranks did not start, try MPICD_MPIRUN_ARGS" \
         "(e.g. --oversubscribe, or --bind-to none), or, inside Slurm, srun: MPICD_LAUNCHER=srun." >&2
  elif [ "$rc" != 0 ] && [ "$rc" != 2 ]; then
    echo "mpicd: ${cmd[*]} exited with status $rc. If the ranks did not start (\"OMPI was not built with" \
         "SLURM's PMI support\", PMI or PMIx errors), try MPICD_SRUN_ARGS=\"--mpi=pmix --kill-on-bad-exit=1\"" \
         "or \"--mpi=pmi2 --kill-on-bad-exit=1\" (srun --mpi=list shows what this Slurm has; the MPI library" \
         "must support it too), or Open MPI's mpirun inside the allocation: MPICD_LAUNCHER=mpirun." >&2
  fi
  return "$rc"
}

_mpicd_requeue() {  # a busy slurmctld may time out a request: try again before giving up
  local try
  for try in 1 2 3 4 5; do
    if scontrol requeue "$1"; then return 0; fi
    echo "mpicd: scontrol requeue $1 failed (try $try of 5); trying again in $((try * 2)) s" >&2
    sleep $((try * 2))
  done
  echo "mpicd: could not requeue job $1: the checkpoint is kept; submit the same job again to resume" >&2
  return 1
}

_mpicd_forward() {
  _mpicd_signalled=1
  if [ "$1" = USR1 ]; then _mpicd_usr1=1; else _mpicd_interrupted=1; fi
  echo "mpicd: SIG$1 received, passing it to the ranks" >&2
  kill "-$1" "$_mpicd_pid" 2>/dev/null || true
}
