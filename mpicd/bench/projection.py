"""Round times projected to 4 ... 1024 ranks: the fitted network, the bytes every algorithm declares
(``payloads``) and the compute measured here, under the assumptions of :data:`ASSUMPTIONS`.
"""

from __future__ import annotations

import math
from dataclasses import asdict

import numpy as np

from mpicd.bench.harness import ALGORITHMS


PROJECTED_RANKS = tuple(2**k for k in range(2, 11))  # 4 ... 1024

PROJECTED_MODELS = ("lenet", "resnet18")

ASSUMPTIONS = (
    "weak scaling: every rank keeps its own client of the same size, so compute per round stays the "
    "one measured here on one rank with all of this machine's cores (a GPU per rank would shrink it)",
    "one rank per node, links of the ping-pong's fitted latency a and bandwidth b (the current launch: on "
    "one machine that is shared memory, under srun across nodes the network)",
    "p2p (codistill): sends posted together, the busiest teacher sets the pace: a + S_max * 4D / b, "
    "S_max the mean over 32 rounds of the most students one rank serves (from the teacher draw)",
    "allreduce (fedavg, fedproto, feddistill; and the per-round progress Allreduce of 32 B): "
    "2 ceil(log2 N) a + 2 (N-1)/N * m / b (recursive-doubling latency, ring bandwidth)",
    "allgather (fedamp): ceil(log2 N) a + (N-1) * block / b; each rank also holds all N models "
    "(4NP bytes) and computes N distances, neither of which is modelled beyond the bytes",
    "results writing: the write seconds measured here on the rank that waited least (write_min), "
    "independent of N (a parallel file system's flush grows with N; not modelled); no waiting for "
    "slower ranks, no contention between links",
)


def model_sizes(plan) -> dict:
    """C, D, P, B of the LeNet and ResNet-18 on the bench's dataset."""
    # torch (1.4 s): mpicd bench imports this module at its start, before it checks its input and launches jobs
    from mpicd.algorithms import Sizes
    from mpicd.models.networks import build_model

    cfg, data = plan.config, plan.dataset
    out = {}
    for name in PROJECTED_MODELS:
        sizes = Sizes.of(
            build_model(name, data.input_shape, data.num_classes, cfg.model.feature_dim, cfg.model.hidden), 1
        )
        out[name] = asdict(sizes)
    return out


def busiest_teacher(n: int, seed: int = 0, rounds: int = 32) -> float:
    """Mean over rounds of the most students one rank serves under co-distillation's draw."""
    # torch (1.4 s): mpicd bench imports this module at its start, before it checks its input and launches jobs
    from mpicd.algorithms.codistill import teacher_assignment

    return float(np.mean([np.bincount(teacher_assignment(seed, r, n), minlength=n).max() for r in range(rounds)]))


def comm_model(name: str, n: int, sizes: dict, latency: float, bandwidth: float) -> float:
    """Projected seconds of one round's exchange of ``name`` on ``n`` ranks (see ASSUMPTIONS)."""
    # torch (1.4 s): mpicd bench imports this module at its start, before it checks its input and launches jobs
    from mpicd.algorithms import resolve, Sizes

    cls, params = resolve({"name": name})
    students = busiest_teacher(n) if name == "codistill" else 0
    counts = cls.bytes_per_round(Sizes(**{**sizes, "N": n}), params, students=int(round(students)))
    steps = math.ceil(math.log2(n))
    seconds = 0.0
    for kind, (sent, recv) in counts.items():
        if not sent and not recv:
            continue
        if kind == "p2p":  # sent = S messages of one size
            seconds += latency + students * (sent / max(1, round(students))) / bandwidth
        elif kind == "allreduce":
            seconds += 2 * steps * latency + 2 * (n - 1) / n * sent / bandwidth
        elif kind in ("allgather", "bcast"):
            seconds += steps * latency + (n - 1) * sent / bandwidth
    return seconds


def progress_allreduce(n: int, latency: float, bandwidth: float) -> float:
    """The loop's per-round progress and stop agreement: an Allreduce of 4 float64."""
    return 2 * math.ceil(math.log2(n)) * latency + 2 * (n - 1) / n * 32 / bandwidth


def projection(net: dict, sizes: dict, compute: dict, write: float) -> dict:
    a, b = net["pingpong"]["latency_seconds"], net["pingpong"]["bandwidth_bytes_per_second"]
    out = {
        "ranks": list(PROJECTED_RANKS),
        "latency_seconds": a,
        "bandwidth_bytes_per_second": b,
        "write_seconds": write,
        "assumptions": list(ASSUMPTIONS),
        "models": {},
    }
    for model in PROJECTED_MODELS:
        rows = {}
        for name in ALGORITHMS:
            comm = [comm_model(name, n, sizes[model], a, b) + progress_allreduce(n, a, b) for n in PROJECTED_RANKS]
            rows[name] = {"comm_seconds": comm, "round_seconds": [compute[model] + c + write for c in comm]}
        out["models"][model] = {
            **sizes[model],
            "compute_seconds": compute[model],
            "algorithms": rows,
            "fedamp_gathered_bytes": [4 * n * sizes[model]["P"] for n in PROJECTED_RANKS],
        }
    return out
