"""Where a run starts, from what its output path already holds: fresh, resumed, done, or refused.

The rule that ``mpicd run``, ``mpicd pack``, ``jobs/sweep.sh`` and the Slurm scripts share:

* nothing there (no results file, no checkpoint): start at round 1;
* ``--overwrite``: delete the results file and every checkpoint beside it, then start at round 1;
* a results file or checkpoints, without ``--resume`` or ``--overwrite``: refused, naming the
  file, the run it holds (algorithm, rounds done, run id) and both options: never replaced silently;
* ``--resume``: the file's config must equal this run's (else refused, naming the first differing
  key, whether the file is complete or not); a complete file: nothing to do; otherwise continue from
  this run's newest checkpoint at or before the file's completed rounds (agreed by every rank in
  :func:`mpicd.run.resume.resume_point`). Checkpoints without their results file, or beside one that
  cannot be read, are refused: the rows before them would be missing.

Only rank 0 looks (the output is on a file system every rank of the run shares); the decision is
broadcast.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from mpicd.config.identity import is_run_id, new_run_id
from mpicd.config.sections import config_difference, ConfigError
from mpicd.results.columns import columns
from mpicd.results.reader import open_file, text
from mpicd.run import checkpoint

MODES = ("new", "resume", "overwrite")


@dataclass(frozen=True)
class Found:
    """What lies at a results path: the file's state and run, and every checkpoint beside it."""

    path: Path
    state: str  # "absent" | "unreadable" | "results"
    error: str = ""
    run_id: str | None = None  # None: absent, or a file made before run ids
    config: dict | None = None
    algorithm: str = "?"
    completed: int = 0
    rounds: int = 0
    checkpoints: dict = field(default_factory=dict)  # checkpoint.inventory(...)
    datasets: frozenset = frozenset()  # every dataset path in the file
    num_classes: int = 0
    nonce: str | None = None  # attr privacy_nonce: a private run's nonce (None: no privacy, or an older mpicd)

    def run_text(self) -> str:
        """``codistill, 8 of 10 rounds done, run 3fa2...``."""
        who = f"run {self.run_id}" if self.run_id else "no run id (an older mpicd)"
        return f"{self.algorithm}, {self.completed} of {self.rounds} rounds done, {who}"

    def checkpoint_text(self) -> str:
        parts = []
        for run_id, ranks in sorted(self.checkpoints.items(), key=lambda kv: str(kv[0])):
            rounds = sorted({n for held in ranks.values() for n in held})
            parts.append(
                f"{sum(map(len, ranks.values()))} of {'run ' + run_id if run_id else 'an older mpicd'} "
                f"(rounds {', '.join(map(str, rounds))})"
            )
        return "; ".join(parts)


def inspect(path: str | Path) -> Found:
    """Read what lies at ``path`` and in its checkpoint folder (no MPI; any process may call it)."""
    path = Path(path)
    checkpoints = checkpoint.inventory(checkpoint.folder_for(path))
    if not path.exists():
        return Found(path, "absent", checkpoints=checkpoints)
    try:
        with open_file(path) as f:
            attrs = dict(f.attrs)
            names: list[str] = []
            f.visititems(lambda name, obj: names.append(name) if hasattr(obj, "shape") else None)  # datasets
        config = yaml.safe_load(text(attrs["config"]))
        run_id = text(attrs.get("run_id"))
        return Found(
            path,
            "results",
            run_id=run_id if is_run_id(run_id) else None,
            config=config if isinstance(config, dict) else None,
            algorithm=str(text(attrs.get("algorithm", "?"))),
            completed=int(attrs["completed_rounds"]),
            rounds=int(attrs.get("rounds", 0)),
            checkpoints=checkpoints,
            datasets=frozenset(names),
            num_classes=int(attrs.get("num_classes", 0)),
            nonce=text(attrs["privacy_nonce"]) if "privacy_nonce" in attrs else None,
        )
    except Exception as err:  # noqa: BLE001 - torn, foreign or not HDF5: say so, never trust it
        return Found(path, "unreadable", error=" ".join(str(err).split())[:200], checkpoints=checkpoints)


@dataclass(frozen=True)
class Start:
    """The decision: ``fresh`` (create the file, ``run_id`` new) or continue run ``run_id`` from a
    checkpoint at round <= ``bound``; ``complete``: nothing to do; ``clear``: delete what is there first."""

    fresh: bool
    run_id: str
    complete: bool = False
    bound: int = 0
    clear: bool = False
    note: str = ""


