"""Run under mpiexec: ``mpicd run`` (in this process) recording every random stream it creates.
argv: CONFIG OUT_DIR.

Wraps mpicd.core.seeds.rng / torch_seed / seed_sequence (every call site looks them up on the module)
and numpy's SeedSequence (streams made outside mpicd.core.seeds). Co-distillation with a teacher per
minibatch and an integer k, two local epochs, so every kind of stream is drawn. Writes
OUT_DIR/rank<r>.json: one record per call, with the generator state (numpy) or seed (torch) it got.
"""

import json
import sys
from pathlib import Path

import numpy as np

from mpicd.cli import main
from mpicd.core import seeds
from mpicd.mpi.comm import Comm
from mpicd.mpi.placement import abort_on_exception

ORIGINAL = {name: getattr(seeds, name) for name in ("rng", "torch_seed", "seed_sequence")}
NumpySeedSequence = np.random.SeedSequence
records: list[dict] = []
depth = [0]


def pcg_state(ss) -> list[int]:
    s = np.random.Generator(np.random.PCG64(ss)).bit_generator.state["state"]
    return [s["state"], s["inc"]]


def wrap(name: str):
    def recorded(seed, purpose, *key):
        depth[0] += 1
        try:
            out = ORIGINAL[name](seed, purpose, *key)
        finally:
            depth[0] -= 1
        if depth[0] == 0:
            if name == "torch_seed":
                kind, value = "torch", out
            else:
                kind = "rng"
                value = pcg_state(out.bit_generator.seed_seq if name == "rng" else out)
            records.append(
                {"kind": kind, "seed": int(seed), "purpose": int(purpose), "key": [int(k) for k in key], "state": value}
            )
        return out

    return recorded


class RecordingSeedSequence(NumpySeedSequence):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if depth[0] == 0:
            entropy = self.entropy
            entropy = [int(e) for e in entropy] if isinstance(entropy, (list, tuple, np.ndarray)) else [int(entropy)]
            records.append({"kind": "foreign", "entropy": entropy, "state": pcg_state(self)})


for name in ORIGINAL:
    setattr(seeds, name, wrap(name))
np.random.SeedSequence = RecordingSeedSequence

comm = Comm()
out = Path(sys.argv[2])
with abort_on_exception(comm.mpi):
    code = main(
        [
            "run",
            sys.argv[1],
            f"clients={comm.size}",
            "rounds=3",
            "train.local_epochs=2",
            "algorithm={name: codistill, k: 5, teacher_per: batch}",
            "--out",
            str(out / "run.h5"),
        ]
    )
    if code != 0:
        raise RuntimeError(f"mpicd run exited with {code}")
    (out / f"rank{comm.rank}.json").write_text(json.dumps(records))
