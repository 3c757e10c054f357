"""The site key: 32 secret bytes that never leave the machines of the user who runs mpicd.

What mpicd writes and later reads back as trusted (a checkpoint: a client's weights, its privacy
ledger, its secret key) must prove that mpicd wrote it, here: anyone able to write the file could
otherwise hand a resume a smaller epsilon or other weights. The proof is an HMAC-SHA-256 under this
key, which lives outside every run folder, in a file only its owner can read: ``$MPICD_SITE_KEY``,
or ``$XDG_CONFIG_HOME/mpicd/site.key`` (``~/.config/mpicd/site.key``). It is made on first use
(64 hex digits from the operating system's CSPRNG; created exclusively, without following a link,
mode 0600, in a folder made 0700) and read only if it and its folder belong to the user (or root),
the file is mode 0600 and the folder writable by nobody else (:mod:`mpicd.core.paths`). It is never
sent over MPI: every rank reads it from its own file system, so on a cluster the path must be one
every node shares (a home folder usually is), else a checkpoint written on one node fails on another.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
from pathlib import Path

from mpicd.core import exclusive
from mpicd.core.paths import check_owned, PathRefused, private_folder

KEY_BYTES = 32
ENV = "MPICD_SITE_KEY"


def location() -> Path:
    """Where this user's site key is: ``$MPICD_SITE_KEY``, else under ``$XDG_CONFIG_HOME`` or ``~/.config``."""
    named = os.environ.get(ENV)
    if named:
        return Path(named).expanduser()
    config = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(config) / "mpicd" / "site.key"


def load(path=None) -> bytes:
    """The site key at ``path`` (default :func:`location`), made now if absent; PathRefused naming the
    file (or its folder) and its owner when it is not the user's alone, or does not hold a key."""
    path = Path(path) if path is not None else location()
    private_folder(path.parent, "the site key's folder")
    if not os.path.lexists(path):
        _make(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as err:
        raise PathRefused(path, f"the site key cannot be read ({err.strerror or err})") from None
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fh.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise PathRefused(path, "the site key is not a regular file")
        check_owned(info, path, "the site key", private=True)
        text = fh.read(4 * KEY_BYTES).strip()
    try:
        key = bytes.fromhex(text.decode("ascii"))
    except (ValueError, UnicodeDecodeError):
        key = b""
    if len(key) != KEY_BYTES:
        raise PathRefused(path, f"does not hold a site key ({2 * KEY_BYTES} hex digits)")
    return key


def _make(path: Path) -> None:
    """A new key at ``path``, written whole under a temporary name, then linked into place: a reader
    never sees half a key, and a key another rank made first is never replaced."""
    try:
        temporary, fh = exclusive.create(path.parent, f".{path.name}.", ".tmp", 0o600)
        try:
            with fh:
                fh.write(secrets.token_bytes(KEY_BYTES).hex().encode() + b"\n")
                fh.flush()
                os.fsync(fh.fileno())
            try:
                os.link(temporary, path)
            except FileExistsError:
                pass
        finally:
            temporary.unlink(missing_ok=True)
    except OSError as err:
        if not os.path.lexists(path):
            raise PathRefused(path, f"the site key cannot be made ({err.strerror or err})") from None


def mac(key: bytes, *parts: bytes) -> bytes:
    """HMAC-SHA-256 under ``key`` of ``parts``, each length-prefixed (no two splits of one byte string agree)."""
    h = hmac.new(key, digestmod=hashlib.sha256)
    for part in parts:
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    return h.digest()
