"""Run under mpiexec -n 2: with privacy on, no unclipped or un-noised value crosses MPI
(tests/test_privacy_wiring.py). argv: OUT_DIR.

For each algorithm with a private path, one round (``mpicd.loop.run``) four times on a
:class:`Recorder` communicator (every buffer sent point to point or reduced is kept):
privacy off; exact releases (sigma 0, clip 1e9: the unclipped sums, q 1, public counts); clipped
exact releases (sigma 0, clip 0.05); the private run (sigma 1, clip 0.05). Round 0 starts from
the same model in all four, so the algorithm's float32 payloads line up one to one. Per rank,
``OUT/rank<r>.json``: per algorithm, how many coordinates of the private payloads equal the
exact or the clipped ones (must be 0), and the positive control (the exact run sent exact values).
"""

import json
import sys
from pathlib import Path

import numpy as np
from mpi4py import MPI

from mpicd.comm import Comm
from mpicd.config import load_config
from mpicd.loop import run
from mpicd.plan import prepare
from mpicd.runtime import abort_on_exception, place


class Recorder(MPI.Intracomm):
    """A handle of MPI.COMM_WORLD that keeps a copy of every buffer sent point to point or reduced
    (tests/drivers/payloads.py has the full one; that module runs its job when imported)."""

    def __init__(self, comm: MPI.Intracomm):
        super().__init__()
        self.sent = []

    def Isend(self, buf, dest, tag):
        self.sent.append(("Isend", buf[0].copy()))
        return super().Isend(buf, dest=dest, tag=tag)

    def Allreduce(self, sendbuf, recvbuf, op):
        self.sent.append(("Allreduce", sendbuf[0].copy()))
        super().Allreduce(sendbuf, recvbuf, op=op)


ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "quickstart.yaml"
world = MPI.COMM_WORLD
out = Path(sys.argv[1])
ALGORITHMS = {
    "codistill": "{name: codistill}",
    "codistill_logits": "{name: codistill, share: logits}",
    "fedproto": "{name: fedproto}",
    "feddistill": "{name: feddistill}",
}
PRIVACY = {
    "off": None,
    "exact": "{noise_multiplier: 0, clip: 1.0e9, sample_rate: 1, counts: public}",
    "clipped": "{noise_multiplier: 0, clip: 0.05, sample_rate: 1, counts: public}",
    "private": "{noise_multiplier: 1, clip: 0.05, sample_rate: 1}",
}


def payloads(label: str, algorithm: str, privacy: str | None, placement):
    overrides = [f"clients={world.Get_size()}", "rounds=1", "device=cpu", f"algorithm={algorithm}"]
    if privacy is not None:
        overrides.append(f"privacy={privacy}")
    plan = prepare(load_config(CONFIG, overrides))
    recorder = Recorder(world)
    run(plan, Comm(recorder), placement, out / f"{label}.h5", log=lambda line: None)
    sent = [a for op, a in recorder.sent if op in ("Isend", "Allreduce") and a.dtype == np.float32]
    return sent, plan


with abort_on_exception(world):
    placement = place(world, "cpu")
    report = {}
    for label, algorithm in ALGORITHMS.items():
        runs = {name: payloads(f"{label}_{name}", algorithm, p, placement) for name, p in PRIVACY.items()}
        private = runs["private"][0]
        found = {"buffers": len(private), "equal_to_exact": 0, "equal_to_clipped": 0}
        for name in ("exact", "clipped"):
            theirs = runs[name][0]
            assert len(theirs) == len(private), (label, name, len(theirs), len(private))
            found[f"equal_to_{name}"] = int(sum(np.sum(a == b) for a, b in zip(private, theirs)))
        exact, plan = runs["exact"]
        if label.startswith("codistill"):  # the default path's R is the exact mean: close to it
            control = all(np.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(exact, runs["off"][0]))
        else:  # the exact release's counts are this rank's exact class counts
            counts = plan.partition.train_counts[world.Get_rank()]
            control = all(np.array_equal(a[-len(counts) :], counts) for a in exact)
        found["control"] = bool(control) and len(exact) > 0
        report[label] = found
    (out / f"rank{world.Get_rank()}.json").write_text(json.dumps(report))
