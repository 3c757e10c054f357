"""The results file: one HDF5 file per run, written collectively, read back as plain arrays.

Layout (a contract the report and later tools rely on):

    /                       attrs: config (YAML), mpicd_version, versions (YAML), algorithm,
                                   clients, rounds, num_parameters, feature_dim, num_classes,
                                   eval_split, writer ("mpio" | "serial"), completed_rounds
    /metrics/<name>         (rounds, clients) float64: train_loss, test_acc, balanced_acc,
                            minority_acc, comm_seconds, compute_seconds
    /metrics/bytes_sent     (rounds, clients) int64, and bytes_recv
    /metrics/recall         (rounds, clients, classes) float64, on the held-out set
    /comm/bytes_sent        (rounds, clients, kinds) int64 by kind of operation (attr kinds), and bytes_recv
    /comm/teacher           (rounds, clients) int64: the client each one learned from, -1 if none
    /comm/outside_rounds    (clients, 2) int64: bytes sent, received outside any round (start-up
                            agreement, progress line, serial gather), written when the run ends
    /partition/train_counts (clients, classes), /partition/test_counts, /partition/expertise (clients,)

With h5py built against MPI every rank writes its own row inside ``dset.collective`` and all
ranks make every metadata change together. Without MPI support rank 0 gathers the rows (through
``comm``, so the bytes are counted) and writes serially: the same layout. The file is flushed
after every round and ``completed_rounds`` says how many rows are valid, so a crash leaves the
finished rounds readable.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

from .comm import KINDS, Comm, Traffic

FLOAT_METRICS = ("train_loss", "test_acc", "balanced_acc", "minority_acc", "comm_seconds", "compute_seconds")


@dataclass
class RoundRow:
    """What one rank measured in one round."""

    train_loss: float
    test_acc: float
    balanced_acc: float
    minority_acc: float
    recall: np.ndarray
    traffic: Traffic
    compute_seconds: float
    teacher: int

    def pack(self) -> np.ndarray:
        """As one float64 vector (bytes are exact in float64 up to 2**53) for the serial gather."""
        return np.concatenate([
            [self.train_loss, self.test_acc, self.balanced_acc, self.minority_acc,
             self.traffic.seconds, self.compute_seconds, self.teacher],
            self.recall,
            [self.traffic.bytes_sent[k] for k in KINDS],
            [self.traffic.bytes_recv[k] for k in KINDS],
        ]).astype(np.float64)

    @classmethod
    def unpack(cls, vector: np.ndarray, num_classes: int) -> "RoundRow":
        c, k = num_classes, len(KINDS)
        traffic = Traffic(dict(zip(KINDS, (int(v) for v in vector[7 + c: 7 + c + k]))),
                          dict(zip(KINDS, (int(v) for v in vector[7 + c + k: 7 + c + 2 * k]))),
                          float(vector[4]))
        return cls(*(float(v) for v in vector[:4]), vector[7: 7 + c].copy(), traffic,
                   float(vector[5]), int(vector[6]))


class ResultsWriter:
    """Create the file (collectively), then ``write_round`` once per round on every rank."""

    def __init__(self, path: str | Path, comm: Comm, *, rounds: int, num_classes: int, attrs: dict,
                 train_counts: np.ndarray, test_counts: np.ndarray, expertise: np.ndarray,
                 parallel: bool | None = None):
        self.comm = comm
        self.num_classes = num_classes
        self.parallel = h5py.get_config().mpi if parallel is None else parallel
        if not self.parallel and comm.rank == 0:
            why = "serial writer requested" if h5py.get_config().mpi else "h5py has no MPI support"
            warnings.warn(f"{why}: rank 0 gathers the results and writes them serially",
                          RuntimeWarning, stacklevel=2)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.file = None
        self.writer = "mpio" if self.parallel else "serial"
        if self.parallel:
            self.file = h5py.File(path, "w", driver="mpio", comm=comm.mpi)
        elif comm.rank == 0:
            self.file = h5py.File(path, "w")
        if self.file is not None:
            self._create(self.file, rounds, comm.size, num_classes, {**attrs, "writer": self.writer})
            if comm.rank == 0:  # every rank knows the partition; one independent write suffices
                self.file["partition/train_counts"][...] = train_counts
                self.file["partition/test_counts"][...] = test_counts
                self.file["partition/expertise"][...] = expertise
            self.file.flush()

    @staticmethod
    def _create(f: h5py.File, rounds: int, clients: int, classes: int, attrs: dict) -> None:
        for key, value in attrs.items():
            f.attrs[key] = value
        f.attrs["completed_rounds"] = 0
        metrics, comm, partition = f.create_group("metrics"), f.create_group("comm"), f.create_group("partition")
        for name in FLOAT_METRICS:
            metrics.create_dataset(name, (rounds, clients), dtype="f8", fillvalue=np.nan)
        for name in ("bytes_sent", "bytes_recv"):
            metrics.create_dataset(name, (rounds, clients), dtype="i8", fillvalue=-1)
            by_kind = comm.create_dataset(name, (rounds, clients, len(KINDS)), dtype="i8", fillvalue=-1)
            by_kind.attrs["kinds"] = np.array(KINDS, dtype=h5py.string_dtype())
        metrics.create_dataset("recall", (rounds, clients, classes), dtype="f8", fillvalue=np.nan)
        comm.create_dataset("teacher", (rounds, clients), dtype="i8", fillvalue=-1)
        comm.create_dataset("outside_rounds", (clients, 2), dtype="i8", fillvalue=-1)
        partition.create_dataset("train_counts", (clients, classes), dtype="i8")
        partition.create_dataset("test_counts", (clients, classes), dtype="i8")
        partition.create_dataset("expertise", (clients,), dtype="i8")

    def write_round(self, round_index: int, row: RoundRow) -> None:
        """Every rank calls this with its own row; the file is flushed before it returns."""
        if self.parallel:
            self._write(round_index, {self.comm.rank: row})
        else:
            packed = self.comm.allgather(row.pack())
            if self.file is not None:
                rows = {rank: RoundRow.unpack(v, self.num_classes) for rank, v in enumerate(packed)}
                self._write(round_index, rows)
        if self.file is not None:
            self.file.attrs["completed_rounds"] = round_index + 1
            self.file.flush()

    def _put(self, name: str, index: tuple, values: dict) -> None:
        """Write ``values[rank]`` at ``dset[(*index, rank)]``: collectively, or all rows serially."""
        dset = self.file[name]
        if self.parallel:
            ((rank, value),) = values.items()
            with dset.collective:
                dset[(*index, rank)] = value
        else:
            for rank, value in values.items():
                dset[(*index, rank)] = value

    def _write(self, r: int, rows: dict[int, RoundRow]) -> None:
        def put(name: str, value_of) -> None:
            self._put(name, (r,), {rank: value_of(row) for rank, row in rows.items()})

        for name in FLOAT_METRICS[:4]:
            put(f"metrics/{name}", lambda row, name=name: getattr(row, name))
        put("metrics/comm_seconds", lambda row: row.traffic.seconds)
        put("metrics/compute_seconds", lambda row: row.compute_seconds)
        put("metrics/bytes_sent", lambda row: row.traffic.total_sent)
        put("metrics/bytes_recv", lambda row: row.traffic.total_recv)
        put("metrics/recall", lambda row: row.recall)
        put("comm/bytes_sent", lambda row: [row.traffic.bytes_sent[k] for k in KINDS])
        put("comm/bytes_recv", lambda row: [row.traffic.bytes_recv[k] for k in KINDS])
        put("comm/teacher", lambda row: row.teacher)

    def close(self) -> None:
        """Collective: record this rank's traffic outside rounds, then close the file.

        Call only on success; a failing rank must abort instead (a collective close would wait
        for ranks that are blocked elsewhere). The rounds already flushed stay readable.
        """
        outside = self.comm.ledger.outside_rounds
        mine = np.array([outside.total_sent, outside.total_recv], dtype=np.int64)
        rows = {self.comm.rank: mine} if self.parallel else dict(enumerate(self.comm.allgather(mine)))
        if self.file is not None:
            self._put("comm/outside_rounds", (), rows)
            self.file.close()
            self.file = None


class Results:
    """A results file read into memory: ``r.metrics["minority_acc"]`` is (completed_rounds, clients).

    Only completed rounds are returned, so a file from a crashed run reads like a shorter run.
    """

    def __init__(self, path: str | Path):
        import yaml

        self.path = Path(path)
        with h5py.File(self.path, "r") as f:
            self.attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}
            self.completed_rounds = int(self.attrs["completed_rounds"])
            done = slice(0, self.completed_rounds)
            self.metrics = {name: f["metrics"][name][done] for name in f["metrics"]}
            self.kinds = tuple(k.decode() if isinstance(k, bytes) else k for k in f["comm/bytes_sent"].attrs["kinds"])
            self.bytes_sent_by_kind = f["comm/bytes_sent"][done]
            self.bytes_recv_by_kind = f["comm/bytes_recv"][done]
            self.teacher = f["comm/teacher"][done]
            self.outside_rounds = f["comm/outside_rounds"][()]
            self.partition = {name: f["partition"][name][()] for name in f["partition"]}
        self.config = yaml.safe_load(self.attrs["config"])

    def __repr__(self) -> str:
        return (f"Results({str(self.path)!r}, algorithm={self.attrs.get('algorithm')!r}, "
                f"clients={self.attrs.get('clients')}, completed_rounds={self.completed_rounds})")


def load(path: str | Path) -> Results:
    return Results(path)
