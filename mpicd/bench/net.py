"""The network as the current launch sees it: ping-pong and Allreduce over message sizes, and a
latency + bytes / bandwidth fit, for ``mpicd bench``'s projection to many ranks.

    mpirun -n 2 python -m mpicd.bench.net [--sizes 8,64,...] [--repeats 3] [--json FILE]   # prints a table

It times MPI itself (mpi4py's buffer API on numpy arrays, nothing pickled), not mpicd: the
transport's latency and bandwidth are what the projection scales; mpicd's own per-call costs
show in ``mpicd bench``'s round anatomy. Ping-pong runs between ranks 0 and 1 (one-way time =
round trip / 2); Allreduce(SUM) of float32 runs on every rank. Ranks with nothing to do wait in
a sleeping poll, so on an oversubscribed machine they do not take a core from the ones measuring.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

# 8 B ... 64 MiB, a factor 8 apart
SIZES = (8, 64, 512, 4096, 32768, 262144, 2097152, 16777216, 67108864)


def iterations(size: int, budget_bytes: float, most: int) -> int:
    """Timed iterations of one size: about ``budget_bytes`` moved, between 3 and ``most``."""
    return int(min(most, max(3, budget_bytes // max(size, 4096))))


def idle(mpi) -> None:
    """Wait for the other ranks at a barrier without spinning a core."""
    request = mpi.Ibarrier()
    while not request.Test():
        time.sleep(0.002)


def sweep(mpi, sizes=SIZES, repeats: int = 3, budget_bytes: float = 2**28, most: int = 1000) -> dict | None:
    """Collective over ``mpi``: seconds per operation for every size and repeat (on rank 0, else None).

    Returns ``{"sizes": [...], "pingpong": [[s per repeat] per size], "allreduce": [...]}``;
    ping-pong seconds are one-way (half the round trip).
    """
    from mpi4py import MPI

    rank, size = mpi.Get_rank(), mpi.Get_size()
    if size < 2:
        raise ValueError("bench_net: the sweep needs at least 2 ranks")
    out = {"sizes": [int(s) for s in sizes], "pingpong": [], "allreduce": [], "ranks": size}
    for nbytes in sizes:
        n = max(2, nbytes // 4)  # float32 elements; 8 B = 2 floats
        send, recv = np.ones(n, dtype=np.float32), np.empty(n, dtype=np.float32)
        count = iterations(nbytes, budget_bytes, most)
        pingpong, allreduce = [], []
        for _ in range(repeats):
            if rank < 2:
                peer = 1 - rank
                for timed in (False, True):  # one warm-up round trip (it syncs the pair), then the timed ones
                    started = time.perf_counter()
                    for _ in range(count if timed else 1):
                        if rank == 0:
                            mpi.Send([send, MPI.FLOAT], dest=peer, tag=7)
                            mpi.Recv([recv, MPI.FLOAT], source=peer, tag=7)
                        else:
                            mpi.Recv([recv, MPI.FLOAT], source=peer, tag=7)
                            mpi.Send([send, MPI.FLOAT], dest=peer, tag=7)
                    elapsed = time.perf_counter() - started
                pingpong.append(elapsed / count / 2)
                mpi.Ibarrier().Wait()
            else:
                idle(mpi)
            mpi.Allreduce([send, MPI.FLOAT], [recv, MPI.FLOAT], op=MPI.SUM)  # warm-up
            mpi.Barrier()
            started = time.perf_counter()
            for _ in range(count):
                mpi.Allreduce([send, MPI.FLOAT], [recv, MPI.FLOAT], op=MPI.SUM)
            elapsed = np.array([(time.perf_counter() - started) / count])
            slowest = np.empty(1)
            mpi.Allreduce([elapsed, MPI.DOUBLE], [slowest, MPI.DOUBLE], op=MPI.MAX)
            allreduce.append(float(slowest[0]))
        out["pingpong"].append(pingpong)
        out["allreduce"].append(allreduce)
    return out if rank == 0 else None


def fit(sizes, seconds) -> tuple[float, float]:
    """(latency s, bandwidth B/s) of t = latency + bytes / bandwidth, least squares on relative error.

    Relative error (each row divided by its time) so that 8 B and 64 MiB both count; a negative
    latency (noise at small sizes) is clamped to 0 and the bandwidth refitted alone; if noise
    leaves no positive slope, the bandwidth is the largest message over its time.
    """
    m, t = np.asarray(sizes, dtype=float), np.asarray(seconds, dtype=float)
    design = np.stack([1 / t, m / t], axis=1)
    (latency, inverse_bw), *_ = np.linalg.lstsq(design, np.ones_like(t), rcond=None)
    if latency < 0 or inverse_bw <= 0:
        latency = max(0.0, float(latency))
        rest = (t - latency) / t
        inverse_bw = float(np.sum(m / t * rest) / np.sum((m / t) ** 2))
    if inverse_bw <= 0:
        inverse_bw = float(t[np.argmax(m)] / m.max())
    return float(latency), float(1 / inverse_bw)


def main() -> int:
    parser = argparse.ArgumentParser(description="ping-pong and Allreduce sweep (run under mpirun, >= 2 ranks)")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)), help="message sizes in bytes, comma-separated")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--budget", type=float, default=2.0**28, help="bytes moved per size and repeat")
    parser.add_argument("--json", help="also write the sweep and both fits to this file (rank 0)")
    args = parser.parse_args()
    from mpi4py import MPI

    result = sweep(MPI.COMM_WORLD, [int(s) for s in args.sizes.split(",")], args.repeats, args.budget)
    if result is None:
        return 0
    if args.json:
        import json

        fits = {name: fit(result["sizes"], [np.median(v) for v in result[name]]) for name in ("pingpong", "allreduce")}
        named = {k: {"latency_seconds": a, "bandwidth_bytes_per_second": b} for k, (a, b) in fits.items()}
        with open(args.json, "w") as f:
            json.dump({**result, "fit": named}, f)
    print(
        f"{'bytes':>10} {'ping-pong one-way s (median)':>30} {'allreduce s (median)':>22}   ({result['ranks']} ranks)"
    )
    for nbytes, pp, ar in zip(result["sizes"], result["pingpong"], result["allreduce"]):
        print(f"{nbytes:>10} {np.median(pp):>30.3e} {np.median(ar):>22.3e}")
    for name in ("pingpong", "allreduce"):
        latency, bandwidth = fit(result["sizes"], [np.median(v) for v in result[name]])
        print(f"{name}: latency {latency * 1e6:.2f} us, bandwidth {bandwidth / 1e9:.3f} GB/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
