"""Run under mpiexec: every Comm operation moves the right data and the ledger counts it exactly.

argv[1] == "short": rank 0 sends rank 1 a message one float shorter than rank 1 expects.
"""

import sys

import numpy as np

from mpicd.comm import Comm
from mpicd.runtime import abort_on_exception

comm = Comm()
rank, size = comm.rank, comm.size

with abort_on_exception(comm.mpi):
    if sys.argv[1:] == ["short"]:
        if rank == 0:
            comm.exchange([(1, np.zeros(9, np.float32))], [], tag=5)
        elif rank == 1:
            comm.exchange([], [(0, np.zeros(10, np.float32))], tag=5)
        sys.exit(0)

    agreed = comm.first_failing_rank(False)  # outside any round
    assert agreed is None
    assert comm.ledger.outside_rounds.bytes_sent["allreduce"] == 8

    comm.ledger.begin_round()
    mine = np.full(10, rank, dtype=np.float32)
    got = np.empty(10, dtype=np.float32)
    comm.exchange([((rank + 1) % size, mine)], [((rank - 1) % size, got)], tag=0)
    assert np.all(got == (rank - 1) % size)
    total = comm.allreduce_sum(np.arange(5, dtype=np.float64) + rank)
    assert np.array_equal(total, size * np.arange(5) + size * (size - 1) / 2)
    gathered = comm.allgather(np.array([rank, rank * 2, rank * 3], dtype=np.int64))
    assert gathered.shape == (size, 3) and np.array_equal(gathered[:, 1], 2 * np.arange(size))
    shared = np.full(7, rank + 1, dtype=np.float32)
    comm.bcast(shared, root=0)
    assert np.all(shared == 1)
    row = comm.ledger.end_round()

    assert row.bytes_sent == {"p2p": 40, "allreduce": 40, "allgather": 24, "bcast": 28 if rank == 0 else 0}, row
    assert row.bytes_recv == {"p2p": 40, "allreduce": 40, "allgather": 24 * size, "bcast": 0 if rank == 0 else 28}, row
    assert row.seconds > 0
    # Outside the round: the first agreement (8 bytes) and, before each of the 4 collectives, the
    # layout agreement: an Allgather of (bytes, dtype) as 2 int64 = 16 bytes sent, 16 N received.
    outside = comm.ledger.outside_rounds
    assert outside.bytes_sent == {"p2p": 0, "allreduce": 8, "allgather": 4 * 16, "bcast": 0}, outside
    assert outside.bytes_recv == {"p2p": 0, "allreduce": 8, "allgather": 4 * 16 * size, "bcast": 0}, outside
    print(f"rank {rank} ok", flush=True)
