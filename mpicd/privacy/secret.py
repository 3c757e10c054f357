"""The secret randomness a private release rests on: a key per client that never leaves its site.

A release is private against the peer that receives it only if that peer cannot redraw its
Poisson sample and noise, and only if no other release it can see was drawn with the same noise
(the difference of two releases with equal noise is the difference of their clipped sums, exact).
The run's seed is in every rank's config and in the results file, so nothing keyed by it can be;
each client instead holds a 32-byte key from the operating system's entropy (:func:`new_key`), kept
in memory and in the rank's own checkpoint (mode 0600, at the site), never sent over MPI,
never written to the results file or the config.

:class:`SecretStream` is the generator of one use of that key in one run (the run's nonce; client,
round, use): SHAKE-256 (FIPS 202) of a domain tag, the key, the nonce and the use's words, read as an
extendable output, is a
pseudorandom function of the key (keyed SHA-3 has no length extension; this is KMAC's
construction without its encoding), so its bytes are indistinguishable from uniform to anyone
without the key. It offers the two draws the mechanisms make, with the numpy ``Generator``
signatures they call: :meth:`~SecretStream.random` (uniforms, for the Poisson sample) and
:meth:`~SecretStream.normal` (Box-Muller on those uniforms, for the Gaussian noise). Each call
reads the next block of the output, so a stream used in the same order gives the same draws: a
resumed run, holding the same key and nonce, redraws exactly what the uninterrupted run drew.

The nonce (:data:`NONCE_BYTES`, the run id's 64 random bits unless ``privacy.nonce`` names another run's)
is what keeps a key that outlives a run (``privacy.key_dir``) from drawing one stream twice: two runs,
two packed runs or a run started again with ``--overwrite`` at one site have different run ids, so
no (key, nonce, client, round, use) repeats.

Floating point: the normals are float64 Box-Muller of 53-bit uniforms, the same class of sampler
as numpy's and Opacus' (not a certified floating-point-safe Gaussian: Mironov 2012).
"""

from __future__ import annotations

import hashlib
import os
import secrets
import stat
import struct
from pathlib import Path

import numpy as np

from mpicd.core import exclusive
from mpicd.core.paths import check_owned, PathRefused, private_folder, refuse_link

KEY_BYTES = 32
NONCE_BYTES = 8
_TAG = b"mpicd privacy stream v2\x00"


def new_key() -> bytes:
    """32 bytes from the operating system's CSPRNG (``secrets``, i.e. getrandom / /dev/urandom)."""
    return secrets.token_bytes(KEY_BYTES)


def nonce_bytes(nonce: str) -> bytes:
    """A run's nonce (16 hex digits, as the results file's attr ``privacy_nonce``) as its 8 bytes."""
    try:
        raw = bytes.fromhex(nonce)
    except (TypeError, ValueError):
        raw = b""
    if len(raw) != NONCE_BYTES:
        raise ValueError(f"privacy: a run's nonce is {2 * NONCE_BYTES} hex digits, got {nonce!r}")
    return raw


def check_key(key) -> bytes:
    key = bytes(key)
    if len(key) != KEY_BYTES:
        raise ValueError(f"privacy: a client's secret key is {KEY_BYTES} bytes, got {len(key)}")
    return key


