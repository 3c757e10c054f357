"""Temporary, probe and checkpoint files made so that nobody else can choose them.

A predictable name (``.<file>.<pid>.tmp``) beside a shared results folder lets another user plant a
symbolic link there first, and the write then lands wherever the link points. :func:`create` makes a
name with 64 random bits in it and opens it with ``O_CREAT | O_EXCL | O_NOFOLLOW``: the file is new,
ours, and never reached through a link; the caller renames it into place (``os.replace`` replaces a
link at the destination rather than following it).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import BinaryIO

FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def name(folder: Path, prefix: str, suffix: str) -> Path:
    """``folder/<prefix><16 random hex digits><suffix>``."""
    return Path(folder) / f"{prefix}{secrets.token_hex(8)}{suffix}"


def open_new(path: Path, mode: int = 0o666) -> BinaryIO:
    """``path`` opened for writing, created now (FileExistsError if anything is there, a link
    included); ``mode`` before the umask."""
    return os.fdopen(os.open(path, FLAGS, mode), "wb")


def create(folder: Path, prefix: str, suffix: str, mode: int = 0o666) -> tuple[Path, BinaryIO]:
    """A new file under an unpredictable name in ``folder``, open for writing."""
    path = name(folder, prefix, suffix)
    return path, open_new(path, mode)
