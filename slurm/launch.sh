# Sourced by the batch scripts: the project's venv on PATH and `launch`, one task per client.
if [ -f .venv/bin/activate ]; then source .venv/bin/activate; fi
export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-1}
launch() {
  if [ "${MPICD_LAUNCHER:-srun}" = mpirun ]; then
    mpirun -n "${SLURM_NTASKS:?}" "$@"
  else
    srun ${MPICD_SRUN_ARGS:-} "$@"
  fi
}