def decide(found: Found, resolved: dict, mode: str) -> Start:
    """Apply the module's rule; raises ConfigError (key ``--out``, or ``--resume``) when refused."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r} is not one of {MODES}")
    folder = checkpoint.folder_for(found.path)
    if mode == "overwrite":
        what = found.run_text() if found.state == "results" else found.state
        note = f"replacing {found.path} ({what})" if found.state != "absent" else ""
        if found.checkpoints:
            note += ("; " if note else "") + f"deleting the checkpoints in {folder}: {found.checkpoint_text()}"
        if found.state == "results" and isinstance(found.config, dict) and found.config.get("privacy"):
            note += (
                f"; a new run (new run id and nonce): the private releases of run {found.run_id or '(no id)'} "
                "stay with the peers that received them and out of this run's epsilon"
            )
        return Start(True, new_run_id(), clear=True, note=note)
    if found.state == "absent" and not found.checkpoints:
        return Start(True, new_run_id(), note="no results file yet; starting at round 1" if mode == "resume" else "")
    if found.state == "absent":
        raise ConfigError(
            "--out",
            f"{folder} holds checkpoints ({found.checkpoint_text()}) but their results file {found.path} "
            "is missing, so the rounds before them cannot be recovered: restore the file and pass "
            "--resume, or pass --overwrite to start again at round 1 (deleting the checkpoints)",
        )
    if found.state == "unreadable":
        held = f"; {folder} holds checkpoints ({found.checkpoint_text()})" if found.checkpoints else ""
        raise ConfigError(
            "--out",
            f"{found.path} exists but is not a readable results file ({found.error}){held}: it cannot be "
            "resumed; move it away, or pass --overwrite to replace it and start again at round 1",
        )
    if mode == "new":
        held = f"; its checkpoints: {found.checkpoint_text()}" if found.checkpoints else ""
        raise ConfigError(
            "--out",
            f"{found.path} already holds a run ({found.run_text()}){held}: pass --resume to continue "
            "it (or to confirm that it is complete), or --overwrite to replace it, or choose another --out",
        )
    difference = _difference(found.config, resolved) if found.config is not None else "the file's config cannot be read"
    if difference is not None:
        raise ConfigError(
            "--resume",
            f"{found.path} holds a run of a different config ({difference}): use another --out, "
            "restore the config, or pass --overwrite to replace it",
        )
    if found.rounds and found.completed >= found.rounds:
        return Start(False, found.run_id or "", complete=True)
    missing = _missing_columns(found)
    if missing:
        raise ConfigError(
            "--resume",
            f"{found.path} ({found.run_text()}) lacks /{missing[0]}"
            + (f" and {len(missing) - 1} more datasets" if len(missing) > 1 else "")
            + ": it was written by an older mpicd and cannot be continued by this one; pass --overwrite "
            "to start it again at round 1",
        )
    if isinstance(found.config, dict) and found.config.get("privacy") and not found.nonce:
        raise ConfigError(
            "--resume",
            f"{found.path} ({found.run_text()}) is a private run written by an mpicd without run nonces: this one "
            "draws other noise, so its rounds cannot be continued or redone without releasing them again; pass "
            "--overwrite to start a new run",
        )
    if found.run_id is None:
        return Start(
            True,
            new_run_id(),
            note=f"{found.path} was written by an mpicd without run ids; its checkpoints cannot be "
            "matched to it: starting again at round 1",
        )
    return Start(False, found.run_id, bound=found.completed)


def _missing_columns(found: Found) -> list[str]:
    """Per-round datasets this version writes that the file lacks (only for a file with a run id:
    one without is started again anyway)."""
    if found.run_id is None or not found.num_classes:
        return []
    return [col.path for col in columns(found.num_classes) if col.path not in found.datasets]


def _difference(saved: dict, current: dict) -> str | None:
    """config_difference, but another method is named as such, not by the first key it lacks."""
    names = ((saved.get("algorithm") or {}).get("name"), (current.get("algorithm") or {}).get("name"))
    if names[0] != names[1]:
        return f"algorithm: the file has {names[0]}, this run {names[1]}"
    return config_difference(saved, current, "the file", "this run")
