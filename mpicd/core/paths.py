"""Paths that are what they say: no link where mpicd writes, no folder or key another user controls.

A path given to mpicd names where its bytes go. A symbolic link there (planted by whoever can write
the folder, or left from another run) sends them elsewhere: ``--out`` linked to another run's file
overwrote that run's rows. So every path mpicd creates or replaces is refused when it is a link,
dangling or not (:func:`refuse_link`), unless the user says to follow it. And what mpicd reads back
and trusts -- a key, a checkpoint folder -- must belong to the user running it (or root) and be
writable by nobody else (:func:`check_owned`): a key planted by another uid in an open folder is a
key its planter knows.
"""

from __future__ import annotations

import os
import pwd
import stat
from pathlib import Path

OPEN_TO_OTHERS = stat.S_IWGRP | stat.S_IWOTH


class PathRefused(ValueError):
    """A path mpicd will not write through or trust: ``path`` and why, in one line."""

    def __init__(self, path, why: str):
        self.path = Path(path)
        super().__init__(f"{path}: {why}")


def owner_name(uid: int) -> str:
    """``alice (uid 1001)``, or ``uid 1001`` where the password database does not know it."""
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def trusted_owner(uid: int) -> bool:
    """The user running mpicd, or root (who can read everything anyway)."""
    return uid in (os.geteuid(), 0)


def refuse_link(path, what: str, flag: str | None = "--follow-symlinks") -> None:
    """PathRefused when ``path`` is a symbolic link (dangling or not), naming its target and ``flag``,
    the user's word that a link is meant (None: no such word); nothing otherwise (absent: fine)."""
    path = Path(path)
    if path.is_symlink():
        raise PathRefused(
            path,
            f"{what} is a symbolic link (to {os.readlink(path)}"
            f"{'' if path.exists() else ', which does not exist'}): mpicd "
            + (
                f"writes only at the path it is given; name the target itself, or pass {flag} if the link is meant"
                if flag
                else "follows no link here; name the folder itself"
            ),
        )


def check_owned(info: os.stat_result, path, what: str, private: bool = False) -> None:
    """PathRefused unless ``info`` (an lstat or fstat of ``path``) belongs to the running user or root,
    is not a link, and nobody else may write it (``private``: nor read it, mode 0600 / 0700)."""
    if stat.S_ISLNK(info.st_mode):
        raise PathRefused(path, f"{what} is a symbolic link: refused")
    if not trusted_owner(info.st_uid):
        raise PathRefused(
            path,
            f"{what} belongs to {owner_name(info.st_uid)}, not to {owner_name(os.geteuid())} who runs mpicd: "
            "whoever owns it can change what mpicd reads there; refused",
        )
    open_bits = info.st_mode & (0o077 if private else OPEN_TO_OTHERS)
    if open_bits:
        raise PathRefused(
            path,
            f"{what} is mode {stat.filemode(info.st_mode)} ({owner_name(info.st_uid)}): "
            f"{'others can reach it' if private else 'others can write in it'}; "
            f"chmod {'0700' if stat.S_ISDIR(info.st_mode) else '0600'} it, or use another",
        )


def private_folder(path, what: str) -> Path:
    """``path`` as a folder only its owner can write: made mode 0700 (its parents as the umask says)
    if absent; an existing one must be a real folder, the user's (or root's), writable by nobody else
    (PathRefused naming it and its owner otherwise)."""
    path = Path(path)
    try:
        path.mkdir(mode=0o700, parents=True)
    except FileExistsError:
        pass
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) and not stat.S_ISLNK(info.st_mode):
        raise PathRefused(path, f"{what} is not a folder")
    check_owned(info, path, what)
    return path
