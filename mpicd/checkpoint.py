"""Per-rank checkpoints, so that a run survives a wall-clock limit, a requeue or a killed job.

Each rank saves its whole state after a round into ``<results>.ckpt/rank<R>.round<N>.pt`` (N =
rounds completed): written to a temporary file, fsynced, renamed, so a checkpoint is either
complete or absent; a file that does not load is ignored. The last two per rank are kept:
ranks synchronise every round (the progress Allreduce), so no rank can be more than one
checkpoint ahead of another, and the newest round that every rank holds always survives.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch

KEEP = 2
_NAME = re.compile(r"^rank(\d+)\.round(\d+)\.pt$")


def folder_for(results: str | Path) -> Path:
    """Checkpoints live beside the results file, never as *.h5 in a sweep's output folder."""
    return Path(f"{results}.ckpt")


def path_for(folder: Path, rank: int, completed: int) -> Path:
    return folder / f"rank{rank}.round{completed}.pt"


def available(folder: Path, rank: int) -> list[int]:
    """Rounds-completed counts this rank holds complete checkpoints for, newest first."""
    if not folder.is_dir():
        return []
    found = []
    for entry in folder.iterdir():
        match = _NAME.match(entry.name)
        if match and int(match.group(1)) == rank:
            found.append(int(match.group(2)))
    return sorted(found, reverse=True)


def save(folder: Path, rank: int, completed: int, state: dict) -> Path:
    """Atomically write this rank's state after ``completed`` rounds; drop all but the newest KEEP."""
    folder.mkdir(parents=True, exist_ok=True)
    final = path_for(folder, rank, completed)
    tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as fh:
        torch.save(state, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, final)
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the rename itself survives a crash
    finally:
        os.close(dir_fd)
    for old in available(folder, rank)[KEEP:]:
        path_for(folder, rank, old).unlink(missing_ok=True)
    return final


def load(folder: Path, rank: int, completed: int, device: torch.device) -> dict | None:
    """The state saved after ``completed`` rounds, or None if it is absent or does not load."""
    try:
        return torch.load(path_for(folder, rank, completed), map_location=device, weights_only=False)
    except Exception:  # noqa: BLE001 - a torn or foreign file is ignored, never trusted
        return None
