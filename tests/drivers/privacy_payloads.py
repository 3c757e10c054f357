"""Run under mpiexec -n 2: with privacy on, no unclipped or un-noised value crosses MPI
(tests/privacy/test_privacy_wiring.py). argv: OUT_DIR.

For each algorithm with a private path, one round (``mpicd.run.loop.run_rounds``) four times on a
:class:`Recorder` communicator (every buffer sent point to point or reduced is kept):
privacy off; exact releases (sigma 0, clip 1e9: the unclipped sums, q 1, public counts); clipped
exact releases (sigma 0, clip 0.05); the private run (sigma 1, clip 0.05). Round 0 starts from
the same model in all four, so the algorithm's float32 payloads line up one to one. Per rank,
``OUT/rank<r>.json``: per algorithm, how many coordinates of the private payloads equal the
exact or the clipped ones (must be 0), and the positive control (the exact run sent exact values).

Exact sizes (zero-out adjacency: a client's class sizes n_c differ between neighbours):
for every method with a private path, DP-SGD's FedAvg and FedAMP included, ``exact_sizes`` counts
the coordinates of its private run's payload buffers (the ``payload`` channel) equal to one of the
client's class sizes n_c (q = 1: every image is in the sample, so n_c is also the exact sample
size of class c); it must be 0. The exact run's count (``counts: public`` at sigma 0) is the control.
"""

import json
import sys
from pathlib import Path

import numpy as np
from mpi4py import MPI

from mpicd.config.loading import load_config
from mpicd.mpi.comm import Comm
from mpicd.mpi.placement import abort_on_exception, place
from mpicd.run.loop import run_rounds
from mpicd.run.plan import prepare


class Recorder(MPI.Intracomm):
    """A handle of MPI.COMM_WORLD that keeps a copy of every buffer sent point to point or reduced
    (tests/drivers/payloads.py has the full one; that module runs its job when imported)."""

    def __init__(self, comm: MPI.Intracomm):
        super().__init__()
        self.sent = []
        self.comm = None  # the mpicd Comm on top: its ``channel`` names each buffer's

    def Isend(self, buf, dest, tag):
        self.sent.append(("Isend", buf[0].copy(), self.comm.channel))
        return super().Isend(buf, dest=dest, tag=tag)

    def Allreduce(self, sendbuf, recvbuf, op):
        self.sent.append(("Allreduce", sendbuf[0].copy(), self.comm.channel))
        super().Allreduce(sendbuf, recvbuf, op=op)

    def Allgather(self, sendbuf, recvbuf):
        self.sent.append(("Allgather", sendbuf[0].copy(), self.comm.channel))
        super().Allgather(sendbuf, recvbuf)


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
DPSGD = {  # model sharing: DP-SGD on the local training (one mini-batch of the defaults' size per step)
    "fedavg": "{name: fedavg}",
    "fedamp": "{name: fedamp}",
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
    comm = recorder.comm = Comm(recorder)
    run_rounds(plan, comm, placement, out / f"{label}.h5", log=lambda line: None)
    sent = [a for op, a, channel in recorder.sent if channel == "payload"]
    assert all(a.dtype == np.float32 for a in sent), label
    return sent, plan


def exact_sizes(sent: list, plan) -> int:
    """Coordinates of the payload buffers equal to one of this rank's client's class sizes n_c."""
    sizes = plan.partition.train_counts[world.Get_rank()].astype(np.float32)
    return int(sum(np.isin(a, sizes).sum() for a in sent))


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
        found["exact_sizes"] = exact_sizes(private, runs["private"][1])
        found["exact_sizes_control"] = exact_sizes(exact, plan)
        report[label] = found
    for label, algorithm in DPSGD.items():
        private, plan = payloads(
            f"{label}_dpsgd", algorithm, "{noise_multiplier: 1, clip: 0.05, sample_rate: 1}", placement
        )
        report[f"{label}_dpsgd"] = {"buffers": len(private), "exact_sizes": exact_sizes(private, plan)}
    (out / f"rank{world.Get_rank()}.json").write_text(json.dumps(report))
