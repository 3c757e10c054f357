"""Sweeps: a base config and a grid of overrides -> a numbered list of runs, each one results file.

The same numbering serves a workstation (``jobs/sweep.sh`` runs them one after another) and a
Slurm job array (``slurm/sweep.sbatch``: array index = run index). A run whose results file
already holds all its rounds counts as done, so an interrupted sweep resumes where it stopped;
so does a run the sweep's runs ledger holds (``mpicd ledger``: the scores of finished runs, kept in
git when the results files are gone with their machine).

A sweep file::

    config: pneumoniamnist.yaml          # relative to the sweep file
    output_dir: results/sweep            # relative to where you launch
    grid:                                # cartesian product, in this order
      algorithm: [codistill, fedavg]     # each with its defaults; {name: fedavg, ...} sets keys
      data.skew: [0.0, 0.6, 0.9]
      seed: [0, 1, 2]
    set:                                 # optional: the same overrides for every run, not in names
      eval.diagnostics: false
    ledger: sweep.runs.jsonl             # optional, relative to the sweep file; this is the default
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from mpicd.algorithms import resolve
from mpicd.config.loading import load_config
from mpicd.config.sections import config_difference, ConfigError, to_mapping
from mpicd.config.text import inline
from mpicd.core.durations import duration
from mpicd.report.ledger import held, update
from mpicd.report.runs import ReportError
from mpicd.results.reader import open_file


@dataclass(frozen=True)
class SweepRun:
    index: int
    config: Path
    overrides: tuple[str, ...]
    ranks: int
    rounds: int
    output: Path
    resolved: dict | None = field(default=None, compare=False, repr=False)  # as the results file stores it
    ledger: Path | None = field(default=None, compare=False, repr=False)  # the sweep's runs ledger (.jsonl)


def _label(key: str, value) -> str:
    shown = value.get("name", inline(value)) if isinstance(value, dict) else inline(value)
    return re.sub(r"[^A-Za-z0-9_.=-]+", "", f"{key.split('.')[-1]}={shown}")


def load_sweep(path: str | Path) -> list[SweepRun]:
    """Expand the sweep file into runs; every run's config is validated (ConfigError names it)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError("", f"sweep file {str(path)!r} does not exist")
    spec = yaml.safe_load(path.read_text()) or {}
    unknown = set(spec) - {"config", "output_dir", "grid", "set", "ledger"}
    if unknown:
        raise ConfigError(
            sorted(unknown)[0], f"unknown key in sweep file {path} (known: config, output_dir, grid, set, ledger)"
        )
    if "config" not in spec or not isinstance(spec.get("grid"), dict) or not spec["grid"]:
        raise ConfigError("grid", f"sweep file {path} needs 'config' and a non-empty 'grid' mapping")
    base = path.parent / spec["config"]
    output_dir = Path(spec.get("output_dir", f"results/{path.stem}"))
    keys = list(spec["grid"])
    for key in keys:
        if not isinstance(spec["grid"][key], list) or not spec["grid"][key]:
            raise ConfigError(f"grid.{key}", f"must be a non-empty list of values in {path}")
    fixed = spec.get("set") or {}
    if not isinstance(fixed, dict):
        raise ConfigError("set", f"must be a mapping of config keys to values in {path}")
    for key in fixed:
        if key in spec["grid"]:
            raise ConfigError(f"set.{key}", f"is also a grid key in {path}: give it in one place")
    ledger = spec.get("ledger", f"{path.stem}.runs.jsonl")
    if not isinstance(ledger, str) or not ledger.endswith(".jsonl") or ledger == ".jsonl":
        raise ConfigError("ledger", f"must be a file name ending in .jsonl (relative to the sweep file) in {path}")
    ledger = path.parent / ledger
    pinned = tuple(f"{k}={inline(v)}" for k, v in fixed.items())
    runs = []
    for index, values in enumerate(itertools.product(*(spec["grid"][k] for k in keys))):
        overrides = pinned + tuple(f"{k}={inline(v)}" for k, v in zip(keys, values))
        try:
            config = load_config(base, overrides)
            cls, params = resolve(config.algorithm)
        except ConfigError as err:
            raise ConfigError(err.key, f"run {index} of {path} ({' '.join(overrides)}): {err}") from None
        name = "_".join(_label(k, v) for k, v in zip(keys, values))
        resolved = {**to_mapping(config), "algorithm": {"name": cls.name, **to_mapping(params)}}  # as Plan's
        out = output_dir / f"{index:04d}_{name}.h5"
        runs.append(SweepRun(index, base, overrides, config.clients, config.rounds, out, resolved, ledger))
    return runs


