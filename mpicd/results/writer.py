"""The results file written collectively: rows buffered per round, gathered and written at each flush.

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

import os
import shutil
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from collections.abc import Callable

import h5py
import numpy as np

from mpicd.config.sections import ConfigError
from mpicd.core import exclusive
from mpicd.mpi.accounting import KINDS
from mpicd.mpi.channels import CHANNELS

from mpicd.results.columns import (
    DIMENSIONS,
    PLACEMENT_STRINGS,
    Fixed,
    RoundRow,
    columns,
    dimension_values,
    layout,
)
from mpicd.results.reader import text

if TYPE_CHECKING:  # reading a file needs no MPI: only the writer is handed a Comm
    from mpicd.mpi.comm import Comm


def as_float_vector(values: list[np.ndarray]) -> np.ndarray:
    """One rank's column values as one float64 vector (integers up to 2**53 are exact)."""
    return np.concatenate([np.atleast_1d(np.asarray(v, dtype=np.float64)) for v in values])


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


@dataclass(frozen=True)
class Contents:
    """What a results file holds before its first round: its size (``num_clients`` default: the ranks),
    its root attributes, the partition (per client and class: training and test images; each client's
    expertise class) and which optional columns it has (``private``: privacy on; ``generic``: a method
    with a generic model, FedRoD)."""

    rounds: int
    num_classes: int
    attrs: dict
    train_counts: np.ndarray
    test_counts: np.ndarray
    expertise: np.ndarray
    num_clients: int | None = None
    private: bool = False
    generic: bool = False


class ResultsWriter:
    """Create (or, resuming at round ``resume_at``, reopen) the file collectively, then ``write_round``
    once per round. The only place mpicd opens a results file for writing.

    ``contents``: what the file holds before its first round; ``placement``: this rank's placement row;
    ``clients``: the clients this rank holds (default: the one whose index is the rank). Each round's
    rows are kept in memory until a *flush* round (``write_round(..., flush=True)``, agreed by every
    rank): then every buffered row is written, ``completed_rounds`` moves to the flushed round, and the file is flushed; a crash
    between flushes loses only the buffered rows, which ``--resume`` recomputes from the checkpoint
    (:func:`flush_interval` says when to flush).
    """

    def __init__(
        self,
        path: str | Path,
        comm: Comm,
        contents: Contents,
        placement: dict,
        *,
        clients: list[int] | None = None,
        parallel: bool | None = None,
        resume_at: int | None = None,
    ):
        rounds, num_classes, num_clients = contents.rounds, contents.num_classes, contents.num_clients
        self.comm = comm
        self.rounds = rounds
        self.private = contents.private  # privacy on: the private_columns too
        self.generic = contents.generic  # a method with a generic model (FedRoD): the generic_columns too
        self.cols = columns(num_classes, self.private, self.generic)
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
            self._create(self.file, rounds, self.num_clients, num_classes, {**contents.attrs, "writer": self.writer})
            if comm.rank == 0:  # every rank knows the partition; one independent write suffices
                self.file["partition/train_counts"][...] = contents.train_counts
                self.file["partition/test_counts"][...] = contents.test_counts
                self.file["partition/expertise"][...] = contents.expertise
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
        names = [text(n) for n in attrs.get("class_names", [])]
        values = dimension_values(rounds, clients, names if len(names) == classes else list(range(classes)))
        scales: dict[tuple[str, str], h5py.Dataset] = {}
        for d in layout(classes, self.private, self.generic):
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
