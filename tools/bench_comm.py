"""Bytes per round per rank of every algorithm: measured by the ledger, next to the formula.

    .venv/bin/python tools/bench_comm.py [--ranks 4] [--data PATH.npz] [--out DIR]

Launches ``mpirun -n RANKS`` once itself; inside, ``mpicd run`` runs 1 round of every algorithm
for the LeNet (D = 200) and torchvision's ResNet-18 (features = the pooled 512-vector, head = fc)
on PneumoniaMNIST (``../shared/data/pneumoniamnist.npz`` if present, otherwise random images in
the same 1x28x28 layout: the byte counts do not depend on pixel values). It then reads each
results file and prints, per model and algorithm, the mean over ranks of the bytes sent and
received in the round, the algorithm's declared formula (``payloads`` in its module, the same
declaration as the payload table of docs/explanation/what-leaves-a-rank.md), and the total (sent + received) relative to
FedAvg. Exits non-zero if any rank's measured count of any kind differs from the formula
(``Algorithm.bytes_per_round``; co-distillation's S, the students a rank serves, from ``/comm/teacher``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mpicd.mpi import launch  # noqa: E402

REAL_DATA = ROOT.parent / "shared" / "data" / "pneumoniamnist.npz"
CONFIG = ROOT / "configs" / "pneumoniamnist.yaml"
MODELS = ("lenet", "resnet18")
ALGORITHMS = (
    "codistill", "local", "centralized", "fedavg", "fedproto", "feddistill", "fedamp", "fedlc", "fedrs", "fedntd",
    "fedrod", "ccvr",
)  # fmt: skip
# 20 + 8 images per client (skew 0.6): one batch, never a batch of one (BatchNorm needs two)
OVERRIDES = ["rounds=1", "data.images_per_class=20", "device=cpu"]


def synthetic_pneumonia(path: Path) -> None:
    """Random uint8 images in the exact MedMNIST layout of pneumoniamnist.npz (28x28, 2 classes)."""
    rng = np.random.default_rng(0)
    arrays = {}
    for split, n in (("train", 400), ("val", 40), ("test", 100)):
        arrays[f"{split}_images"] = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
        arrays[f"{split}_labels"] = (np.arange(n) % 2).reshape(n, 1).astype(np.uint8)
    np.savez(path, **arrays)


def worker(out: Path, data: str, ranks: int) -> int:
    """Under mpirun: one 1-round run per (model, algorithm), all in this one MPI job."""
    from mpicd.cli import main

    for model in MODELS:
        for name in ALGORITHMS:
            code = main(
                [
                    "run",
                    str(CONFIG),
                    f"clients={ranks}",
                    f"data.path={data}",
                    f"model.name={model}",
                    f"algorithm={{name: {name}}}",
                    *OVERRIDES,
                    "--out",
                    str(out / f"{model}_{name}.h5"),
                ]
            )
            if code != 0:
                return code
    return 0


def expected(res, sizes) -> tuple[np.ndarray, np.ndarray, str]:
    """(sent, received) (rounds, ranks, kinds) from the algorithm's declaration, and its formula text."""
    from mpicd.algorithms import resolve

    cls, params = resolve(res.config["algorithm"])
    rounds, ranks = res.teacher.shape
    want = np.zeros((2, rounds, ranks, len(res.kinds)), dtype=np.int64)
    for r in range(rounds):
        for rank in range(ranks):
            students = int((res.teacher[r] == rank).sum())
            counts = cls.bytes_per_round(sizes, params, students=students, last=r == int(res.attrs["rounds"]) - 1)
            want[:, r, rank] = np.array([counts[kind] for kind in res.kinds]).T
    text = (
        " + ".join(
            f"{p.sent} / {p.recv}" + (" (last round)" if p.rounds == "last" else "")
            for p in cls.payloads_for(params, True)
        )
        or "0"
    )
    return want[0], want[1], text


def report(out: Path, ranks: int) -> int:
    from mpicd.algorithms import Sizes
    from mpicd.models.networks import build_model
    from mpicd.results.reader import Results

    failures = 0
    for model in MODELS:
        res = {name: Results(out / f"{model}_{name}.h5") for name in ALGORITHMS}
        attrs = res["fedavg"].attrs
        n, c, d = (int(attrs[k]) for k in ("clients", "num_classes", "feature_dim"))
        sizes = Sizes.of(build_model(model, (1, 28, 28), c, d, 64), n)
        print(
            f"\n{model}: N={n} C={c} D={d} P={sizes.P:,} B={sizes.B:,} (floating buffers, averaged by fedavg "
            f"only); data={attrs['dataset']}, 1 round, bytes per rank (mean over ranks)"
        )
        header = (
            f"{'algorithm':<12} {'sent':>14} {'received':>14} {'formula sent / recv':>30} {'expected sent':>14} "
            f"{'expected recv':>14} {'x fedavg':>9}"
        )
        print(header)
        print("-" * len(header))
        fedavg_total = float(
            res["fedavg"].metrics["bytes_sent"][0].mean() + res["fedavg"].metrics["bytes_recv"][0].mean()
        )
        for name in ALGORITHMS:
            r = res[name]
            want_sent, want_recv, text = expected(r, sizes)
            ok = np.array_equal(r.bytes_sent_by_kind, want_sent) and np.array_equal(r.bytes_recv_by_kind, want_recv)
            failures += not ok
            sent, recv = float(r.metrics["bytes_sent"][0].mean()), float(r.metrics["bytes_recv"][0].mean())
            print(
                f"{name:<12} {sent:>14,.0f} {recv:>14,.0f} {text:>30} {want_sent[0].sum(axis=1).mean():>14,.0f} "
                f"{want_recv[0].sum(axis=1).mean():>14,.0f} {(sent + recv) / fedavg_total:>9.2e}"
                f"{'' if ok else '  MISMATCH'}"
            )
    print("\nall measured counts equal their formulas" if not failures else f"\n{failures} MISMATCHES")
    return 1 if failures else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--data", help="a pneumoniamnist.npz (default: ../shared/data's, else synthetic)")
    parser.add_argument("--out", help="folder for the results files (default: a temporary one)")
    parser.add_argument("--worker", nargs=2, metavar=("OUT", "DATA"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(Path(args.worker[0]), args.worker[1], args.ranks)

    out = Path(args.out or tempfile.mkdtemp(prefix="mpicd-bench-comm-"))
    out.mkdir(parents=True, exist_ok=True)
    if args.data:
        data = Path(args.data)
    elif REAL_DATA.is_file():
        data = REAL_DATA
    else:
        data = out / "pneumoniamnist-synthetic.npz"
        synthetic_pneumonia(data)
        print(f"real data absent ({REAL_DATA}): random images in the same layout, {data}")
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMPI_MCA_rmaps_base_oversubscribe="1")
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    command = [
        *launch.command(args.ranks, launcher="mpirun"),
        sys.executable,
        str(Path(__file__).resolve()),
        "--ranks",
        str(args.ranks),
        "--worker",
        str(out),
        str(data),
    ]
    print(" ".join(command), flush=True)
    done = subprocess.run(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, timeout=1800)
    if done.returncode != 0:
        print(f"mpirun failed ({done.returncode})", file=sys.stderr)
        return done.returncode
    return report(out, args.ranks)


if __name__ == "__main__":
    sys.exit(main())
