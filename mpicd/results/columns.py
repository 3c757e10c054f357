"""The results file's layout, declared once: every dataset's dims, dtype, units and description.

Layout (a contract the report and later tools rely on)::

    /                       attrs: config (YAML), mpicd_version, versions (YAML), algorithm,
                                   clients, rounds, num_parameters, feature_dim, num_classes,
                                   eval_split, val_split, normalization (YAML), preprocessing (what
                                   reading did to the images: channels, resize), backends (YAML:
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
``units`` and ``description`` and the results-file table of docs/reference/results-file.md is generated from the same
declarations (``tools/docs_tables.py``). Every axis is an HDF5 dimension scale, labelled with its
name: round (1..rounds), client (0..clients-1), class (the names of attr class_names), kind
(mpicd.mpi.accounting.KINDS), direction (sent, received). Each group holds a 1-D scale dataset of every
dimension it uses (xarray opens one group at a time and finds coordinate values only there), so
``xarray.open_dataset(path, engine="h5netcdf", group="metrics")`` has named axes with coordinates.
Readers here skip the scales (:func:`is_scale`).

The per-round datasets are declared once in :func:`columns`; creation, the collective write and
the packing of a rank's rows into one vector all follow that table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from collections.abc import Callable

import h5py
import numpy as np

from mpicd.mpi.accounting import KINDS, Traffic
from mpicd.mpi.channels import CHANNELS
from mpicd.privacy.journal import SLOTS


PLACEMENT_STRINGS = {"host": 64, "device": 16, "cpu": 64}


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
    generic_test: Any = None  # the generic model's client.Scores (Algorithm.scores_generic), or None
    generic_val: Any = None
    diag: Any = None  # mpicd.evaluation.diagnostics.Diagnostics (eval.diagnostics), or None: NaN in /diag
    mpi: Traffic | None = None  # what crossed MPI from the client's rank (its first client; None: = traffic)
    participated: int = 1  # 0: the client sat the round out (participation < 1)
    epsilon: float = float("nan")  # privacy on: the client's epsilon after the round's releases
    privacy_stopped: int = 0  # privacy on: 1 once its budget refused a release (it stopped sharing)
    privacy_q: Any = None  # privacy on: (SLOTS,) sample rates of the round's releases (NaN: none)
    privacy_multiplier: Any = None  # privacy on: (SLOTS,) their noise multipliers (NaN: none)
    privacy_steps: Any = None  # privacy on: (SLOTS,) the composed steps each was accounted as (0: none)


@dataclass(frozen=True)
class Column:
    """One per-round dataset: ``path`` holds ``(rounds, clients, *shape)`` values of ``dtype``; ``dims``
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
    "release": ("1", "A private release's place among the client's releases of the round, from 0."),
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
    "generic_test": "of the method's generic model (FedRoD's body and averaged head) on the held-out test split (in such a "
    "method's files only)",
    "generic_val": "of the method's generic model (FedRoD's body and averaged head) on the validation split (in such a "
    "method's files only)",
}


def _scores(split: str, prefix: str, num_classes: int) -> list[Column]:
    on = _SPLITS[split]
    acc = f"{prefix}test_acc" if split.endswith("test") else f"{prefix}acc"
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
            f"metrics/{prefix}personal_acc", "f8", (), _score(split, "personal_acc"), "1",
            f"Personalised accuracy {on}: the expected accuracy of a sample drawn from it with the client's own "
            f"training label distribution p, sum_c p_c {prefix}recall_c / sum_c p_c over the classes it holds "
            "(p_c: /partition/train_counts of the client, its own partition also where it trains on the union).",
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
        Column("metrics/privacy_q", "f8", (SLOTS,), lambda row: row.privacy_q, "1",
               "The Poisson sample rate of each release the client's accountant granted in the round, in the order "
               "made (slot 0; slot 1: CCVR's statistics after its last round's DP-SGD steps); NaN: no release.",
               ("release",)),
        Column("metrics/privacy_multiplier", "f8", (SLOTS,), lambda row: row.privacy_multiplier, "1",
               "The noise multiplier each of those releases was charged at (NaN: no release).", ("release",)),
        Column("metrics/privacy_steps", "i8", (SLOTS,), lambda row: row.privacy_steps, "1",
               "How many Poisson-subsampled Gaussian steps each release composed (1 a release; DP-SGD its noised "
               "steps; 0: none): with privacy_q and privacy_multiplier, what /metrics/epsilon is recomputed from.",
               ("release",)),
    ]  # fmt: skip


def generic_columns(num_classes: int) -> list[Column]:
    """The scores of a method's generic model (:attr:`mpicd.algorithms.Algorithm.scores_generic`: FedRoD),
    on the test and validation splits; only in such a method's files."""
    return [*_scores("generic_test", "generic_", num_classes), *_scores("generic_val", "generic_val_", num_classes)]


def columns(num_classes: int, private: bool = False, generic: bool = False) -> list[Column]:
    """Every per-round dataset of the file, in a fixed order (``private``: with :func:`private_columns`,
    ``generic``: with :func:`generic_columns`)."""
    k = (len(KINDS),)
    test, val, train = (_scores(*split, num_classes) for split in (("test", ""), ("val", "val_"), ("train", "train_")))
    return [
        Column("metrics/train_loss", "f8", (), lambda row: row.loss.total, "1",
               "The epoch's training loss, train_ce + train_extra (sample-weighted means over its batches)."),
        Column("metrics/train_ce", "f8", (), lambda row: row.loss.ce, "1",
               "The epoch's sample-weighted mean classification loss: the cross-entropy, or the method's own "
               "(FedLC's calibrated logits, FedRS's restricted softmax)."),
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
        *(generic_columns(num_classes) if generic else []),
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


def layout(num_classes: int, private: bool = False, generic: bool = False) -> list[Column | Fixed]:
    """Every dataset of the file but the dimension scales, in the order they are created."""
    return [*columns(num_classes, private, generic), *fixed()]


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
        "release": np.arange(SLOTS, dtype=np.int64),
    }


def is_scale(dset: Any) -> bool:
    """A dimension scale (``round``, ``client``, ...) rather than data."""
    return isinstance(dset, h5py.Dataset) and h5py.h5ds.is_scale(dset.id)


def layout_table(num_classes: int = 2) -> str:
    """The results-file table of docs/reference/results-file.md: every dataset of :func:`layout`, then the
    dimension scales."""
    kinds = {"f8": "float64", "i8": "int64"}
    lines = ["| dataset | dims | dtype | units | description |", "| --- | --- | --- | --- | --- |"]
    for d in layout(num_classes, private=True, generic=True):
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
