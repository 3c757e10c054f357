"""Run under mpiexec: what leaves a rank, for tests/algorithms/test_payloads.py, in one MPI job (each start
costs ~10 s on a small box). argv: OUT_DIR PNEUMONIA_NPZ.

1. ``bytes``: ``mpicd run`` (the CLI entry point, in this process) of every algorithm and every
   option that changes what is sent, BYTE_ROUNDS rounds on PneumoniaMNIST: ``OUT/bytes_<label>.h5``.
2. ``pixels``: the round loop (``mpicd.run.loop.run_rounds``, as ``mpicd run`` calls it) of the same variants for
   PIXEL_ROUNDS rounds with every image (train, val and test) repainted pixel by pixel from
   DISTINCTIVE, on a :class:`Comm` whose MPI communicator is a :class:`Recorder`: every buffer handed
   to Isend, Irecv, Allreduce, Allgather, Gather or Bcast is kept with the channel the Comm named for
   it (mpicd.mpi.channels) and finally searched for the bytes of each distinctive value as float32 and as
   float64, at any offset. Then the same for deliberately leaky algorithms (LEAKS), which must be
   caught: found by the search, or refused by the comm layer before anything was sent (a dtype or
   operation their payload channel does not declare). Per rank: ``OUT/pixels_rank<r>.json``.

DISTINCTIVE lie in [128, 256) and are not integers: with 20 + 8 images per client no legitimate
payload reaches that range (lenet features are tanh-bounded, so prototypes, logits and FedAvg's
n_i * theta_i stay far below it; counts and byte totals are integers), so a hit means a pixel went out.
"""

import json
import sys
from pathlib import Path

import numpy as np
from mpi4py import MPI

from mpicd.algorithms import REGISTRY
from mpicd.algorithms.codistill import CoDistillation
from mpicd.algorithms.fedavg import FedAvg
from mpicd.algorithms.fedproto import FedProto
from mpicd.cli import main
from mpicd.config.loading import load_config
from mpicd.config.text import inline
from mpicd.mpi.accounting import KINDS
from mpicd.mpi.channels import CHANNELS
from mpicd.mpi.comm import Comm, ProtocolError
from mpicd.mpi.placement import abort_on_exception, place
from mpicd.run.loop import run_rounds
from mpicd.run.plan import prepare

from driver_settings import PAYLOAD_VARIANTS

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "pneumoniamnist.yaml"
BYTE_ROUNDS = 3
PIXEL_ROUNDS = 2
VARIANTS = {label: inline(section) for label, section in PAYLOAD_VARIANTS.items()}
DISTINCTIVE = np.array(
    [128 * (1 + f) for f in (2**0.5 - 1, np.pi - 3, np.e - 2, (5**0.5 - 1) / 2)]
    + [-128 * (1 + f) for f in (3**0.5 - 1, np.log(2), 0.1234567, 0.7654321)],
    dtype=np.float32,
)
# sends -> ledger kind (a Gather to the writer counts under allgather's, mpicd.mpi.comm)
RECORDED = {"Isend": "p2p", "Allreduce": "allreduce", "Allgather": "allgather", "Gather": "allgather", "Bcast": "bcast"}

world = MPI.COMM_WORLD
out = Path(sys.argv[1])
data = sys.argv[2]
common = [f"clients={world.Get_size()}", f"data.path={data}", "data.images_per_class=20", "device=cpu"]


class Recorder(MPI.Intracomm):
    """A handle of MPI.COMM_WORLD (the same communicator: h5py's collective writer takes it) that
    keeps every buffer crossing it: a sent one copied at the call, a received one once filled (an
    Irecv's only after the run, its Waitall long done; what it held is also some rank's send).
    Every other public attribute used is named in ``other``, so the test can insist that nothing
    else carried data (a pickling ``allgather``, a ``Send``, ...)."""

    def __init__(self, comm: MPI.Intracomm):
        super().__init__()
        self.sent, self.received, self.other = [], [], set()
        self.comm = None  # the mpicd Comm on top, once made: the channel of each buffer is its ``channel``

    def __getattribute__(self, name):
        if not name.startswith("_") and name not in ("sent", "received", "other", "comm", *RECORDED, "Irecv"):
            object.__getattribute__(self, "other").add(name)
        return super().__getattribute__(name)

    def _channel(self):
        return None if self.comm is None else self.comm.channel

    def Isend(self, buf, dest, tag):
        self.sent.append(("Isend", buf[0].copy(), self._channel()))
        return super().Isend(buf, dest=dest, tag=tag)

    def Irecv(self, buf, source, tag):
        self.received.append(("Irecv", buf[0], self._channel()))
        return super().Irecv(buf, source=source, tag=tag)

    def Allreduce(self, sendbuf, recvbuf, op):
        self.sent.append(("Allreduce", sendbuf[0].copy(), self._channel()))
        super().Allreduce(sendbuf, recvbuf, op=op)
        self.received.append(("Allreduce", recvbuf[0].copy(), self._channel()))

    def Allgather(self, sendbuf, recvbuf):
        self.sent.append(("Allgather", sendbuf[0].copy(), self._channel()))
        super().Allgather(sendbuf, recvbuf)
        self.received.append(("Allgather", recvbuf[0].copy(), self._channel()))

    def Gather(self, sendbuf, recvbuf, root=0):
        self.sent.append(("Gather", sendbuf[0].copy(), self._channel()))
        super().Gather(sendbuf, recvbuf, root=root)
        if recvbuf is not None:
            self.received.append(("Gather", recvbuf[0].copy(), self._channel()))

    def Bcast(self, buf, root=0):
        root_here = super().Get_rank() == root
        if root_here:
            self.sent.append(("Bcast", buf[0].copy(), self._channel()))
        super().Bcast(buf, root=root)
        if not root_here:
            self.received.append(("Bcast", buf[0].copy(), self._channel()))