class SecretStream:
    """Uniforms and normals of one use (``words``: client, round, use) of a client's key in the run
    of ``nonce`` (:func:`nonce_bytes`).

    Every call takes a fresh block: SHAKE-256(tag, key, nonce, words, call number), as many bytes
    as the call needs (8 per uniform). Nothing about the key can be learnt from the draws."""

    def __init__(self, key: bytes, nonce: bytes, *words: int):
        nonce = bytes(nonce)
        if len(nonce) != NONCE_BYTES:
            raise ValueError(f"privacy: a run's nonce is {NONCE_BYTES} bytes, got {len(nonce)}")
        packed = struct.pack(f">{len(words)}q", *(int(w) for w in words))
        self._prefix = _TAG + check_key(key) + nonce + packed
        self._calls = 0

    def _words(self, n: int) -> np.ndarray:
        block = hashlib.shake_256(self._prefix + struct.pack(">q", self._calls)).digest(8 * n)
        self._calls += 1
        return np.frombuffer(block, dtype=">u8").astype(np.uint64)

    def random(self, size=None) -> np.ndarray | float:
        """Uniforms on [0, 1): the top 53 bits of each 64-bit word, times 2**-53."""
        n = 1 if size is None else int(np.prod(size))
        u = (self._words(n) >> np.uint64(11)).astype(np.float64) * 2.0**-53
        return float(u[0]) if size is None else u.reshape(size)

    def normal(self, loc: float = 0.0, scale: float = 1.0, size=None) -> np.ndarray | float:
        """N(loc, scale^2) by Box-Muller: pairs of uniforms (u1 on (0, 1], u2), both of its normals."""
        scale = float(scale)
        if not scale >= 0:
            raise ValueError(f"privacy: a noise scale must be >= 0, got {scale!r}")
        n = 1 if size is None else int(np.prod(size))
        pairs = (n + 1) // 2
        u = self.random(2 * pairs).reshape(pairs, 2)
        radius = np.sqrt(-2.0 * np.log1p(-u[:, 0]))  # 1 - u1 is in (0, 1]: the log is finite
        angle = 2.0 * np.pi * u[:, 1]
        z = np.stack([radius * np.cos(angle), radius * np.sin(angle)], axis=1).reshape(-1)[:n]
        z = loc + scale * z
        return float(z[0]) if size is None else z.reshape(size)


def key_file(key_dir, client: int) -> Path:
    return Path(key_dir) / f"client-{int(client)}.key"


def site_key(key_dir, client: int, create: bool = True) -> bytes | None:
    """Client ``client``'s key in ``key_dir`` (``privacy.key_dir``), made now if the file is absent and
    ``create`` (else None: a resume makes no key, it takes the checkpoint's).

    The folder must not be a link, must belong to the running user (or root) and be writable by nobody
    else; made mode 0700 if absent. The key file, 64 hex digits, is created with O_EXCL | O_NOFOLLOW,
    mode 0600, and is read (through the folder opened without following a link) only if it is a
    regular file, the user's or root's, that nobody else can read or write. Otherwise PathRefused (a
    ValueError) naming the path (and its owner): a key another user planted, or can read, is a key they
    know (:mod:`mpicd.core.paths`)."""
    folder = Path(key_dir)
    refuse_link(folder, "privacy.key_dir", flag=None)
    if not folder.exists():
        if not create:
            return None
        private_folder(folder, "privacy.key_dir")
    path = key_file(folder, client)
    try:
        dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as err:
        raise PathRefused(folder, f"privacy.key_dir cannot be opened as a folder ({err.strerror})") from None
    try:
        check_owned(os.fstat(dir_fd), folder, "privacy.key_dir")
        if create:
            try:
                fd = os.open(path.name, exclusive.FLAGS, 0o600, dir_fd=dir_fd)
                with os.fdopen(fd, "wb") as fh:
                    fh.write(new_key().hex().encode() + b"\n")
            except FileExistsError:
                pass
        try:
            fd = os.open(path.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        except FileNotFoundError:
            if not create:
                return None
            raise
        except OSError as err:
            raise PathRefused(path, f"privacy.key_dir: cannot be read as a key file ({err.strerror})") from None
    finally:
        os.close(dir_fd)
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fh.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_mode & 0o077:
            raise PathRefused(
                path,
                "privacy.key_dir: a key file must be a regular file only its owner can access (mode 0600), "
                f"is {stat.filemode(info.st_mode)}",
            )
        check_owned(info, path, "privacy.key_dir's key file", private=True)
        text = fh.read(4 * KEY_BYTES).strip()
    try:
        return check_key(bytes.fromhex(text.decode("ascii")))
    except (ValueError, UnicodeDecodeError):
        raise PathRefused(path, f"privacy.key_dir: does not hold a key ({2 * KEY_BYTES} hex digits)") from None
