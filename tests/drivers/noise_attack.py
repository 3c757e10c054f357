"""Run under mpiexec -n 2: what a student receives from its teacher in round 0 of a private
co-distillation run, and (the oracle, recorded on the teacher's rank only for the test) the
clipped sum the teacher's noise hides (tests/privacy/test_privacy_attack.py). argv: OUT_DIR.

Per privacy.noise (secret, seeded): one round (``mpicd.run.loop.run_rounds``) on a communicator that keeps
every float32 buffer sent point to point; ``OUT/<noise>.h5`` the results file, and per rank
``OUT/<noise>_rank<r>.json``: the R it sent (what its student received) and the clipped sum of the
rows its release summed (``gaussian_sum``'s input, clipped here by the L2 formula).
"""

import json
import sys
from pathlib import Path

import numpy as np
from mpi4py import MPI

import mpicd.algorithms.codistill as codistill
from mpicd.config.loading import load_config
from mpicd.mpi.comm import Comm
from mpicd.mpi.placement import abort_on_exception, place
from mpicd.run.loop import run_rounds
from mpicd.run.plan import prepare

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "quickstart.yaml"
PRIVACY = "{{noise_multiplier: 4, clip: 0.5, sample_rate: 0.5, counts: noised, noise: {noise}}}"
world = MPI.COMM_WORLD
out = Path(sys.argv[1])


class Recorder(MPI.Intracomm):
    def __init__(self, comm: MPI.Intracomm):
        super().__init__()
        self.sent = []

    def Isend(self, buf, dest, tag):
        self.sent.append(buf[0].copy())
        return super().Isend(buf, dest=dest, tag=tag)


oracle = []
released = codistill.gaussian_sum


def recording_sum(rows, *, clip, sigma, generator):
    rows = np.asarray(rows, dtype=np.float64)
    norms = np.linalg.norm(rows, axis=1)
    oracle.append((rows * np.minimum(1.0, clip / np.maximum(norms, 1e-300))[:, None]).sum(axis=0))
    return released(rows, clip=clip, sigma=sigma, generator=generator)


codistill.gaussian_sum = recording_sum
with abort_on_exception(world):
    placement = place(world, "cpu")
    for noise in ("secret", "seeded"):
        oracle.clear()
        overrides = ["clients=2", "rounds=1", "device=cpu", "privacy=" + PRIVACY.format(noise=noise)]
        plan = prepare(load_config(CONFIG, overrides))
        recorder = Recorder(world)
        run_rounds(plan, Comm(recorder), placement, out / f"{noise}.h5", log=lambda line: None)
        width = plan.config.model.feature_dim
        sent = [a for a in recorder.sent if a.dtype == np.float32 and a.size == width]
        assert len(sent) == 1 and len(oracle) == 1, (len(sent), len(oracle))
        record = {"sent": sent[0].reshape(-1).tolist(), "clipped_sum": oracle[0].tolist()}
        (out / f"{noise}_rank{world.Get_rank()}.json").write_text(json.dumps(record))
