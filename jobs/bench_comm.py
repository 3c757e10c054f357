"""Bytes per round per rank of every algorithm: measured by the ledger, next to the formula.

    .venv/bin/python jobs/bench_comm.py [--ranks 4] [--data PATH.npz] [--out DIR]

Launches ``mpirun -n RANKS`` once itself; inside, ``mpicd run`` runs 1 round of every algorithm
for the LeNet (D = 200) and torchvision's ResNet-18 (features = the pooled 512-vector, head = fc)
on PneumoniaMNIST (``../shared/data/pneumoniamnist.npz`` if present, otherwise random images in
the same 1x28x28 layout: the byte counts do not depend on pixel values). It then reads each
results file and prints, per model and algorithm, the mean over ranks of the bytes sent and
received in the round, the analytic payload, and the total (sent + received) relative to FedAvg.
Exits non-zero if any measured count differs from its formula.

Formulas (fp32, N ranks, C classes, D feature dim, P parameters, B floating buffer elements):
codistill 4D sent per student served (mean 4D), 4D received; fedavg 4(P+B+1) both ways;
fedproto 4C(D+1) both ways; feddistill 4C(C+1) both ways; fedamp 4P sent, 4NP received;
local and centralized 0.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

REAL_DATA = ROOT.parent / "shared" / "data" / "pneumoniamnist.npz"
CONFIG = ROOT / "configs" / "pneumoniamnist.yaml"
MODELS = ("lenet", "resnet18")
ALGORITHMS = ("codistill", "local", "centralized", "fedavg", "fedproto", "feddistill", "fedamp")
# 20 + 8 images per client (skew 0.6): one batch, never a batch of one (BatchNorm needs two)
OVERRIDES = ["rounds=1", "data.images_per_class=20", "device=cpu"]


def synthetic_pneumonia(path: Path) -> None:
    """Random uint8 images in the exact MedMNIST layout of pneumoniamnist.npz (28x28, 2 classes)."""
    import numpy as np

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
            code = main(["run", str(CONFIG), f"clients={ranks}", f"data.path={data}", f"model.name={model}",
                         f"algorithm={{name: {name}}}", *OVERRIDES, "--out", str(out / f"{model}_{name}.h5")])
            if code != 0:
                return code
    return 0


def formulas(name: str, n: int, c: int, d: int, p: int, b: int) -> tuple[float, float, str]:
    """(sent, received, formula text) per rank for one round; codistill's sent is the mean over ranks."""
    return {
        "codistill": (4 * d, 4 * d, "4D per student (mean 4D) / 4D"),
        "local": (0, 0, "0"),
        "centralized": (0, 0, "0"),
        "fedavg": (4 * (p + b + 1), 4 * (p + b + 1), "4(P+B+1)" if b else "4(P+1)"),
        "fedproto": (4 * c * (d + 1), 4 * c * (d + 1), "4C(D+1)"),
        "feddistill": (4 * c * (c + 1), 4 * c * (c + 1), "4C(C+1)"),
        "fedamp": (4 * p, 4 * n * p, "4P / 4NP"),
    }[name]


def report(out: Path, ranks: int) -> int:
    import torch

    from mpicd.models import build_model
    from mpicd.results import Results

    failures = 0
    for model in MODELS:
        res = {name: Results(out / f"{model}_{name}.h5") for name in ALGORITHMS}
        attrs = res["fedavg"].attrs
        n, c, d, p = (int(attrs[k]) for k in ("clients", "num_classes", "feature_dim", "num_parameters"))
        net = build_model(model, (1, 28, 28), c, d, 64)
        b = sum(t.numel() for t in net.buffers() if torch.is_floating_point(t))
        print(f"\n{model}: N={n} C={c} D={d} P={p:,} B={b:,} (floating buffers, averaged by fedavg only); "
              f"data={attrs['dataset']}, 1 round, bytes per rank (mean over ranks)")
        header = f"{'algorithm':<12} {'sent':>14} {'received':>14} {'formula sent/recv':>30} {'expected sent':>14} " \
                 f"{'expected recv':>14} {'x fedavg':>9}"
        print(header)
        print("-" * len(header))
        fedavg_total = float(res["fedavg"].metrics["bytes_sent"][0].mean() + res["fedavg"].metrics["bytes_recv"][0].mean())
        for name in ALGORITHMS:
            sent = float(res[name].metrics["bytes_sent"][0].mean())
            recv = float(res[name].metrics["bytes_recv"][0].mean())
            want_sent, want_recv, text = formulas(name, n, c, d, p, b)
            ok = sent == want_sent and recv == want_recv
            failures += not ok
            print(f"{name:<12} {sent:>14,.0f} {recv:>14,.0f} {text:>30} {want_sent:>14,} {want_recv:>14,} "
                  f"{(sent + recv) / fedavg_total:>9.2e}{'' if ok else '  MISMATCH'}")
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
    command = ["mpirun", "-n", str(args.ranks), "--oversubscribe", sys.executable, str(Path(__file__).resolve()),
               "--ranks", str(args.ranks), "--worker", str(out), str(data)]
    print(" ".join(command), flush=True)
    done = subprocess.run(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, timeout=1800)
    if done.returncode != 0:
        print(f"mpirun failed ({done.returncode})", file=sys.stderr)
        return done.returncode
    return report(out, args.ranks)


if __name__ == "__main__":
    sys.exit(main())
