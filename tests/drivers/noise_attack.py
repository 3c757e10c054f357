"""Run under mpiexec -n 2: what a peer receives from the other client in round 0 of private
co-distillation runs, and (the oracle, recorded on each rank only for the tests) the clipped sum the
teacher's noise hides and the client's exact training loss (tests/privacy/test_privacy_attack.py).
argv: OUT_DIR.

Runs, one round each (``mpicd.run.loop.run_rounds``) on a communicator that keeps every float32
buffer sent point to point and every buffer the writer gathers:

* ``secret``, ``seeded``: privacy.noise each way;
* ``shared0``, ``shared1``: secret noise, seeds 0 and 1, one ``privacy.key_dir`` for both (a site's
  key folder used by two runs);
* ``repeat``: seed 1 again with that key folder and ``privacy.nonce`` naming shared0's nonce (the
  site asks to repeat shared0's noise: the attack's positive control);
* ``plain``: no privacy (the control of the training-metric search).

``OUT/<run>.h5`` the results file, and per rank ``OUT/<run>_rank<r>.json``: the R it sent (what its
student received), the clipped sum of the rows its release summed (``gaussian_sum``'s input,
clipped here by the L2 formula), its training losses (total, ce, extra) and, on rank 0, every
float64 value the results gather brought it.
"""

import json
import sys
from pathlib import Path

import h5py
import numpy as np
from mpi4py import MPI

import mpicd.algorithms.codistill as codistill
from mpicd.config.loading import load_config
from mpicd.mpi.comm import Comm
from mpicd.mpi.placement import abort_on_exception, place
from mpicd.run import client as client_module
from mpicd.run.loop import run_rounds
from mpicd.run.plan import prepare

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "quickstart.yaml"
PRIVACY = "{{noise_multiplier: 4, clip: 0.5, sample_rate: 0.5, counts: noised, {extra}}}"
world = MPI.COMM_WORLD
out = Path(sys.argv[1])


class Recorder(MPI.Intracomm):
    def __init__(self, comm: MPI.Intracomm):
        super().__init__()
        self.sent = []

        self.gathered = []

    def Isend(self, buf, dest, tag):
        self.sent.append(buf[0].copy())
        return super().Isend(buf, dest=dest, tag=tag)

    def Gather(self, sendbuf, recvbuf, root=0):
        done = super().Gather(sendbuf, recvbuf, root=root)
        if recvbuf is not None:
            self.gathered.append(np.array(recvbuf[0], copy=True).reshape(-1))
        return done


oracle = []
released = codistill.gaussian_sum


def recording_sum(rows, *, clip, sigma, generator):
    rows = np.asarray(rows, dtype=np.float64)
    norms = np.linalg.norm(rows, axis=1)
    oracle.append((rows * np.minimum(1.0, clip / np.maximum(norms, 1e-300))[:, None]).sum(axis=0))
    return released(rows, clip=clip, sigma=sigma, generator=generator)


codistill.gaussian_sum = recording_sum
losses = []
trained = client_module.Client.train_round


def recording_round(self, *args, **kwargs):
    loss = trained(self, *args, **kwargs)
    losses.append([loss.total, loss.ce, loss.extra])
    return loss


client_module.Client.train_round = recording_round


def nonce_of(path: Path) -> str:
    with h5py.File(path, "r") as f:
        return f.attrs["privacy_nonce"]


with abort_on_exception(world):
    placement = place(world, "cpu")
    keys = out / "site-keys"
    runs = [
        ("secret", "0", PRIVACY.format(extra="noise: secret")),
        ("seeded", "0", PRIVACY.format(extra="noise: seeded")),
        ("shared0", "0", PRIVACY.format(extra=f"key_dir: {keys}")),
        ("shared1", "1", PRIVACY.format(extra=f"key_dir: {keys}")),
        ("repeat", "1", None),  # the nonce of shared0, once it is written
        ("plain", "0", None),
    ]
    for name, seed, privacy in runs:
        oracle.clear()
        losses.clear()
        if name == "repeat":
            privacy = PRIVACY.format(extra=f"key_dir: {keys}, nonce: '{nonce_of(out / 'shared0.h5')}'")
        overrides = ["clients=2", "rounds=1", "device=cpu", f"seed={seed}"]
        plan = prepare(load_config(CONFIG, overrides + ([f"privacy={privacy}"] if privacy else [])))
        recorder = Recorder(world)
        run_rounds(plan, Comm(recorder), placement, out / f"{name}.h5", log=lambda line: None)
        width = plan.config.model.feature_dim
        sent = [a for a in recorder.sent if a.dtype == np.float32 and a.size == width]
        record = {"losses": losses, "gathered": [v for g in recorder.gathered for v in g.tolist()]}
        if privacy:
            assert len(sent) == 1 and len(oracle) == 1, (len(sent), len(oracle))
            record.update(sent=sent[0].reshape(-1).tolist(), clipped_sum=oracle[0].tolist())
        (out / f"{name}_rank{world.Get_rank()}.json").write_text(json.dumps(record))
