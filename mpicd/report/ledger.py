"""The runs ledger: each finished run's scores as one JSON line, a small text file git can keep.

Results files (.h5) are not committed and are lost with the machine that wrote them; the ledger
keeps, for every finished run, what :func:`mpicd.report.summarize` computes in the views the study
reports, so that ``mpicd report`` rebuilds its tables from it and a sweep skips the runs it holds
(:func:`mpicd.sweep.grid.is_done`). It holds scores, not models: a ledgered run cannot be resumed, nor
scored by a rule other than the views stored (last 10 rounds; best-validation round).

One line per run, keyed by ``name`` (the results file's stem), sorted by name. Scores are stored
exactly (JSON's float repr round-trips); the test curves, for plots only, to 6 significant digits.
"""

from __future__ import annotations

import json
import math
import os
from collections import namedtuple
from pathlib import Path
from typing import Any
from collections.abc import Iterable

import numpy as np

from mpicd.config.sections import config_difference
from mpicd.core import exclusive
from mpicd.report.runs import ADDED_LATER, SCORES, SPLITS, _planned, Cell, ReportError, RunSummary, summarize
from mpicd.results.reader import open_file, Results, ResultsFileError

VIEWS = {"last10": (10, "last"), "best-val": (1, "best-val")}
"""The views a ledger holds: name -> (last, select) as ``summarize`` takes them."""

HELD = "last 10 rounds (--last 10) and the best-validation round (--select best-val)"

REQUIRED = (
    "name",
    "config",
    "seed",
    "rounds",
    "planned_rounds",
    "headline",
    "clients",
    "class_names",
    "ranks",
    "bytes_per_round",
    "mpi_bytes_per_round",
    "views",
    "curves",
)

Update = namedtuple("Update", "added kept skipped")
"""What :func:`update` did: records added or changed, already there unchanged, results files skipped (incomplete)."""


def _number(value: Any) -> float | None:
    """A float for JSON: NaN -> null (JSON has no NaN)."""
    value = float(value)
    return None if math.isnan(value) else value


def _float(value: Any) -> float:
    return math.nan if value is None else float(value)


def _plain(value: Any) -> Any:
    """numpy scalars (h5py attrs) -> Python's, so that JSON takes them."""
    return value.item() if isinstance(value, np.generic) else value


def _has_split(res: Results, split: str) -> bool:
    """Whether the file holds scores of the split in some round (eval.train_split=false: all NaN)."""
    values = res.metrics.get(SPLITS[split]["minority_acc"])
    return values is not None and bool((~np.isnan(values)).all(axis=1).any())


def _read(path: str | Path) -> Results:
    try:
        return Results(path)
    except ResultsFileError as err:
        raise ReportError(str(err)) from None


def _complete(res: Results) -> bool:
    return res.completed_rounds == _planned(res)


def record(path: str | Path | Results) -> dict:
    """One finished results file as a ledger entry (a dict ready for JSON); an incomplete file is refused."""
    res = path if isinstance(path, Results) else _read(path)
    if not _complete(res):
        raise ReportError(
            f"{res.path}: {res.completed_rounds} of {_planned(res)} rounds completed: only a finished run is ledgered"
        )
    views: dict[str, dict] = {}
    for split in SPLITS:
        if split != "test" and not _has_split(res, split):
            continue  # no training-split audit in this run: --split train refuses it, as for its file
        views[split] = {}
        for view, (last, select) in VIEWS.items():
            s = summarize(res, last, select, split)
            views[split][view] = {
                "scores": {k: _number(v) for k, v in s.scores.items()},
                "single_class": [int(c) for c in s.single_class],
                "selected_round": s.selected_round,
            }
    s = summarize(res, *VIEWS["last10"], "test")
    entry = {
        "name": res.path.stem,
        "config": res.config,
        **{k: str(res.attrs[k]) for k in ("run_id", "config_hash") if k in res.attrs},
        "seed": s.seed,
        "rounds": s.rounds,
        "planned_rounds": s.planned_rounds,
        "headline": {k: _plain(v) for k, v in s.headline.items()},
        "clients": s.clients,
        "class_names": list(s.class_names),
        "ranks": s.ranks,
        "bytes_per_round": s.bytes_per_round,
        "mpi_bytes_per_round": _number(s.mpi_bytes_per_round),
        "views": views,
        "curves": {m: [None if math.isnan(v) else float(f"{v:.6g}") for v in s.curves[m]] for m in SCORES},
        **_per_round(res),
    }
    try:
        _line(entry)
    except (TypeError, ValueError) as err:  # a config value JSON cannot hold (inf, a date...)
        raise ReportError(f"{res.path}: its config cannot be written as JSON ({err})") from None
    return entry


