"""Run under mpiexec -n R: the same 6-client experiment of every algorithm, one results file each
(argv: output folder, rounds, then config overrides for every run). One process per layout, so
that the layout tests pay MPI's and torch's start-up once per layout rather than once per run."""

import sys
from pathlib import Path

from mpicd.algorithms import REGISTRY
from mpicd.cli import main

# Every registered algorithm, co-distillation's Allgather variant (the default sends p2p), and
# four with half the clients taking part in each round.
# Those that sum their clients' contributions with reduction: exact (the same bits on every
# layout), and FedAvg also with today's float32 Allreduce (reduction: mpi).
SUMMING = ("fedavg", "fedproto", "feddistill", "fedlc", "fedrs", "fedntd", "fedrod", "ccvr")
VARIANTS = {
    name: [f"algorithm={{name: {name}" + (", reduction: exact}" if name in SUMMING else "}")] for name in REGISTRY
}
VARIANTS["codistill_all"] = ["algorithm={name: codistill, classes: all, share: logits}"]
for name in ("local", "fedavg", "codistill", "ccvr"):
    VARIANTS[f"{name}_half"] = [*VARIANTS[name], "participation=0.5"]
VARIANTS["fedavg_mpi"] = ["algorithm={name: fedavg, reduction: mpi}"]
# Methods that act only from three classes on (FedNTD is FedAvg on two), on RetinaMNIST's five grades
# (the official file; 10 training images of each grade per client, batches of 8 so that a round has
# several steps and FedNTD's term acts; the MLP on its pixels).
RETINA = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "retinamnist.npz"
FIVE_CLASSES = [
    "data={name: medmnist, path: " + str(RETINA) + ", images_per_class: 10, skew: 0.6}",
    "train.batch_size=8",
]
if RETINA.exists():
    for name in ("fedavg", "fedntd", "fedrod", "ccvr"):
        VARIANTS[f"{name}_5class"] = [*VARIANTS[name], *FIVE_CLASSES]

if __name__ == "__main__":
    out, rounds, extra = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
    out.mkdir(parents=True, exist_ok=True)
    only = [v for v in VARIANTS if any(e == f"--only={v}" for e in extra)] or list(VARIANTS)
    extra = [e for e in extra if not e.startswith("--only=")]
    for variant in only:
        config = Path(__file__).resolve().parents[2] / "configs" / "quickstart.yaml"
        code = main(
            [
                "run",
                str(config),
                "clients=6",
                "clients_per_rank=balanced",
                f"rounds={rounds}",
                *VARIANTS[variant],
                *extra,
                "--out",
                str(out / f"{variant}.h5"),
            ]
        )
        if code != 0:
            sys.exit(code)