def findings(buffers: list, values: np.ndarray) -> list[str]:
    """Where a value's float32 or float64 bytes occur in a buffer (any offset, any dtype)."""
    patterns = [(float(v), dtype, np.array(v, dtype=dtype).tobytes()) for v in values for dtype in ("f4", "f8")]
    hits = []
    for op, array, _ in buffers:
        raw = np.ascontiguousarray(array).tobytes()
        hits += [
            f"{op} {array.dtype}{array.shape} holds {value!r} as {dtype}"
            for value, dtype, pattern in patterns
            if raw.find(pattern) >= 0
        ]
    return hits


class LeakImage(FedAvg):
    """FedAvg that also Allgathers its first training image on its payload channel: must be caught
    (FedAvg's payload declares an Allreduce only)."""

    name = "leak_image"

    def after_epoch(self, round_index: int) -> None:
        super().after_epoch(round_index)
        self.ctx.comm.allgather(np.ascontiguousarray(self.ctx.train_x[0].cpu().numpy().ravel()), channel="payload")


class LeakPixelP2P(CoDistillation):
    """Co-distillation whose R carries one pixel in place of its first coordinate: must be caught."""

    name = "leak_pixel_p2p"

    def class_means(self, round_index: int) -> np.ndarray:
        means = super().class_means(round_index)
        means[0, 0] = self.ctx.train_x[0].flatten()[100]
        return means


class LeakPixelFloat64(FedProto):
    """FedProto that also Allreduces one pixel, widened to float64, among zeros, on its payload
    channel: a protocol buffer of another dtype carrying a raw value, must be caught (FedProto's
    payload declares float32)."""

    name = "leak_pixel_float64"

    def after_epoch(self, round_index: int) -> None:
        super().after_epoch(round_index)
        vector = np.zeros(8)
        vector[3] = float(self.ctx.train_x[0].flatten()[200])
        self.ctx.comm.allreduce_sum(vector, channel="payload")


LEAKS = {cls.name: f"{{name: {cls.name}}}" for cls in (LeakImage, LeakPixelP2P, LeakPixelFloat64)}


def repaint(plan) -> None:
    """Every pixel of every split replaced by one of DISTINCTIVE, a pattern of its own per image."""
    rng = np.random.default_rng(20240611)
    for split in (plan.dataset.train, plan.dataset.val, plan.dataset.test):
        split.x[...] = DISTINCTIVE[rng.integers(0, len(DISTINCTIVE), size=split.x.shape)]


def pixels(label: str, algorithm: str, placement) -> dict:
    plan = prepare(load_config(CONFIG, [*common, f"rounds={PIXEL_ROUNDS}", f"algorithm={algorithm}"]))
    repaint(plan)
    trained = plan.dataset.train.x[plan.partition.train_indices[world.Get_rank()]]
    assert np.isin(trained, DISTINCTIVE).all()
    recorder = Recorder(world)
    comm = recorder.comm = Comm(recorder)
    rows, end_round = [], comm.ledger.end_round
    comm.ledger.end_round = lambda: rows.append(end_round()) or rows[-1]  # keep every round's row
    try:
        run_rounds(plan, comm, placement, out / f"pixels_{label}.h5", log=lambda line: None)
    except ProtocolError as err:  # every rank refuses the same buffer, before sending it
        return {"refused": str(err), "findings": findings(recorder.sent + recorder.received, DISTINCTIVE)}
    counted = {
        kind: comm.ledger.outside_rounds.bytes_sent[kind] + sum(row.bytes_sent[kind] for row in rows) for kind in KINDS
    }
    seen = dict.fromkeys(KINDS, 0)
    for op, array, _ in recorder.sent:
        seen[RECORDED[op]] += array.nbytes
    audit = {}  # channel -> [class, buffers, bytes sent, dtypes]: every buffer that crossed, by channel
    for _, array, channel in recorder.sent + recorder.received:
        entry = audit.setdefault(
            str(channel), [CHANNELS[channel].cls if channel in CHANNELS else "undeclared", 0, 0, []]
        )
        entry[1] += 1
        if array.dtype.name not in entry[3]:
            entry[3].append(array.dtype.name)
    for _, array, channel in recorder.sent:
        audit[str(channel)][2] += array.nbytes
    return {
        "refused": None,
        "audit": audit,
        "ledger_channels": comm.ledger.channels,
        "findings": findings(recorder.sent + recorder.received, DISTINCTIVE),
        "buffers": len(recorder.sent) + len(recorder.received),
        "recorded_sent": seen,
        "ledger_sent": counted,
        "other": sorted(recorder.other),
        "rounds_sent": {kind: sum(row.bytes_sent[kind] for row in rows) for kind in KINDS},
    }


with abort_on_exception(world):
    for label, algorithm in VARIANTS.items():
        code = main(
            [
                "run",
                str(CONFIG),
                *common,
                f"rounds={BYTE_ROUNDS}",
                f"algorithm={algorithm}",
                "--out",
                str(out / f"bytes_{label}.h5"),
            ]
        )
        if code != 0:
            raise RuntimeError(f"mpicd run {label} exited with {code}")
    placement = place(world, "cpu")
    for cls in (LeakImage, LeakPixelP2P, LeakPixelFloat64):
        REGISTRY[cls.name] = cls
    report = {label: pixels(label, algorithm, placement) for label, algorithm in {**VARIANTS, **LEAKS}.items()}
    (out / f"pixels_rank{world.Get_rank()}.json").write_text(json.dumps(report, indent=1))
    world.Barrier()
    if world.Get_rank() == 0:
        print("payloads driver done", flush=True)