FINAL = ("metrics/epsilon", "metrics/privacy_stopped")
"""Per-round datasets whose last round the ledger keeps per client (the privacy budget spent, and
from which round a client stopped sharing): what a privacy table reads off a finished run."""


def _per_round(res: Results) -> dict:
    """``last10``: for every numeric (round, client) dataset of /metrics and /diag, the mean over
    the last 10 completed rounds and the clients (NaN entries left out; null if all are NaN), with
    ``metrics/train_extra_share`` = that mean of train_extra / train_loss (the term's share of the
    loss); timings (``*_seconds``, not reproducible) and bytes (in bytes_per_round) left out.
    ``final``: the FINAL datasets' last completed round, per client. ``diag_curves`` (runs with
    eval.diagnostics only: /diag not all NaN): each diagnostic per completed round, mean over
    clients (NaN left out, null if all are), to 4 significant digits: how alignment evolves. ``cpu``: the CPU models its
    ranks ran on (/placement/cpu: bit-identical files need the same one). What the study's tuning,
    mechanism and privacy tables read besides the scores (study)."""
    done = res.completed_rounds
    lo = max(0, done - VIEWS["last10"][0])
    means, final, diag_curves = {}, {}, {}
    with open_file(res.path) as f:  # for /diag: Results holds /metrics and /placement, not /diag
        for group, datasets in (("metrics", res.metrics), ("diag", f["diag"] if "diag" in f else {})):
            for name, data in datasets.items():
                key = f"{group}/{name}"
                if (
                    data.ndim != 2
                    or data.dtype.kind not in "fiu"
                    or name.endswith("_seconds")
                    or name.startswith("bytes_")
                ):
                    continue
                values = np.asarray(data[lo:done], dtype=float)
                means[key] = _mean(values)
                if key in FINAL:
                    final[key] = [_number(v) for v in np.asarray(data[done - 1], dtype=float)]
                if group == "diag":
                    rounds = np.asarray(data[:done], dtype=float)
                    if not np.isnan(rounds).all():  # eval.diagnostics off: all NaN, no curve
                        diag_curves[name] = [_rounded(_mean(row), 4) for row in rounds]
    if "train_extra" in res.metrics and "train_loss" in res.metrics:
        extra = np.asarray(res.metrics["train_extra"][lo:done], dtype=float)
        loss = np.asarray(res.metrics["train_loss"][lo:done], dtype=float)
        means["metrics/train_extra_share"] = _mean(extra / np.where(loss == 0, np.nan, loss))
    cpus = sorted({str(c) for c in res.placement.get("cpu", ())})  # decoded by Results
    curves = {"diag_curves": dict(sorted(diag_curves.items()))} if diag_curves else {}
    return {"last10": dict(sorted(means.items())), "final": final, **curves, "cpu": cpus}


def _rounded(value: float | None, digits: int) -> float | None:
    return None if value is None else float(f"{value:.{digits}g}")


def _mean(values: np.ndarray) -> float | None:
    finite = values[~np.isnan(values)]
    return _number(finite.mean()) if finite.size else None


def _line(entry: dict) -> str:
    return json.dumps(entry, allow_nan=False, separators=(",", ":"))


def _problem(entry: Any) -> str | None:
    """What makes a parsed line no ledger entry, or None (the shapes :func:`summaries` reads)."""
    if not isinstance(entry, dict):
        return "not a JSON object"
    absent = [k for k in REQUIRED if k not in entry]
    if absent:
        return f"no {', '.join(absent)}"
    shapes = {"name": str, "config": dict, "headline": dict, "class_names": list, "views": dict, "curves": dict}
    wrong = [k for k, kind in shapes.items() if not isinstance(entry[k], kind)]
    numbers = ("seed", "rounds", "planned_rounds", "clients", "ranks", "bytes_per_round")
    wrong += [k for k in numbers if not isinstance(entry[k], (int, float)) or isinstance(entry[k], bool)]
    if wrong:
        return f"{', '.join(wrong)} of the wrong type"
    if "test" not in entry["views"] or not set(entry["views"]) <= set(SPLITS):
        return f"views must hold test and may hold {', '.join(s for s in SPLITS if s != 'test')}"
    for split, views in entry["views"].items():
        for view in VIEWS:
            v = views.get(view) if isinstance(views, dict) else None
            if not (
                isinstance(v, dict)
                and isinstance(v.get("scores"), dict)
                and isinstance(v.get("single_class"), list)
                and (v.get("selected_round") is None or isinstance(v.get("selected_round"), int))
            ):
                return f"views.{split}.{view} must hold scores, single_class and selected_round"
    needed = [m for m in SCORES if m not in ADDED_LATER]  # a line older than personal_acc lacks it
    if not all(isinstance(entry["curves"].get(m), list) for m in needed):
        return f"curves must hold {', '.join(needed)}"
    return None


