"""The results file read back as plain arrays (no MPI): :class:`Results` and :func:`load`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import h5py
import numpy as np


from mpicd.config.sections import computed_config, with_added_keys
from mpicd.results.columns import is_scale


def text(value: Any) -> Any:
    """An attribute or string value as h5py returns it, decoded to str where it is bytes."""
    return value.decode() if isinstance(value, bytes) else value


def open_file(path: str | Path) -> h5py.File:
    """The results file opened read-only: the one place mpicd opens one for reading (``with
    open_file(p) as f``), for what reads more than :class:`Results` loads (verify, the start decision,
    the ledger); the writer (:mod:`mpicd.results.writer`) is the one place it is opened for writing."""
    return h5py.File(path, "r")


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

        with open_file(self.path) as f:
            absent = [f"attribute {a!r}" for a in ("completed_rounds", "config") if a not in f.attrs] + [
                f"/{name}" for name in self.REQUIRED if name not in f
            ]
            if absent:
                raise ResultsFileError(f"{self.path}: not an mpicd results file (no {', '.join(absent)})")
            self.attrs = {k: text(v) for k, v in f.attrs.items()}
            self.completed_rounds = int(self.attrs["completed_rounds"])
            data = {g: [n for n, d in f[g].items() if not is_scale(d)] for g in ("metrics", "partition")}
            rows = min((f["metrics"][name].shape[0] for name in data["metrics"]), default=0)
            if not 0 <= self.completed_rounds <= rows:
                raise ResultsFileError(
                    f"{self.path}: completed_rounds is {self.completed_rounds}, but /metrics holds {rows} rounds"
                )
            done = slice(0, self.completed_rounds)
            self.metrics = {name: f["metrics"][name][done] for name in data["metrics"]}
            self.kinds = tuple(text(k) for k in f["comm/bytes_sent"].attrs["kinds"])
            self.bytes_sent_by_kind = f["comm/bytes_sent"][done]
            self.bytes_recv_by_kind = f["comm/bytes_recv"][done]
            self.teacher = f["comm/teacher"][done]
            self.outside_rounds = f["comm/outside_rounds"][()]
            # {channel: (class, (clients, 2) bytes sent and received)}; {} in a file older than channels
            self.channel_bytes = {}
            if "comm/channel_bytes" in f:
                dset = f["comm/channel_bytes"]
                names = [text(n) for n in f["comm/channel"][()]]
                classes = [text(c) for c in dset.attrs["classes"]]
                values = dset[()]
                self.channel_bytes = {n: (c, values[:, i, :]) for i, (n, c) in enumerate(zip(names, classes))}
            self.partition = {name: f["partition"][name][()] for name in data["partition"]}
            self.placement = (
                {name: [text(v) for v in dset[()]] for name, dset in f["placement"].items() if not is_scale(dset)}
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
        names = [] if names is None else [str(text(n)) for n in np.atleast_1d(names)]
        return tuple(names) if len(names) == classes else tuple(str(c) for c in range(classes))

    def flat_config(self, operational: bool = False) -> dict[str, Any]:
        """The resolved config as dotted keys, without the operational ones (output, device, eval, ...:
        ``config.OPERATIONAL_KEYS``) unless ``operational``; a file older than a key counts as the older
        behaviour (``config.ADDED_LATER``); lists as tuples (hashable)."""

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
        raise ImportError("mpicd.results.reader.load needs pandas: pip install 'mpicd[report]'") from None
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
