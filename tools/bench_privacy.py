"""Seconds per round with privacy on against off, measured in one MPI job.

    mpiexec -n 2 .venv/bin/python tools/bench_privacy.py OUT_DIR [ROUNDS] [override ...]

Runs the round loop (``mpicd.run.loop.run_rounds``, as ``mpicd run``) of co-distillation and FedAvg on
configs/pneumoniamnist.yaml, each without and with a ``privacy`` section (co-distillation: the
noise derived from epsilon 4 at q 0.5; FedAvg: DP-SGD at sigma 1), the private ones twice: with
secret noise (the default: SHAKE-256 of each client's key, mpicd.privacy.secret) and with
``privacy.noise: seeded`` (numpy's generator from the seed, not private), in the same job, and
prints per variant the mean over rounds 2..ROUNDS (round 1 holds dp-accounting's import) of the
round's seconds (the slowest rank's compute + comm, from the results file), and the ratios on / off
and secret / seeded (what the secret stream costs).
"""

import sys
from pathlib import Path

import numpy as np
from mpi4py import MPI

from mpicd.config.loading import load_config
from mpicd.mpi.comm import Comm
from mpicd.mpi.placement import abort_on_exception, place
from mpicd.privacy import accountant
from mpicd.results.reader import Results
from mpicd.run.loop import run_rounds
from mpicd.run.plan import prepare

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "pneumoniamnist.yaml"
world = MPI.COMM_WORLD
out = Path(sys.argv[1])
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 6
extra = sys.argv[3:]
VARIANTS = {
    ("codistill", "off"): ["algorithm=codistill"],
    ("codistill", "on"): ["algorithm=codistill", "privacy={epsilon: 4, sample_rate: 0.5}"],
    ("fedavg", "off"): ["algorithm=fedavg"],
    ("fedavg", "on"): ["algorithm=fedavg", "privacy={noise_multiplier: 1.0}"],
    ("codistill", "seeded"): ["algorithm=codistill", "privacy={epsilon: 4, sample_rate: 0.5, noise: seeded}"],
    ("fedavg", "seeded"): ["algorithm=fedavg", "privacy={noise_multiplier: 1.0, noise: seeded}"],
}

with abort_on_exception(world):
    placement = place(world, "cpu")
    seconds = {}
    for (algorithm, privacy), overrides in VARIANTS.items():
        common = [f"clients={world.Get_size()}", f"rounds={rounds}", "device=cpu", "checkpoint.every=0", *extra]
        plan = prepare(load_config(CONFIG, [*common, *overrides]))
        accountant.clear_cache()  # no variant reuses the PLDs and epsilons another computed
        path = out / f"{algorithm}_{privacy}.h5"
        run_rounds(plan, Comm(world), placement, path, log=lambda line: None, overwrite=True)
        world.Barrier()
        res = Results(path)
        per_round = (res.metrics["compute_seconds"] + res.metrics["comm_seconds"]).max(axis=1)
        seconds[algorithm, privacy] = float(np.mean(per_round[1:]))
    if world.Get_rank() == 0:
        print(f"{world.Get_size()} ranks, {rounds} rounds, {' '.join(extra) or 'configs/pneumoniamnist.yaml'}")
        print("| algorithm | s/round off | s/round on (secret) | on / off | s/round seeded | secret / seeded |")
        print("| --- | --- | --- | --- | --- | --- |")
        for algorithm in ("codistill", "fedavg"):
            off, on, seeded = (seconds[algorithm, v] for v in ("off", "on", "seeded"))
            print(f"| {algorithm} | {off:.3f} | {on:.3f} | {on / off:.2f} | {seeded:.3f} | {on / seeded:.2f} |")
