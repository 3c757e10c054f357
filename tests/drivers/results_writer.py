"""Run under mpiexec: write the same rows with the collective (mpio) and the serial writer.

argv: folder. Rows are simple functions of (rank, round) so the test can check every cell.
"""

import sys
import warnings
from pathlib import Path

import numpy as np

from mpicd.mpi.comm import KINDS, Comm, Traffic
from mpicd.mpi.placement import abort_on_exception
from mpicd.results.columns import RoundRow
from mpicd.results.writer import Contents, ResultsWriter
from mpicd.run.client import EpochLoss, Scores

comm = Comm()
rank, size = comm.rank, comm.size
with abort_on_exception(comm.mpi), warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for parallel in (True, False):
        writer = ResultsWriter(
            Path(sys.argv[1]) / f"{'mpio' if parallel else 'serial'}.h5",
            comm,
            Contents(
                rounds=3,
                num_classes=2,
                attrs={"config": f"clients: {size}\n", "algorithm": "test"},
                train_counts=np.arange(2 * size).reshape(size, 2),
                test_counts=np.full((size, 2), 7),
                expertise=np.arange(size) % 2,
            ),
            {"host": f"node{rank // 2}", "local_rank": rank % 2, "device": "cpu", "threads": rank + 1},
            parallel=parallel,
        )
        for r in range(2):  # two of three rounds: the third must read as not completed
            traffic = Traffic(dict(zip(KINDS, (100 * rank + r, 0, 0, 0))), dict(zip(KINDS, (0, 8, 0, 0))), 0.5)
            test = Scores(
                recall=np.array([r, rank], float), acc=0.5, balanced_acc=0.25, minority_acc=rank / 10, personal_acc=r
            )
            val = Scores(
                recall=np.array([rank, r], float),
                acc=0.75,
                balanced_acc=0.5,
                minority_acc=rank / 100,
                personal_acc=rank / 1000,
            )
            loss = EpochLoss(total=rank + r / 10, ce=rank + r / 4, extra=0.25)
            writer.write_round(
                r,
                {
                    rank: RoundRow(
                        loss=loss, test=test, val=val, traffic=traffic, compute_seconds=1.5, teacher=(rank + 1) % size
                    )
                },
            )
        writer.close()
    serial_warnings = [w for w in caught if "serially" in str(w.message)]
    assert len(serial_warnings) == (1 if rank == 0 else 0), serial_warnings
