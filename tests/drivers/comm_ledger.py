"""Run under mpiexec: every Comm operation moves the right data and the ledger counts it exactly.

argv[1] == "short": rank 0 sends rank 1 a message one float shorter than rank 1 expects.
argv[1] == "undeclared" / "dtype" / "operation": every rank sends on a channel mpicd does not
declare / a float64 buffer on a float32-only payload channel / an Allgather on a channel that
declares only Allreduce: each must be refused (ProtocolError) before anything is sent.
"""

import sys

import numpy as np

from mpicd.mpi.channels import Channel
from mpicd.mpi.comm import Comm, ProtocolError
from mpicd.mpi.placement import abort_on_exception

comm = Comm()
rank, size = comm.rank, comm.size

with abort_on_exception(comm.mpi):
    if sys.argv[1:] == ["short"]:
        if rank == 0:
            comm.exchange([(1, np.zeros(9, np.float32))], [], tag=5, channel="payload")
        elif rank == 1:
            comm.exchange([], [(0, np.zeros(10, np.float32))], tag=5, channel="payload")
        sys.exit(0)
    if sys.argv[1:2] in (["undeclared"], ["dtype"], ["operation"]):
        comm.declare(Channel("payload", "payload", ("float32",), ("allreduce",), "peers", "a test's payload"))
        attempt = {
            "undeclared": lambda: comm.allreduce_sum(np.ones(2, np.float32), channel="extra"),
            "dtype": lambda: comm.allreduce_sum(np.ones(2, np.float64), channel="payload"),
            "operation": lambda: comm.allgather(np.ones(2, np.float32), channel="payload"),
        }[sys.argv[1]]
        try:
            attempt()
        except ProtocolError as err:
            print(f"rank {rank} refused: {err}", flush=True)
            assert comm.ledger.channels == {} and comm.ledger.outside_rounds.total_sent == 0
            sys.exit(0)
        raise AssertionError("not refused")

    agreed = comm.first_failing_rank(False)  # outside any round
    assert agreed is None
    assert comm.ledger.outside_rounds.bytes_sent["allreduce"] == 8

    comm.ledger.begin_round()
    mine = np.full(10, rank, dtype=np.float32)
    got = np.empty(10, dtype=np.float32)
    comm.exchange([((rank + 1) % size, mine)], [((rank - 1) % size, got)], tag=0, channel="payload")
    assert np.all(got == (rank - 1) % size)
    total = comm.allreduce_sum(np.arange(5, dtype=np.float64) + rank, channel="payload")
    assert np.array_equal(total, size * np.arange(5) + size * (size - 1) / 2)
    gathered = comm.allgather(np.array([rank, rank * 2, rank * 3], dtype=np.int64), channel="payload")
    assert gathered.shape == (size, 3) and np.array_equal(gathered[:, 1], 2 * np.arange(size))
    shared = np.full(7, rank + 1, dtype=np.float32)
    comm.bcast(shared, root=0, channel="payload")
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
    # Per channel, over both: the failure agreement, the 4 layout agreements, the round's payload.
    assert comm.ledger.channels == {
        "failure": [8, 8],
        "layout": [4 * 16, 4 * 16 * size],
        "payload": [40 + 40 + 24 + (28 if rank == 0 else 0), 40 + 40 + 24 * size + (0 if rank == 0 else 28)],
    }, comm.ledger.channels
    # A gather reaches the root alone: every rank sends its block, only the root receives them all.
    block = np.array([rank + 0.5, -rank], dtype=np.float64)
    at_root = comm.gather(block, root=0, channel="rows")
    if rank == 0:
        assert np.array_equal(at_root, np.array([[r + 0.5, -r] for r in range(size)]))
    else:
        assert at_root is None
    assert comm.ledger.channels["rows"] == [16, 16 * size if rank == 0 else 0], comm.ledger.channels
    print(f"rank {rank} ok", flush=True)