def progress(finished: int, failed: int, total: int, elapsed: float, run_seconds: float, parallel: int = 1) -> str:
    """``3 of 6 finished, 0 failed; 1m02s elapsed, about 1m02s left`` (jobs/sweep.sh prints the same).

    Time left = the mean time of the runs ended so far x the runs not ended / the runs going at once.
    """
    ended = finished + failed
    left = f"about {duration(run_seconds / ended * (total - ended) / parallel)} left" if ended else "time left unknown"
    return f"{finished} of {total} finished, {failed} failed; {duration(elapsed)} elapsed, {left}"


def is_done(run: SweepRun) -> bool:
    """The results file exists and holds every round of this run's config, or the sweep's runs
    ledger holds the run (its output's name) with this config.

    A complete file made with another config (the sweep file changed since; output names carry
    only the grid's labels, e.g. ``algorithm=codistill`` for any lambda) raises ConfigError naming
    the file and the first differing key: it is neither skipped as done nor silently overwritten
    (a file older than a key of ``config.ADDED_LATER`` counts as that version's behaviour); so
    does a ledger entry of another config, naming the ledger.
    An incomplete one is left to the run, whose resume refuses a checkpoint of another config.
    """
    return done_in(run) is not None


def done_in(run: SweepRun) -> str | None:
    """Where the run is done: "file" (its complete results file), "ledger" (only the sweep's runs
    ledger holds it: the file is gone or incomplete), or None (pending); errors as :func:`is_done`."""
    if _file_done(run):
        return "file"
    return "ledger" if _ledgered(run) else None


def _file_done(run: SweepRun) -> bool:
    try:  # two attributes only: Results would read (and check) the whole file
        with open_file(run.output) as f:
            complete = int(f.attrs["completed_rounds"]) == run.rounds
            stored = f.attrs.get("config")
    except (OSError, KeyError):
        return False
    if complete and run.resolved is not None and stored is not None:
        difference = config_difference(yaml.safe_load(stored), run.resolved, "the file", "the sweep")
        if difference is not None:
            raise ConfigError(
                "output_dir",
                f"{run.output} holds a complete run of another config ({difference}): "
                "move it away, or restore the sweep file",
            )
    return complete


def _ledgered(run: SweepRun) -> bool:
    if run.ledger is None:
        return False
    try:
        entry = held(run.ledger).get(run.output.stem)  # read once per sweep: again only when it changed
    except ReportError as err:
        raise ConfigError("ledger", str(err)) from None
    if entry is None:
        return False
    if run.resolved is not None:
        difference = config_difference(entry["config"], run.resolved, "the ledger", "the sweep")
        if difference is not None:
            raise ConfigError(
                "ledger",
                f"{run.ledger} holds run {run.output.stem} of another config ({difference}): "
                "remove its line from the ledger, or restore the sweep file",
            )
    return True


@dataclass(frozen=True)
class Ledgered:
    """What ``mpicd ledger`` did to a sweep's ledger."""

    ledger: Path
    added: int  # records new or changed
    unchanged: int  # runs the ledger holds as they were (whether their results file is there or not)
    missing: int  # runs neither finished nor ledgered
    total: int

    def line(self) -> str:
        return (
            f"ledger: {self.ledger}: {self.added} added, {self.unchanged} unchanged, "
            f"{self.missing} incomplete or absent (of {self.total} runs)"
        )


def write_ledger(sweep_path: str | Path) -> Ledgered:
    """Add the sweep's finished results files to its runs ledger (``ledger.update``); a complete
    file or a ledger entry of another config than the sweep's raises ConfigError, as in is_done."""
    runs = load_sweep(sweep_path)
    finished = [r for r in runs if _file_done(r)]
    ledger = runs[0].ledger
    try:
        tally = update(ledger, [r.output for r in finished])
    except ReportError as err:
        raise ConfigError("ledger", str(err)) from None
    names = {r.output for r in finished}
    without_file = sum(1 for r in runs if r.output not in names and _ledgered(r))
    unchanged = tally.kept + without_file
    return Ledgered(ledger, tally.added, unchanged, len(runs) - tally.added - unchanged, len(runs))
