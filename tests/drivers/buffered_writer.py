"""Run under mpiexec -n 3: buffered rows, several clients per rank, then a crash or a close.

argv: folder, "crash" | "close", "mpio" | "serial". Rank 0 holds clients [0, 3], rank 1 [1],
rank 2 [2, 4] (5 clients). Every value is a function of (client, round), so the test can check
every cell. "crash": rounds 0..4 written, flushes at rounds 1 and 3, then every rank exits
without closing the file (round 4 stays buffered). "close": rounds 0..5, a flush only at round
5, then close.
"""

import os
import sys
import warnings
from pathlib import Path

import numpy as np

from mpicd.mpi.comm import KINDS, Comm, Traffic
from mpicd.mpi.placement import abort_on_exception
from mpicd.results.columns import RoundRow
from mpicd.results.writer import Contents, ResultsWriter
from mpicd.run.client import EpochLoss, Scores

from driver_settings import HELD


comm = Comm()
rank = comm.rank
folder, mode, driver = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
clients = HELD[rank]


def row(client: int, r: int) -> RoundRow:
    traffic = Traffic(dict(zip(KINDS, (100 * client + r, 0, 0, 0))), dict(zip(KINDS, (0, 8, 0, 0))), 0.5)
    test = Scores(
        recall=np.array([r, client], float),
        acc=0.5,
        balanced_acc=0.25,
        minority_acc=client / 10 + r,
        personal_acc=(r + client) / 2,  # the recalls weighted by train_counts (1, 1): what verify recomputes
    )
    return RoundRow(
        loss=EpochLoss(total=client + r / 10, ce=1.0, extra=0.0),
        test=test,
        val=None,
        traffic=traffic,
        compute_seconds=1.5,
        teacher=(client + 1) % 5,
    )


with abort_on_exception(comm.mpi), warnings.catch_warnings():
    warnings.simplefilter("ignore")
    writer = ResultsWriter(
        folder / f"{mode}.{driver}.h5",
        comm,
        Contents(
            rounds=6,
            num_classes=2,
            attrs={"config": "clients: 5\n", "algorithm": "test", "clients": 5, "rounds": 6},
            train_counts=np.ones((5, 2)),
            test_counts=np.ones((5, 2)),
            expertise=np.arange(5) % 2,
            num_clients=5,
        ),
        {"host": f"host{rank}", "local_rank": rank, "device": "cpu", "threads": 1},
        parallel=driver == "mpio",
        clients=clients,
    )
    if mode == "crash":
        for r in range(5):
            writer.write_round(r, {c: row(c, r) for c in clients}, flush=r in (1, 3))
        comm.mpi.Barrier()
        os._exit(0)  # a crash: no close, no MPI_Finalize
    for r in range(6):
        writer.write_round(r, {c: row(c, r) for c in clients}, flush=r == 5)
    writer.close()
