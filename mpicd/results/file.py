"""The results file: one HDF5 file per run, written collectively, read back as plain arrays.

Layout (a contract the report and later tools rely on):

    /                       attrs: config (YAML), mpicd_version, versions (YAML), algorithm,
                                   clients, rounds, num_parameters, feature_dim, num_classes,
                                   eval_split, val_split, normalization (YAML), backends (YAML:
                                   deterministic algorithms, cuDNN and TF32 settings), writer
                                   ("mpio" | "serial"), completed_rounds, resumed_at (list of the
                                   rounds a resumed job started from), run_id (16 hex digits drawn
                                   when the run first started), config_hash (sha256 of the config
                                   minus operational keys, mpicd.config.identity), payload_sizes (YAML:
                                   N, C, D, P, B of the byte formulas)
    /metrics/<name>         (round, client) float64 losses, scores and seconds, int64 skipped and
                            bytes; recall, val_recall, train_recall (round, client, class)
    /comm/<name>            (round, client, kind) int64 bytes by kind of MPI operation (attr
                            kinds), (round, client) teacher; outside_rounds (client, direction);
                            channel_bytes (client, channel, direction) over the run (attr classes)
    /diag/<name>            (round, client) float64 mechanism diagnostics (eval.diagnostics)
    /partition/<name>       (client, class) image counts, (client,) expertise
    /placement/<name>       (client,) host, device, cpu strings, local_rank, threads

Each dataset's dims, dtype, units and one-sentence description are declared once, in
:func:`layout` (the per-round ones in :func:`columns`); the file carries them as the attributes
``units`` and ``description`` and README.md's results-file table is generated from the same
declarations (``jobs/readme_tables.py``). Every axis is an HDF5 dimension scale, labelled with its
name: round (1..rounds), client (0..clients-1), class (the names of attr class_names), kind
(mpicd.mpi.accounting.KINDS), direction (sent, received). Each group holds a 1-D scale dataset of every
dimension it uses (xarray opens one group at a time and finds coordinate values only there), so
``xarray.open_dataset(path, engine="h5netcdf", group="metrics")`` has named axes with coordinates.
Readers here skip the scales (:func:`is_scale`).

The per-round datasets are declared once in :func:`columns`; creation, the collective write and
the packing of a rank's rows into one vector all follow that table.

Rows are gathered to rank 0, the writer, at each flush (one Gather through ``comm`` on the
instrumentation channel ``rows``, so the bytes are counted and no other rank receives another's
metrics: mpicd.mpi.channels) and rank 0 alone unpacks and writes them, one contiguous block per dataset (BENCHMARKS.md: every
rank writing its own rows, or unpacking every rank's, made the write's CPU time grow with the
ranks). With h5py built against MPI (driver ``mpio``)
all ranks hold the file open and make every metadata change and every flush together; without
MPI support rank 0 alone opens it: the same layout. Rows wait in memory and are written, claimed
in ``completed_rounds`` (updated in place) and flushed every :func:`flush_interval` rounds, at a stop and at the end, so a crash
leaves the flushed rounds readable and loses at most the buffered ones.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from collections.abc import Callable

import h5py
import numpy as np

from mpicd.mpi.channels import CHANNELS
from mpicd.mpi.accounting import KINDS, Traffic

if TYPE_CHECKING:  # reading a file needs no MPI: only the writer is handed a Comm
    from mpicd.mpi.comm import Comm


@dataclass
class RoundRow:
    """What one rank measured in one round (``val``: None when the dataset has no validation split)."""

    loss: Any  # client.EpochLoss: total, ce, extra
    test: Any  # client.Scores on the test split
    val: Any  # client.Scores on the validation split, or None
    traffic: Traffic
    compute_seconds: float
    teacher: int
    train_seconds: float = float("nan")  # the algorithm's hooks and local epochs, minus comm_seconds
    eval_seconds: float = float("nan")  # evaluation on the test and validation splits
    skipped: int = 0  # 1: this client's update was dropped (on_nonfinite: skip)
    train: Any = None  # client.Scores on its own training split (eval.train_split), or None
    diag: Any = None  # mpicd.evaluation.diagnostics.Diagnostics (eval.diagnostics), or None: NaN in /diag
    mpi: Traffic | None = None  # what crossed MPI from the client's rank (its first client; None: = traffic)
    participated: int = 1  # 0: the client sat the round out (participation < 1)
    epsilon: float = float("nan")  # privacy on: the client's epsilon after the round's releases
    privacy_stopped: int = 0  # privacy on: 1 once its budget refused a release (it stopped sharing)


@dataclass(frozen=True)
class Column:
    """One per-round dataset: ``path`` holds (rounds, clients, *shape) values of ``dtype``; ``dims``
    names the axes after (round, client); ``units`` and ``description`` become its attributes."""

    path: str
    dtype: str
    shape: tuple[int, ...]
    get: Callable[[RoundRow], Any]
    units: str
    description: str
    dims: tuple[str, ...] = ()

    @property
    def all_dims(self) -> tuple[str, ...]:
        return ("round", "client", *self.dims)


@dataclass(frozen=True)
class Fixed:
    """A dataset not written row by row (at creation, or at close): ``dims`` names every axis."""

    path: str
    dtype: str
    dims: tuple[str, ...]
    units: str
    description: str
    fill: Any = None

    @property
    def all_dims(self) -> tuple[str, ...]:
        return self.dims


# The axes of the file: name -> (units, description) of its 1-D dimension scale.
DIMENSIONS = {
    "round": ("1", "The round, counted from 1."),
    "client": ("client index", "The client, by its MPI rank in the run."),
    "class": ("", "The class, by name (attr class_names)."),
    "kind": ("", "The kind of MPI operation the bytes were counted under (mpicd.mpi.accounting.KINDS)."),
    "direction": ("", "Bytes sent or received."),
    "channel": ("", "Why the bytes crossed MPI (mpicd.mpi.channels: protocol or instrumentation; attr classes)."),
}
DIRECTIONS = ("sent", "received")


def _score(split: str, name: str, width: int | None = None) -> Callable[[RoundRow], Any]:
    def get(row: RoundRow) -> Any:
        scores = getattr(row, split)
        if scores is None:
            return np.full(width, np.nan) if width else np.nan
        return getattr(scores, name)

    return get


_SPLITS = {
    "test": "on the held-out test split",
    "val": "on the validation split (for choosing hyper-parameters and rounds; NaN where eval.every skips)",
    "train": "on the client's own training split, an audit, not held-out (NaN unless eval.train_split: true)",
}


def _scores(split: str, prefix: str, num_classes: int) -> list[Column]:
    on = _SPLITS[split]
    acc = "test_acc" if split == "test" else f"{prefix}acc"
    return [
        Column(f"metrics/{acc}", "f8", (), _score(split, "acc"), "1", f"Accuracy {on}."),
        Column(
            f"metrics/{prefix}balanced_acc", "f8", (), _score(split, "balanced_acc"), "1",
            f"Balanced accuracy (the mean of the per-class recalls) {on}.",
        ),
        Column(
            f"metrics/{prefix}minority_acc", "f8", (), _score(split, "minority_acc"), "1",
            f"Minority accuracy (mean recall of the classes but the client's expertise class) {on}.",
        ),
        Column(
            f"metrics/{prefix}recall", "f8", (num_classes,), _score(split, "recall", num_classes), "1",
            f"Recall of each class {on}.", ("class",),
        ),
    ]  # fmt: skip


def private_columns() -> list[Column]:
    """The per-round datasets of a run with ``privacy`` (only then in the file: without it the file is
    what it was before privacy existed)."""
    return [
        Column("metrics/epsilon", "f8", (), lambda row: row.epsilon, "1",
               "The client's epsilon at the attr privacy_delta after every release it made up to and including the "
               "round (dp-accounting PLD, Poisson-subsampled Gaussian, zero-out adjacency: attr privacy_adjacency; 0 before "
               "its first)."),
        Column("metrics/privacy_stopped", "i8", (), lambda row: row.privacy_stopped, "1",
               "1 from the round in which the client's privacy budget (privacy.epsilon) refused its release on "
               "(it shares nothing from then on), else 0."),
    ]  # fmt: skip


def columns(num_classes: int, private: bool = False) -> list[Column]:
    """Every per-round dataset of the file, in a fixed order (``private``: with :func:`private_columns`)."""
    k = (len(KINDS),)
    test, val, train = (_scores(*split, num_classes) for split in (("test", ""), ("val", "val_"), ("train", "train_")))
    return [
        Column("metrics/train_loss", "f8", (), lambda row: row.loss.total, "1",
               "The epoch's training loss, train_ce + train_extra (sample-weighted means over its batches)."),
        Column("metrics/train_ce", "f8", (), lambda row: row.loss.ce, "1",
               "The epoch's sample-weighted mean cross-entropy."),
        Column("metrics/train_extra", "f8", (), lambda row: row.loss.extra, "1",
               "The epoch's sample-weighted mean of the algorithm's extra loss term."),
        *test, *val, *train,
        Column("metrics/comm_seconds", "f8", (), lambda row: row.traffic.seconds, "seconds",
               "Time inside MPI calls in the round, waiting included."),
        Column("metrics/compute_seconds", "f8", (), lambda row: row.compute_seconds, "seconds",
               "The rest of the round: its time outside MPI calls."),
        Column("metrics/train_seconds", "f8", (), lambda row: row.train_seconds, "seconds",
               "The algorithm's hooks and the local epochs, minus comm_seconds."),
        Column("metrics/eval_seconds", "f8", (), lambda row: row.eval_seconds, "seconds",
               "Evaluation on the test, validation (and training) splits."),
        Column("metrics/skipped", "i8", (), lambda row: row.skipped, "1",
               "Whether on_nonfinite: skip dropped the client's update: 1, else 0."),
        Column("metrics/participated", "i8", (), lambda row: row.participated, "1",
               "Whether the client took part in the round (participation: trained and communicated): 1, else 0."),
        Column("metrics/bytes_sent", "i8", (), lambda row: row.traffic.total_sent, "bytes",
               "Bytes this client sent in the round, all kinds together (as alone on a site: with one client per "
               "rank its rank's; MPI's per rank: /comm/bytes_mpi_sent)."),
        Column("metrics/bytes_recv", "i8", (), lambda row: row.traffic.total_recv, "bytes",
               "Bytes this client received in the round, all kinds together (as metrics/bytes_sent)."),
        Column("comm/bytes_sent", "i8", k, lambda row: [row.traffic.bytes_sent[n] for n in KINDS], "bytes",
               "Bytes this client sent in the round, by kind of MPI operation (as metrics/bytes_sent).", ("kind",)),
        Column("comm/bytes_recv", "i8", k, lambda row: [row.traffic.bytes_recv[n] for n in KINDS], "bytes",
               "Bytes this client received in the round, by kind of MPI operation (as metrics/bytes_sent).",
               ("kind",)),
        Column("comm/bytes_mpi_sent", "i8", k, lambda row: _by_kind(row.traffic if row.mpi is None else row.mpi, "sent"), "bytes",
               "Bytes that crossed MPI from the client's rank in the round, by kind, on the rank's first client "
               "(0 on its others: summed over clients, the job's); with one client per rank comm/bytes_sent.",
               ("kind",)),
        Column("comm/bytes_mpi_recv", "i8", k, lambda row: _by_kind(row.traffic if row.mpi is None else row.mpi, "recv"), "bytes",
               "Bytes that reached the client's rank over MPI in the round, by kind, as comm/bytes_mpi_sent.",
               ("kind",)),
        Column("comm/teacher", "i8", (), lambda row: row.teacher, "client index",
               "The client this one learned from in the round, -1 if none."),
        Column("diag/term_grad_share", "f8", (), _diag("term_grad_share"), "1",
               "The extra term's share of the gradient norm, ||g_term|| / (||g_ce|| + ||g_term||), mean over the "
               "epoch's batches; NaN without an extra term or eval.diagnostics."),
        Column("diag/r_distance", "f8", (), _diag("r_distance"), "1",
               "Co-distillation: ||m - R|| / ||R||, the student's eval-mode class mean at the start of the round "
               "against the R it received; NaN where undefined or without eval.diagnostics."),
        Column("diag/cka_teacher", "f8", (), _diag("cka_teacher"), "1",
               "Co-distillation: linear CKA of the student's and its teacher's eval-mode features on the first 64 "
               "validation (else test) images, after training; NaN where undefined or without eval.diagnostics."),
        *(private_columns() if private else []),
    ]  # fmt: skip


def fixed() -> list[Fixed]:
    """The datasets written once (or at close), in the order they are created."""
    return [
        Fixed("metrics/write_seconds", "f8", ("round", "client"), "seconds",
              "This rank's write of the round's row, flush included (written with the next row, the last at "
              "close: NaN for a round a crash interrupted).", np.nan),
        Fixed("comm/outside_rounds", "i8", ("client", "direction"), "bytes",
              "Bytes sent and received outside any round (start-up agreement, progress line, serial gather, "
              "eval.diagnostics' probe features), written when the run ends.", -1),
        Fixed("comm/channel_bytes", "i8", ("client", "channel", "direction"), "bytes",
              "Bytes the client's rank sent and received over the whole run on each channel (mpicd.mpi.channels), on "
              "the rank's first client (-1 on its others), in and outside rounds, up to the writer's gather of "
              "this table itself; written when the run ends.", -1),
        Fixed("partition/train_counts", "i8", ("client", "class"), "images",
              "Each client's training images of each class."),
        Fixed("partition/test_counts", "i8", ("client", "class"), "images",
              "The held-out test images of each class each client is scored on."),
        Fixed("partition/expertise", "i8", ("client",), "class index",
              "Each client's expertise class (the one it keeps all its images of)."),
        *(Fixed(f"placement/{key}", f"S{n}", ("client",), "", what) for key, n, what in (
            ("host", PLACEMENT_STRINGS["host"], "The host the client's rank ran on."),
            ("device", PLACEMENT_STRINGS["device"], "The torch device the client trained on."),
            ("cpu", PLACEMENT_STRINGS["cpu"], "The model name of the CPU the client's rank ran on."),
        )),
        Fixed("placement/local_rank", "i8", ("client",), "1", "The rank's index among the ranks of its host.", -1),
        Fixed("placement/threads", "i8", ("client",), "threads", "The torch threads the rank used.", -1),
    ]  # fmt: skip


def layout(num_classes: int, private: bool = False) -> list[Column | Fixed]:
    """Every dataset of the file but the dimension scales, in the order they are created."""
    return [*columns(num_classes, private), *fixed()]


def dimension_values(rounds: int, clients: int, class_names: list[str]) -> dict[str, np.ndarray]:
    """The values of each dimension scale (strings as fixed-length UTF-8 bytes: writable with mpio)."""

    def text(names) -> np.ndarray:
        raw = [str(n).encode() for n in names]
        return np.array(raw, dtype=f"S{max([1, *map(len, raw)])}")

    return {
        "round": np.arange(1, rounds + 1, dtype=np.int64),
        "client": np.arange(clients, dtype=np.int64),
        "class": text(class_names),
        "kind": text(KINDS),
        "direction": text(DIRECTIONS),
        "channel": text(CHANNELS),
    }


def is_scale(dset: Any) -> bool:
    """A dimension scale (``round``, ``client``, ...) rather than data."""
    return isinstance(dset, h5py.Dataset) and h5py.h5ds.is_scale(dset.id)


def layout_table(num_classes: int = 2) -> str:
    """README's results-file table: every dataset of :func:`layout`, then the dimension scales."""
    kinds = {"f8": "float64", "i8": "int64"}
    lines = ["| dataset | dims | dtype | units | description |", "| --- | --- | --- | --- | --- |"]
    for d in layout(num_classes):
        dtype = kinds.get(d.dtype) or f"string ({d.dtype[1:]} bytes)"
        dims = " × ".join(d.all_dims)
        what = d.description.replace("|", "\\|")
        lines.append(f"| `/{d.path}` | {dims} | {dtype} | {d.units or '–'} | {what} |")
    for name, (units, what) in DIMENSIONS.items():
        dtype = "int64" if name in ("round", "client") else "string"
        lines.append(f"| `<group>/{name}` (scale) | {name} | {dtype} | {units or '–'} | {what} |")
    return "\n".join(lines)