def load(ledger: str | Path) -> dict[str, dict]:
    """The ledger's entries by name; a line that is no entry raises ReportError with file and line."""
    ledger = Path(ledger)
    try:
        text = ledger.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise ReportError(f"{ledger}: cannot read the ledger ({err})") from None
    entries: dict[str, dict] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError as err:
            raise ReportError(f"{ledger}:{number}: not JSON ({err})") from None
        problem = _problem(entry)
        if problem:
            raise ReportError(f"{ledger}:{number}: not a ledger entry ({problem})")
        if entry["name"] in entries:
            raise ReportError(f"{ledger}:{number}: run {entry['name']} is already on an earlier line")
        entries[entry["name"]] = entry
    return entries


_held: dict[Path, tuple[tuple[int, int], dict[str, dict]]] = {}


def held(ledger: str | Path) -> dict[str, dict]:
    """:func:`load`, read again only when the file changed (a sweep asks once per run); {} without a file."""
    ledger = Path(ledger).resolve()
    try:
        stat = ledger.stat()
    except FileNotFoundError:
        return {}
    stamp = (stat.st_mtime_ns, stat.st_size)
    if ledger not in _held or _held[ledger][0] != stamp:
        _held[ledger] = (stamp, load(ledger))
    return _held[ledger][1]


def update(ledger: str | Path, result_paths: Iterable[str | Path]) -> Update:
    """Merge the finished files' records into the ledger, rewritten sorted by name, atomically.

    An entry of the same name and config is replaced only where the record differs; one of the
    same name and another config raises ReportError (nothing written): it is another run. Files
    that are not finished are skipped and counted.
    """
    ledger = Path(ledger)
    entries = load(ledger) if ledger.exists() else {}
    added = kept = skipped = 0
    for path in result_paths:
        res = _read(path)
        if not _complete(res):
            skipped += 1
            continue
        new = record(res)
        old = entries.get(new["name"])
        if old is not None:
            difference = config_difference(old["config"], new["config"], "the ledger", "the file")
            if difference is not None:
                raise ReportError(
                    f"{ledger} holds run {new['name']} of another config than {path} ({difference}): "
                    "remove its line from the ledger, or move the file away"
                )
            if _line(old) == _line(new):
                kept += 1
                continue
        entries[new["name"]] = new
        added += 1
    text = "".join(_line(entries[name]) + "\n" for name in sorted(entries))
    if not ledger.exists() or ledger.read_text() != text:
        temporary, fh = exclusive.create(ledger.parent, f".{ledger.name}.{os.getpid()}.", ".tmp")  # os.replace: atomic
        try:
            with fh:
                fh.write(text.encode())
            os.replace(temporary, ledger)
        finally:
            temporary.unlink(missing_ok=True)  # a failed write (a full disk) leaves the ledger as it was
    return Update(added, kept, skipped)


def _view(ledger: Path, last: int, select: str) -> str:
    for view, (n, rule) in VIEWS.items():
        if select == rule and (n == last or select == "best-val"):
            return view
    asked = f"--select {select}" if select != "last" else f"--last {last}"
    raise ReportError(f"{ledger}: a ledger holds each run's scores over the {HELD} only, not {asked}")


def summaries(ledger: str | Path, last: int = 10, select: str = "last", split: str = "test") -> list[RunSummary]:
    """The ledger's runs as ``summarize(results file, last, select, split)`` scored them, but for
    ``path`` (``<ledger>#<name>``) and the curves: the test split's, to 6 digits; none for train."""
    ledger = Path(ledger)
    view = _view(ledger, last, select)
    runs = []
    for name, e in sorted(load(ledger).items()):
        where = Path(f"{ledger}#{name}")
        if split not in e["views"]:
            raise ReportError(
                f"{where}: no training-split scores (--split train needs runs made with eval.train_split=true)"
            )
        v = e["views"][split][view]
        try:
            older = [None] * len(e["curves"]["minority_acc"])  # a line written before a score: NaN, as its file
            runs.append(
                RunSummary(
                    where,
                    Cell.of(e["config"]),
                    int(e["seed"]),
                    int(e["rounds"]),
                    int(e["planned_rounds"]),
                    {**dict.fromkeys(ADDED_LATER, math.nan), **{k: _float(x) for k, x in v["scores"].items()}},
                    float(e["bytes_per_round"]),
                    {m: np.array([_float(x) for x in e["curves"].get(m, older)]) for m in SCORES}
                    if split == "test"
                    else {},
                    dict(e["headline"]),
                    v["selected_round"],
                    tuple(v["single_class"]),
                    int(e["clients"]),
                    tuple(e["class_names"]),
                    int(e["ranks"]),
                    _float(e["mpi_bytes_per_round"]),
                )
            )
        except (KeyError, TypeError, ValueError) as err:
            raise ReportError(f"{where}: not a ledger entry ({type(err).__name__}: {err})") from None
    return runs
