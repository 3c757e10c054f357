"""What writing one round's row costs, part by part, with the waiting for other ranks taken out.

    mpirun -n 4 --oversubscribe .venv/bin/python tools/bench_write.py [--rounds 60] [--folder DIR]

Creates the results file's per-round datasets (``mpicd.results.columns.columns``, 2 classes) with the
``mpio`` driver, then per round, after a Barrier (so that no rank waits for a slower one): every
rank writes its row with independent I/O (as ``ResultsWriter`` does), ``completed_rounds`` is
modified in place, and the file is flushed collectively. Separately: ``MPI_File_sync`` alone on a
raw MPI file. Prints rank 0's median milliseconds over the rounds after 5 warm-up rounds.
BENCHMARKS.md ("Round anatomy") quotes it.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np
from mpi4py import MPI

from mpicd.results.columns import columns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--folder", default=None, help="where the files go (default: a temporary folder)")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    folder = Path(args.folder or (tempfile.gettempdir() if comm.rank == 0 else ""))
    folder = Path(comm.bcast(str(folder)))
    path = folder / f"bench_write.{comm.bcast(time.time_ns())}"
    rounds, n = args.rounds, comm.size
    cols = columns(2)
    rows, attr, flush = [], [], []
    with h5py.File(f"{path}.h5", "w", driver="mpio", comm=comm) as f:
        datasets = [
            f.create_dataset(c.path, (rounds, n, *c.shape), dtype=c.dtype, fillvalue=np.nan if c.dtype == "f8" else -1)
            for c in cols
        ]
        f.attrs["completed_rounds"] = 0
        f.flush()
        for r in range(rounds):
            comm.Barrier()
            t0 = time.perf_counter()
            for c, d in zip(cols, datasets):
                d[r, comm.rank] = np.ones(c.shape) if c.shape else 1
            t1 = time.perf_counter()
            f.attrs.modify("completed_rounds", r + 1)
            t2 = time.perf_counter()
            f.flush()
            t3 = time.perf_counter()
            rows.append(t1 - t0), attr.append(t2 - t1), flush.append(t3 - t2)
    sync = []
    fh = MPI.File.Open(comm, f"{path}.bin", MPI.MODE_CREATE | MPI.MODE_RDWR)
    block = np.ones(8)
    for r in range(rounds):
        fh.Write_at(block.nbytes * (r * n + comm.rank), block)
        comm.Barrier()
        t0 = time.perf_counter()
        fh.Sync()
        sync.append(time.perf_counter() - t0)
    fh.Close()
    comm.Barrier()
    if comm.rank == 0:
        Path(f"{path}.h5").unlink(missing_ok=True)
        Path(f"{path}.bin").unlink(missing_ok=True)
        ms = {k: 1e3 * float(np.median(v[5:])) for k, v in dict(rows=rows, attr=attr, flush=flush, sync=sync).items()}
        print(
            f"{n} ranks, {len(cols)} datasets, median of {rounds - 5} rounds: rows {ms['rows']:.2f} ms, "
            f"completed_rounds {ms['attr']:.2f} ms, flush {ms['flush']:.2f} ms; MPI_File_sync alone {ms['sync']:.2f} ms"
        )


if __name__ == "__main__":
    main()
