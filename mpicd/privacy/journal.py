"""What one client has released in one run, on disk before the release leaves its rank.

A client's accountant is saved with its checkpoint, after the round. A job killed between a release
and that checkpoint (or whose newest checkpoint is lost) resumes from an older one and computes the
rounds after it again: without a record its accountant would not know what had already left, and a
release computed again that differs from the one that left (another CPU model, another thread
count, a kernel that is not deterministic) carries the same noise on another sum, so a peer holding
both subtracts the noise away. The journal closes both: one line per release -- round, slot (its
place among the round's releases: CCVR's last round has DP-SGD's steps, then its statistics), sample
rate, noise multiplier, composed steps, and the SHA-256 of the payload -- appended and fsynced before the
payload is handed on to be sent. A release computed again in a round the journal holds must be the
one that left, byte for byte (then it is that release, counted once), or it is refused
(:class:`ReleaseMismatch`); and a run whose journal holds releases is never started again at round 1
(mpicd.run.resume).

The file is the site's, beside the client's checkpoints (mode 0600, created without following a
link). Each line carries an HMAC-SHA-256 under the site key (:mod:`mpicd.core.sitekey`) of itself,
the file's name (client and run) and the line before's MAC: a line altered, added, moved from another
client's journal, dropped or reordered fails to verify, and the journal does not read (the run stops,
naming it). A line cut short by a crash is the last line, written before anything was sent: it is
ignored, and cut off before the next line is appended.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mpicd.core import sitekey

_TAG = b"mpicd release journal v1"


@dataclass(frozen=True)
class Entry:
    """One release: its round (from 0) and slot, sample rate q, noise multiplier, composed steps and digest."""

    round: int
    slot: int
    q: float
    multiplier: float
    steps: int
    digest: str

    def accounting(self) -> tuple[float, float, int]:
        return (self.q, self.multiplier, self.steps)


SLOTS = 2
"""Releases a client makes in one round at most: DP-SGD's steps (or one release), then CCVR's statistics."""


class ReleaseMismatch(RuntimeError):
    """A release computed again after a restart is not the one the journal says left the rank."""


def digest(payload) -> str:
    """SHA-256 of what is sent: a numpy array's dtype, shape and bytes, or of each array (or tensor)
    of a sequence in turn (DP-SGD: the model's parameters)."""
    h = hashlib.sha256()
    parts = payload if isinstance(payload, (list, tuple)) else [payload]
    for part in parts:
        array = part.detach().cpu().numpy() if hasattr(part, "detach") else np.asarray(part)
        array = np.ascontiguousarray(array)
        h.update(f"{array.dtype.str}{array.shape}".encode())
        h.update(array.tobytes())
    return h.hexdigest()


class Journal:
    """The append-only release record of one client of one run at ``path``."""

    def __init__(self, path: str | Path, key: bytes | None = None):
        """``key``: the site key its lines are MACed under (default :func:`mpicd.core.sitekey.load`)."""
        self.path = Path(path)
        self.key = sitekey.load() if key is None else key
        self.entries: dict[tuple[int, int], Entry] = {}
        self._last = b""  # the MAC of the last line: the next one's chains to it
        if self.path.exists():
            self.entries, self._last = _read(self.path, self.key)
            _cut_torn_line(self.path)  # so that the next line starts a line of its own

    def __len__(self) -> int:
        return len(self.entries)

    def get(self, round_index: int, slot: int) -> Entry | None:
        return self.entries.get((int(round_index), int(slot)))

    def record(self, entry: Entry) -> None:
        """Append ``entry`` and fsync it (and, on the first line, the folder's new name)."""
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fields = {"round": entry.round, "slot": entry.slot, "q": entry.q, "multiplier": entry.multiplier,
                  "steps": entry.steps, "digest": entry.digest}  # fmt: skip
        mac = _mac(self.key, self.path, self._last, fields)
        line = json.dumps({**fields, "mac": mac.hex()}, sort_keys=True) + "\n"
        first = not self.path.exists()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, line.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        if first:
            folder = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(folder)
            finally:
                os.close(folder)
        self.entries[entry.round, entry.slot] = entry
        self._last = mac


def _mac(key: bytes, path: Path, previous: bytes, fields: dict) -> bytes:
    return sitekey.mac(key, _TAG, path.name.encode(), previous, json.dumps(fields, sort_keys=True).encode())


def read(path: str | Path, key: bytes | None = None) -> dict[tuple[int, int], Entry]:
    """{(round, slot): entry} of a journal file; ValueError naming the file and line when a whole line
    (one that ends in a newline) is not an entry, or its MAC under the site key ``key`` (default
    :func:`mpicd.core.sitekey.load`) does not verify. A last line without its newline was cut short by
    a crash before its release was sent: ignored."""
    return _read(Path(path), sitekey.load() if key is None else key)[0]


def _read(path: Path, key: bytes) -> tuple[dict[tuple[int, int], Entry], bytes]:
    """The entries and the last line's MAC."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as fh:
        text = fh.read().decode("utf-8", errors="replace")
    entries: dict[tuple[int, int], Entry] = {}
    lines, last = text.split("\n"), b""
    for number, line in enumerate(lines[:-1], 1):  # the last piece has no newline: torn or empty
        try:
            raw = json.loads(line)
            mac = bytes.fromhex(raw.pop("mac"))
            entry = Entry(int(raw["round"]), int(raw["slot"]), float(raw["q"]), float(raw["multiplier"]),
                          int(raw["steps"]), str(raw["digest"]))  # fmt: skip
        except (ValueError, KeyError, TypeError, AttributeError):
            raise ValueError(f"{path}: line {number} is not a release entry: {line[:80]!r}") from None
        if not hmac.compare_digest(mac, _mac(key, path, last, raw)):
            raise ValueError(
                f"{path}: line {number}'s MAC does not verify under the site key {sitekey.location()}: the journal "
                "was altered (a line changed, added, dropped, reordered or copied from another client's)"
            )
        entries[entry.round, entry.slot], last = entry, mac
    return entries, last


def _cut_torn_line(path: Path) -> None:
    """Truncate the file after its last newline (a line cut short by a crash: nothing was sent after
    it) and fsync, so that an append never joins it."""
    fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        data = os.pread(fd, os.fstat(fd).st_size, 0)
        keep = data.rfind(b"\n") + 1
        if keep != len(data):
            os.ftruncate(fd, keep)
            os.fsync(fd)
    finally:
        os.close(fd)