def _by_kind(traffic: Traffic, direction: str) -> list[int]:
    counts = traffic.bytes_sent if direction == "sent" else traffic.bytes_recv
    return [counts[n] for n in KINDS]


def _diag(name: str) -> Callable[[RoundRow], Any]:
    return lambda row: np.nan if row.diag is None else getattr(row.diag, name)


def as_float_vector(values: list[np.ndarray]) -> np.ndarray:
    """One rank's column values as one float64 vector (integers up to 2**53 are exact)."""
    return np.concatenate([np.atleast_1d(np.asarray(v, dtype=np.float64)) for v in values])


PLACEMENT_STRINGS = {"host": 64, "device": 16, "cpu": 64}


def flush_interval(flush_every: int | str, ranks: int) -> int:
    """Rounds between flushes of the results file (``checkpoint.flush_every``).

    A flush is collective and on oversubscribed cores its cost grows with the ranks (16 ranks on 2
    cores: ~15 ms against ~1 ms at 2; BENCHMARKS.md), so ``auto`` flushes every ceil(ranks / 4)
    rounds: every round up to 4 ranks, every 8th at 32 (the write per round: 0.7x from 2 to 32
    ranks here, against 5x flushed every round; BENCHMARKS.md). Between flushes the rows wait in
    memory: a crash loses at most that many rounds, which ``--resume`` recomputes from the
    checkpoint (one at or before the flushed round is kept).
    """
    if flush_every == "auto":
        return max(1, -(-ranks // 4))
    return int(flush_every)


class ResultsWriter:
    """Create (or, resuming, reopen) the file collectively, then ``write_round`` once per round.

    ``clients``: the clients this rank holds (default: the one whose index is the rank), of
    ``num_clients`` in the run (default: the ranks). Each round's rows are kept in memory until a
    *flush* round (``write_round(..., flush=True)``, agreed by every rank): then every buffered row
    is written, ``completed_rounds`` moves to the flushed round, and the file is flushed; a crash
    between flushes loses only the buffered rows, which ``--resume`` recomputes from the checkpoint
    (:func:`flush_interval` says when to flush).
    """

    def __init__(
        self,
        path: str | Path,
        comm: Comm,
        *,
        rounds: int,
        num_classes: int,
        attrs: dict,
        train_counts: np.ndarray,
        test_counts: np.ndarray,
        expertise: np.ndarray,
        placement: dict,
        parallel: bool | None = None,
        resume_at: int | None = None,
        clients: list[int] | None = None,
        num_clients: int | None = None,
        private: bool = False,
    ):
        self.comm = comm
        self.rounds = rounds
        self.private = private  # privacy on: the private_columns too
        self.cols = columns(num_classes, private)
        self.clients = sorted(clients) if clients is not None else [comm.rank]
        self.num_clients = comm.size if num_clients is None else num_clients
        self.claimed = resume_at or 0  # the rounds completed_rounds says are in the file
        self.last_flush_seconds = 0.0  # this rank's time in the last flush's metadata update and flush
        self._buffer: dict[int, dict[int, list]] = {}  # round -> client -> column values, not yet written
        self._times: dict[int, float] = {}  # round -> seconds of its write_round, not yet written
        self.on_write: Callable[[], None] | None = None  # called inside write_round, before the writes
        self.parallel = h5py.get_config().mpi if parallel is None else parallel
        if not self.parallel and comm.rank == 0:
            why = "serial writer requested" if h5py.get_config().mpi else "h5py has no MPI support"
            warnings.warn(f"{why}: rank 0 gathers the results and writes them serially", RuntimeWarning, stacklevel=2)
        # every rank sends the same number of rows (padded), so one Gather carries them
        self._held = int(comm.allgather(np.array([len(self.clients)], dtype=np.int64), channel="slots").max())
        path = Path(path)
        self.file = None
        self.writer = "mpio" if self.parallel else "serial"
        mode = "w" if resume_at is None else "r+"
        if comm.rank == 0:
            path.parent.mkdir(parents=True, exist_ok=True)
        if self.parallel:
            self.file = h5py.File(path, mode, driver="mpio", comm=comm.mpi)
        elif comm.rank == 0:
            self.file = h5py.File(path, mode)
        rows = self._gather({k: placement.get(k, "") for k in ("host", "local_rank", "device", "threads", "cpu")})
        if self.file is None:
            return
        if resume_at is None:
            self._create(self.file, rounds, self.num_clients, num_classes, {**attrs, "writer": self.writer})
            if comm.rank == 0:  # every rank knows the partition; one independent write suffices
                self.file["partition/train_counts"][...] = train_counts
                self.file["partition/test_counts"][...] = test_counts
                self.file["partition/expertise"][...] = expertise
        else:
            self.file.attrs.modify("completed_rounds", resume_at)
            self.file.attrs["resumed_at"] = [*self.file.attrs.get("resumed_at", []), resume_at]
            self._clear_rows_from(resume_at)
        for key in ("host", "local_rank", "device", "threads", "cpu"):
            self._put(
                f"placement/{key}",
                (),
                {
                    client: np.bytes_(str(row[key]).encode()[: PLACEMENT_STRINGS[key]])
                    if key in PLACEMENT_STRINGS
                    else row[key]
                    for client, row in rows.items()
                },
            )
        self.file.flush()

    def _clear_rows_from(self, first: int) -> None:
        """Resuming at round ``first``: rows from there on (an earlier attempt's, past the
        checkpoint) go back to their fill values, so no row past completed_rounds holds data of
        another attempt. Each rank clears its own clients' columns (parallel) or rank 0 all (serial)."""
        clients = self.clients if self.parallel else range(self.num_clients)
        for name in [col.path for col in self.cols] + ["metrics/write_seconds"]:
            dset = self.file[name]
            if first >= dset.shape[0]:
                continue
            for client in clients:
                dset[(slice(first, None), client)] = dset.fillvalue

    def _gather(self, mine: dict) -> dict[int, dict]:
        """{client: placement} of the clients this process writes for (all of them when serial)."""
        if self.parallel:
            return dict.fromkeys(self.clients, mine)
        width = sum(PLACEMENT_STRINGS.values())
        text = np.zeros(width + 2 + self._held, dtype=np.int64)
        at = 0
        for key, n in PLACEMENT_STRINGS.items():
            raw = str(mine[key]).encode()[:n]
            text[at : at + len(raw)] = np.frombuffer(raw, dtype=np.uint8)
            at += n
        text[width : width + 2] = [mine["local_rank"], mine["threads"]]
        text[width + 2 :] = -1
        text[width + 2 : width + 2 + len(self.clients)] = self.clients
        rows = {}
        everyone = self.comm.gather(text, channel="placement")  # to the writer alone
        for vec in [] if everyone is None else everyone:
            row, at = {}, 0
            for key, n in PLACEMENT_STRINGS.items():
                row[key] = bytes(vec[at : at + n].astype(np.uint8)).rstrip(b"\0").decode()
                at += n
            row["local_rank"], row["threads"] = int(vec[width]), int(vec[width + 1])
            rows.update({int(c): row for c in vec[width + 2 :] if c >= 0})
        return rows

    def _create(self, f: h5py.File, rounds: int, clients: int, classes: int, attrs: dict) -> None:
        """Every dataset, its attributes and dimension scales: metadata only, so under mpio every rank
        makes the same calls in the same order; rank 0 alone writes the scales' values."""
        for key, value in attrs.items():
            f.attrs[key] = value
        f.attrs["completed_rounds"] = 0
        f.attrs["resumed_at"] = np.zeros(0, dtype=np.int64)
        names = [_text(n) for n in attrs.get("class_names", [])]
        values = dimension_values(rounds, clients, names if len(names) == classes else list(range(classes)))
        scales: dict[tuple[str, str], h5py.Dataset] = {}
        for d in layout(classes, self.private):
            group = d.path.split("/")[0]
            for dim in d.all_dims:  # a group's scales first, in the order its datasets use them
                if (group, dim) not in scales:
                    scale = f.create_dataset(f"{group}/{dim}", values[dim].shape, dtype=values[dim].dtype)
                    scale.make_scale(dim)
                    units, what = DIMENSIONS[dim]
                    scale.attrs["units"], scale.attrs["description"] = units, what
                    if values[dim].dtype.kind == "S":
                        scale.attrs["_Encoding"] = "utf-8"  # xarray decodes the bytes to str
                    scales[(group, dim)] = scale
            shape = tuple(len(values[dim]) for dim in d.all_dims)
            fill = d.fill if isinstance(d, Fixed) else (np.nan if d.dtype == "f8" else -1)
            dset = f.create_dataset(d.path, shape, dtype=d.dtype, fillvalue=fill)
            for i, dim in enumerate(d.all_dims):
                dset.dims[i].attach_scale(scales[(group, dim)])
                dset.dims[i].label = dim
            dset.attrs["units"], dset.attrs["description"] = d.units, d.description
            if d.path.startswith("comm/bytes_"):
                dset.attrs["kinds"] = np.array(KINDS, dtype=h5py.string_dtype())
            if d.path == "comm/channel_bytes":
                dset.attrs["classes"] = np.array([c.cls for c in CHANNELS.values()], dtype=h5py.string_dtype())
                dset.attrs["roles"] = np.array([c.role for c in CHANNELS.values()], dtype=h5py.string_dtype())
        if self.comm.rank == 0:  # one independent write each (serial: rank 0 holds the file)
            for (_, dim), scale in scales.items():
                scale[...] = values[dim]

    def write_round(self, round_index: int, rows: dict[int, RoundRow], flush: bool = True) -> None:
        """Every rank calls this with the rows of the clients it holds ({client: row}), and the
        same ``flush``: False keeps the rows in memory; True writes every buffered row and flushes
        the file before it returns (collective).

        The seconds a call takes are known only after it: they are written with the next flush
        (or at :meth:`close`), so timing costs no extra write.
        """
        started = time.perf_counter()
        if sorted(rows) != self.clients:
            raise ValueError(f"write_round: rows for clients {sorted(rows)}, but this rank holds {self.clients}")
        self._buffer[round_index] = {client: [col.get(row) for col in self.cols] for client, row in rows.items()}
        if self.on_write is not None:  # fault injection (debug.fail_at: in_write)
            self.on_write()
        if flush:
            self._flush(round_index)
        self._times[round_index] = time.perf_counter() - started

    def _flush(self, round_index: int) -> None:
        """Write the buffered rows and the known write times, then claim them (collective).

        One Gather brings every rank's buffered rows to rank 0 alone (no other rank sees another's
        metrics), which unpacks and writes them, one contiguous block of (rounds, clients) per dataset: the writes per flush are
        the same at 2 ranks as at 32 (each rank writing its own rows made the CPU time of the
        round's writes grow with the ranks, measured in BENCHMARKS.md). Under mpio the other
        ranks take part in the metadata update and the flush.
        """
        gathered = self._gathered()
        if self.file is not None and self.comm.rank == 0:
            first, blocks, times = gathered
            for col, block in zip(self.cols, blocks):
                self.file[col.path][first : first + len(block)] = block
            dset, timed = self.file["metrics/write_seconds"], sorted(times)
            if timed and timed == list(range(timed[0], timed[-1] + 1)):  # as always: one block
                dset[timed[0] : timed[-1] + 1] = np.stack([times[r] for r in timed])
            else:
                for r in timed:
                    dset[r] = times[r]
        if self.file is not None:
            began = time.perf_counter()
            # modify writes the value in place: no window where the attribute is deleted. The last
            # round is claimed by close(), after the bytes outside rounds: a job killed in between
            # leaves a file that --resume finishes, never a "complete" one without them.
            if round_index + 1 < self.rounds:
                self.file.attrs.modify("completed_rounds", round_index + 1)
            self.file.flush()
            self.last_flush_seconds = time.perf_counter() - began
        if round_index + 1 < self.rounds:
            self.claimed = round_index + 1
        self._buffer.clear()
        self._times.clear()

    def _gathered(self) -> tuple[int, list[np.ndarray], dict[int, np.ndarray]] | None:
        """Every rank's buffered rows and unwritten write times, on rank 0 (None elsewhere): one
        Gather of float64 (integers up to 2**53 are exact), then (first buffered round, one
        (rounds, clients, *shape) block per column, {round: write seconds of every client}).

        Every rank buffers the same rounds (flushes are agreed), and pads to the same number of
        clients (a client index of NaN), so the blocks line up; only rank 0 unpacks them, with
        array slicing: unpacking every row on every rank cost CPU time that grows as N^2 over the
        job (BENCHMARKS.md)."""
        rounds, timed = sorted(self._buffer), sorted(self._times)
        width = sum(int(np.prod(c.shape)) if c.shape else 1 for c in self.cols)
        values = np.full((len(rounds), self._held, 1 + width), np.nan)
        seconds = np.full((len(timed), self._held, 2), np.nan)
        for j, client in enumerate(self.clients):
            for i, r in enumerate(rounds):
                values[i, j] = [client, *as_float_vector(self._buffer[r][client])]
            for i, r in enumerate(timed):
                seconds[i, j] = [client, self._times[r]]
        everyone = self.comm.gather(np.concatenate([values.ravel(), seconds.ravel()]), channel="rows")
        if everyone is None:  # only the writer receives the rows (instrumentation, mpicd.mpi.channels)
            return None
        # (ranks, rounds, held, ...) -> (rounds, ranks * held, ...): a row per (round, slot)
        slots = self.comm.size * self._held
        v = everyone[:, : values.size].reshape(self.comm.size, *values.shape).swapaxes(0, 1)
        v = v.reshape(len(rounds), slots, 1 + width)
        s = everyone[:, values.size :].reshape(self.comm.size, *seconds.shape).swapaxes(0, 1)
        s = s.reshape(len(timed), slots, 2)
        blocks = []
        if rounds:
            held = ~np.isnan(v[0, :, 0])
            clients = v[0, held, 0].astype(np.int64)
            if sorted(clients.tolist()) != list(range(self.num_clients)):
                raise RuntimeError(f"results: the ranks' rows cover clients {sorted(clients.tolist())}")
            at = 1
            for col in self.cols:
                n = int(np.prod(col.shape)) if col.shape else 1
                block = np.empty((len(rounds), self.num_clients, *col.shape), dtype=col.dtype)
                block[:, clients] = v[:, held, at : at + n].reshape(len(rounds), len(clients), *col.shape)
                blocks.append(block)
                at += n
        times = {}
        for i, r in enumerate(timed):
            row = np.full(self.num_clients, np.nan)
            known = ~np.isnan(s[i, :, 0])
            row[s[i, known, 0].astype(np.int64)] = s[i, known, 1]
            times[r] = row
        return (rounds[0] if rounds else 0), blocks, times

    def _put(self, name: str, index: tuple, values: dict) -> None:
        """Write ``values[client]`` at ``dset[(*index, client)]``: this rank's clients, or all serially.

        Used for the few writes outside the buffered rows (placement, clearing rows on resume,
        the bytes outside rounds); the rows themselves go as blocks from rank 0 (:meth:`_flush`).
        """
        dset = self.file[name]
        for client, value in values.items():
            dset[(*index, client)] = value

    def set_attr(self, key: str, value: Any) -> None:
        """Set a root attribute; collective, so every rank must pass the same value."""
        if self.file is not None:
            self.file.attrs[key] = value
            self.file.flush()

    def close(self, outside: dict | None = None) -> None:
        """Collective: write what is still buffered, record the traffic outside rounds
        (``outside``: {client: Traffic}; default: this rank's ledger, for its first client), then
        close the file; after the last round, only then (flushed first) does ``completed_rounds``
        say that the run is complete.

        Call only on success or at an agreed stop; a failing rank must abort instead (a
        collective close would wait for ranks that are blocked elsewhere). The rounds already
        flushed stay readable.
        """
        if self._buffer:  # rows an agreed stop or the last round did not flush
            last, began = max(self._buffer), time.perf_counter()
            self._flush(last)
            self._times[last] = time.perf_counter() - began
        if outside is None:
            outside = {self.clients[0]: self.comm.ledger.outside_rounds}
        width = 3 + 2 * len(CHANNELS)
        mine = np.full((self._held, width), np.nan)
        for j, client in enumerate(self.clients):
            if client in outside:
                traffic = self.comm.ledger.channels if j == 0 else {}
                by_channel = [traffic.get(name, [0, 0])[k] for name in CHANNELS for k in (0, 1)]
                mine[j] = [client, outside[client].total_sent, outside[client].total_recv, *by_channel]
        if self.parallel:
            blocks = [mine]
            times = {r: dict.fromkeys(self.clients, t) for r, t in self._times.items()}
        else:
            gathered = self._gathered()  # nothing buffered: only the write times
            times = {
                r: {c: t for c, t in enumerate(row) if not np.isnan(t)}
                for r, row in (gathered or (0, [], {}))[2].items()
            }
            everyone = self.comm.gather(mine.ravel(), channel="rows")  # to the writer alone
            blocks = [] if everyone is None else [v.reshape(mine.shape) for v in everyone]
        last = max(self._times, default=-1)
        if self.file is not None:
            for block in blocks:
                held = [row for row in block if not np.isnan(row[0])]
                self._put("comm/outside_rounds", (), {int(row[0]): row[1:3].astype(np.int64) for row in held})
                self._put(
                    "comm/channel_bytes",
                    (),
                    {
                        int(row[0]): row[3:].reshape(len(CHANNELS), 2).astype(np.int64)
                        for i, row in enumerate(held)
                        if i == 0
                    },
                )
            for r, seconds in times.items():
                self._put("metrics/write_seconds", (r,), seconds)
            if last + 1 == self.rounds:
                self.file.flush()  # the data first, so the claim never precedes it on disk
                self.file.attrs.modify("completed_rounds", self.rounds)
            self.file.close()
            self.file = None


def check_output_location(path: str | Path, need_bytes: int) -> None:
    """Before training: the results file's folder can be made and written, and has ``need_bytes`` free.

    Raises ConfigError("output", ...) naming the path; the probe file it writes is removed.
    """
    import os
    import shutil

    from mpicd.core import exclusive
    from mpicd.config.sections import ConfigError

    path = Path(path)
    if path.is_dir():
        raise ConfigError("output", f"{str(path)!r} is a folder, not a results file")
    folder = path.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe, fh = exclusive.create(folder, f".{path.name}.{os.getpid()}.", ".probe")
        try:
            with fh:
                fh.write(b"mpicd")
        finally:
            probe.unlink(missing_ok=True)  # a full disk fails the write: no probe is left behind either
    except OSError as err:
        raise ConfigError("output", f"cannot write in {str(folder)!r}: {err.strerror or err}") from None
    free = shutil.disk_usage(folder).free
    if free < need_bytes:
        raise ConfigError(
            "output",
            f"{str(folder)!r} has {free / 2**20:.1f} MiB free; this run needs about "
            f"{need_bytes / 2**20:.1f} MiB (results file and checkpoints)",
        )


def estimated_bytes(rounds: int, clients: int, num_classes: int, parameters: int, checkpoints: bool) -> int:
    """A generous upper bound of the results file plus the checkpoints (two per rank, model and
    optimizer state at 3 float32 values per parameter) a run writes."""
    per_round = sum(8 * (int(np.prod(c.shape)) if c.shape else 1) for c in columns(num_classes)) + 8
    results = 2 * rounds * clients * per_round + 2**20
    return results + (2 * clients * 12 * parameters if checkpoints else 0)


def _text(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value


class ResultsFileError(ValueError):
    """A file that cannot be read as an mpicd results file; the message names the file and says why."""


class Results:
    """A results file read into memory: ``r.metrics["minority_acc"]`` is (completed_rounds, clients).

    Only completed rounds are returned, so a file from a crashed run reads like a shorter run.
    A missing, truncated, foreign or damaged file raises :class:`ResultsFileError`.
    """

    REQUIRED = ("metrics", "comm/bytes_sent", "comm/bytes_recv", "comm/teacher", "comm/outside_rounds", "partition")

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.is_file():
            raise ResultsFileError(f"{self.path}: no such file")
        try:
            self._read()
        except ResultsFileError:
            raise
        except OSError as err:  # h5py: not HDF5 (no signature), truncated (eof < stored eof), damaged
            raise ResultsFileError(f"{self.path}: not a readable HDF5 file ({_one_line(err)})") from None
        except Exception as err:  # noqa: BLE001 - a foreign layout fails in many ways; name the file
            raise ResultsFileError(
                f"{self.path}: not an mpicd results file ({type(err).__name__}: {_one_line(err)})"
            ) from None

    def _read(self) -> None:
        import yaml

        with h5py.File(self.path, "r") as f:
            absent = [f"attribute {a!r}" for a in ("completed_rounds", "config") if a not in f.attrs] + [
                f"/{name}" for name in self.REQUIRED if name not in f
            ]
            if absent:
                raise ResultsFileError(f"{self.path}: not an mpicd results file (no {', '.join(absent)})")
            self.attrs = {k: _text(v) for k, v in f.attrs.items()}
            self.completed_rounds = int(self.attrs["completed_rounds"])
            data = {g: [n for n, d in f[g].items() if not is_scale(d)] for g in ("metrics", "partition")}
            rows = min((f["metrics"][name].shape[0] for name in data["metrics"]), default=0)
            if not 0 <= self.completed_rounds <= rows:
                raise ResultsFileError(
                    f"{self.path}: completed_rounds is {self.completed_rounds}, but /metrics holds {rows} rounds"
                )
            done = slice(0, self.completed_rounds)
            self.metrics = {name: f["metrics"][name][done] for name in data["metrics"]}
            self.kinds = tuple(_text(k) for k in f["comm/bytes_sent"].attrs["kinds"])
            self.bytes_sent_by_kind = f["comm/bytes_sent"][done]
            self.bytes_recv_by_kind = f["comm/bytes_recv"][done]
            self.teacher = f["comm/teacher"][done]
            self.outside_rounds = f["comm/outside_rounds"][()]
            # {channel: (class, (clients, 2) bytes sent and received)}; {} in a file older than channels
            self.channel_bytes = {}
            if "comm/channel_bytes" in f:
                dset = f["comm/channel_bytes"]
                names = [_text(n) for n in f["comm/channel"][()]]
                classes = [_text(c) for c in dset.attrs["classes"]]
                values = dset[()]
                self.channel_bytes = {n: (c, values[:, i, :]) for i, (n, c) in enumerate(zip(names, classes))}
            self.partition = {name: f["partition"][name][()] for name in data["partition"]}
            self.placement = (
                {name: [_text(v) for v in dset[()]] for name, dset in f["placement"].items() if not is_scale(dset)}
                if "placement" in f
                else {}
            )
        try:
            self.config = yaml.safe_load(self.attrs["config"])
        except Exception as err:  # noqa: BLE001 - YAMLError, or a constructor's ValueError...
            raise ResultsFileError(f"{self.path}: the attribute config is not YAML ({_one_line(err)})") from None

    def __repr__(self) -> str:
        return (
            f"Results({str(self.path)!r}, algorithm={self.attrs.get('algorithm')!r}, "
            f"clients={self.attrs.get('clients')}, completed_rounds={self.completed_rounds})"
        )

    FRAME_KEYS = ("data.name", "clients", "data.partition", "data.skew")
    """The config keys :meth:`to_frame` adds as columns by default (beside algorithm and seed)."""

    @property
    def class_names(self) -> tuple[str, ...]:
        """The classes in label order (attr ``class_names``), or "0", "1", ... in a file without it."""
        classes = next((v.shape[2] for v in self.metrics.values() if v.ndim == 3), 0)
        names = self.attrs.get("class_names")
        names = [] if names is None else [str(_text(n)) for n in np.atleast_1d(names)]
        return tuple(names) if len(names) == classes else tuple(str(c) for c in range(classes))

    def flat_config(self, operational: bool = False) -> dict[str, Any]:
        """The resolved config as dotted keys, without the operational ones (output, device, eval, ...:
        ``config.OPERATIONAL_KEYS``) unless ``operational``; a file older than a key counts as the older
        behaviour (``config.ADDED_LATER``); lists as tuples (hashable)."""
        from mpicd.config.sections import computed_config, with_added_keys

        def every_key(tree: dict, prefix: str = "") -> dict:
            flat = {}
            for key, value in tree.items():
                flat.update(
                    every_key(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value}
                )
            return flat

        config = self.config if isinstance(self.config, dict) else {}
        flat = with_added_keys(every_key(config) if operational else computed_config(config))
        return {k: tuple(v) if isinstance(v, list) else v for k, v in flat.items()}

    def to_frame(self, keys: tuple[str, ...] | list[str] | None = None):
        """The metrics as a tidy pandas DataFrame, for notebooks: columns algorithm, seed, the config
        ``keys`` (dotted, default :attr:`FRAME_KEYS`; absent from this config: None), round (from 1),
        client, metric, value; a per-class metric is one metric per class, by name: ``recall[malignant]``.

        Needs pandas (``pip install 'mpicd[report]'``). For many files: :func:`load`.
        """
        try:
            import pandas as pd
        except ImportError:
            raise ImportError("Results.to_frame needs pandas: pip install 'mpicd[report]'") from None
        names = self.class_names
        parts = []
        for name, values in self.metrics.items():
            per_metric = (
                {name: values} if values.ndim == 2 else {f"{name}[{n}]": values[:, :, c] for c, n in enumerate(names)}
            )
            for metric, array in per_metric.items():
                rounds, clients = np.indices(array.shape)
                parts.append(
                    pd.DataFrame(
                        {
                            "round": rounds.ravel() + 1,
                            "client": clients.ravel(),
                            "metric": metric,
                            "value": array.ravel().astype(np.float64),
                        }
                    )
                )
        frame = pd.concat(parts, ignore_index=True)
        flat = self.flat_config(operational=True)
        for at, key in enumerate(self.FRAME_KEYS if keys is None else keys):
            frame.insert(at, key, pd.Series([flat.get(key)] * len(frame), dtype=object))
        frame.insert(0, "seed", self.config.get("seed"))
        frame.insert(0, "algorithm", self.attrs.get("algorithm"))
        return frame


def paths_of(glob_or_paths: str | Path | Any) -> list[Path]:
    """A glob pattern (``"results/sweep/*.h5"``, ``**`` included), one path, or many paths -> the files,
    sorted for a pattern, in the given order otherwise; a pattern that matches nothing is an error."""
    import glob

    if isinstance(glob_or_paths, (str, Path)):
        text = str(glob_or_paths)
        if not glob.has_magic(text):
            return [Path(text)]
        found = sorted(Path(p) for p in glob.glob(text, recursive=True))
        if not found:
            raise ResultsFileError(f"{text}: no file matches")
        return found
    return [Path(p) for p in glob_or_paths]


def differing_keys(flats: list[dict[str, Any]]) -> list[str]:
    """The dotted config keys whose value (or presence) differs between the configs, sorted; the
    seed and algorithm.name are left out (always columns)."""
    keys = sorted({k for flat in flats for k in flat} - {"seed", "algorithm.name"})
    missing = object()
    return [k for k in keys if len({repr(flat.get(k, missing)) for flat in flats}) > 1]


def load(glob_or_paths: str | Path | Any, keys: tuple[str, ...] | list[str] | None = None):
    """Many results files as one tidy pandas DataFrame: columns file, algorithm, seed, the config keys
    that differ between the files (operational keys such as output or eval left out; ``keys`` to
    choose them; a key a file's config lacks: None), round, client, metric, value. A file that
    cannot be read raises :class:`ResultsFileError` naming it. Needs pandas.
    """
    try:
        import pandas as pd
    except ImportError:
        raise ImportError("mpicd.results.file.load needs pandas: pip install 'mpicd[report]'") from None
    runs = [Results(path) for path in paths_of(glob_or_paths)]
    if not runs:
        raise ResultsFileError("no results file given")
    shown = differing_keys([r.flat_config() for r in runs]) if keys is None else list(keys)
    frames = []
    for run in runs:
        frame = run.to_frame(shown)
        frame.insert(0, "file", str(run.path))
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split())[:300] or type(err).__name__
