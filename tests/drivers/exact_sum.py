"""Run under mpiexec: ``Comm.allreduce_sum_exact`` gives the same bits however the clients sit on
the ranks, equals the exactly rounded sum, and its bytes are counted.

Seven clients' float32 vectors (magnitudes from 1e-7 to 1e3, signs mixed, two coordinates that
cancel exactly) are summed under three layouts of clients on ranks. Expected values are computed
here independently: math.fsum of the float64 values (exact), rounded once to float32.
"""

import math

import numpy as np

from mpicd.mpi.comm import Comm
from mpicd.mpi.placement import abort_on_exception

CLIENTS, WIDTH = 7, 257

comm = Comm()
rank, size = comm.rank, comm.size
rng = np.random.default_rng(12345)
vectors = (rng.standard_normal((CLIENTS, WIDTH)) * 10.0 ** rng.uniform(-7, 3, (CLIENTS, WIDTH))).astype(np.float32)
vectors[:, 0] = [1e3, -1e3, 1e-7, -1e-7, 0.0, 0.0, 0.0]  # cancels to exactly 0
vectors[:, 1] = 0.0
layouts = {
    "round_robin": [c % size for c in range(CLIENTS)],
    "all_on_0": [0] * CLIENTS,
    "blocks": [min(c * size // CLIENTS, size - 1) for c in range(CLIENTS)],
}

with abort_on_exception(comm.mpi):
    exact = np.array([math.fsum(float(v) for v in vectors[:, j]) for j in range(WIDTH)]).astype(np.float32)
    results = {}
    for name, owner in layouts.items():
        mine = {c: vectors[c] for c in range(CLIENTS) if owner[c] == rank}
        comm.ledger.begin_round(tuple(sorted(mine)))
        results[name] = comm.allreduce_sum_exact(mine, vectors[0], CLIENTS, channel="payload")
        row = comm.ledger.end_round()
        assert row.bytes_sent["allreduce"] == row.bytes_recv["allreduce"] == 8 + 8 * WIDTH, (name, row)
    first = results["round_robin"]
    assert first.dtype == np.float32 and first[0] == 0.0 and first[1] == 0.0
    for name, got in results.items():
        assert got.tobytes() == first.tobytes(), name  # the same bits on every layout
    # within one float32 rounding of the exact sum (the fixed-point quantum is ~2^-55 of the largest)
    ulp = np.spacing(np.abs(exact).astype(np.float32))
    assert (np.abs(first.astype(np.float64) - exact.astype(np.float64)) <= ulp).all()
    assert (first == exact).mean() > 0.99, (first == exact).mean()
    print(f"rank {rank} ok", flush=True)
