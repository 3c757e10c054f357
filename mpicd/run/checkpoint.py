"""Per-rank checkpoints, so that a run survives a wall-clock limit, a requeue or a killed job.

Each rank saves its whole state after a round into ``<results>.ckpt/rank<R>.round<N>.<RUN>.pt``
(N = rounds completed, RUN = the run's id, :mod:`mpicd.config.identity`): written to a temporary file,
fsynced, renamed, so a checkpoint is either complete or absent; a file that does not open is
ignored. The last two per rank *of this run* are kept: ranks synchronise every round (the progress
Allreduce), so no rank can be more than one checkpoint ahead of another, and the newest round that
every rank holds always survives; so does the newest at or before the rounds the results file
holds (its rows are flushed every few rounds), where a resume after a crash starts. Another run's checkpoints in the same
folder (a results file deleted and made again, say) are never loaded and never count towards this run's two.

A checkpoint is read back, so it must prove that mpicd wrote it, here, for this client, round and
run: the file is :data:`MAGIC`, an HMAC-SHA-256 under the site key (:mod:`mpicd.core.sitekey`, kept
outside every run folder, never sent) of the rest and of that place, then torch.save's bytes. The MAC
is checked before a byte of the rest is parsed; a file that fails it is refused by name
(:class:`Refused`), nothing in it used: its weights, its privacy ledger and its secret key are only
as good as whoever could write the folder. What passes is still loaded with ``weights_only=True``
(tensors and plain types only: numpy arrays become tensors tagged with :data:`NDARRAY`). The folder
is made mode 0700 and an existing one must be the user's and writable by nobody else
(:func:`mpicd.core.paths.private_folder`). The temporary file of a write has an unpredictable name
and is created exclusively, never through a link (:mod:`mpicd.core.exclusive`).
"""

from __future__ import annotations

import errno
import hmac
import io
import os
import pickletools
import re
import shutil
import zipfile
from collections import OrderedDict
from pathlib import Path

import numpy as np
import torch

from mpicd.core import exclusive, sitekey
from mpicd.core.paths import private_folder

KEEP = 2
MAGIC = b"MPICDCK1"  # then the MAC (32 bytes), the length of the rest (8, big-endian), torch.save's bytes
_MAC_TAG = b"mpicd checkpoint v1"
_NAME = re.compile(r"^rank(\d+)\.round(\d+)(?:\.([0-9a-f]{16}))?\.pt$")  # no id: made before run ids
_TEMPORARY = re.compile(r"^\.rank\d+\.round\d+.*\.tmp$")
_JOURNAL = re.compile(r"^client\d+\.[0-9a-f]{16}\.releases$")  # mpicd.privacy.journal, one per client and run
NDARRAY, NPSCALAR = "__mpicd_ndarray__", "__mpicd_numpy_scalar__"  # a one-key dict holding the tensor
_LEAVES = (int, float, bool, str, bytes, type(None))


class Refused(ValueError):
    """A file with a checkpoint's name that the weights-only loader refuses: not one mpicd wrote."""

    def __init__(self, path: Path, why: str):
        self.path = path
        super().__init__(f"{path}: {why}")


def plain(value):
    """``value`` with every numpy array and scalar as a tagged tensor: what weights_only loads. Any
    other type (an object, a generator, a set) is refused here, at the first checkpoint, not by the
    loader at the resume."""
    if isinstance(value, np.ndarray):
        return {NDARRAY: torch.from_numpy(np.array(value, copy=True, order="C"))}
    if isinstance(value, np.generic):
        return {NPSCALAR: torch.from_numpy(np.array(value).reshape(1))}
    if type(value) in (dict, OrderedDict):  # a state_dict's OrderedDict keeps its _metadata (versions)
        wrong = next((key for key in value if type(key) not in (str, int)), None)
        if wrong is not None:
            raise TypeError(f"a checkpoint's keys are str or int, not {type(wrong).__name__} ({wrong!r})")
        copy = type(value)((key, plain(item)) for key, item in value.items())
        if hasattr(value, "_metadata"):
            copy._metadata = value._metadata
        return copy
    if type(value) in (list, tuple):
        return type(value)(plain(item) for item in value)
    if isinstance(value, torch.Tensor) or type(value) in _LEAVES:
        return value
    raise TypeError(f"a checkpoint holds tensors and plain types only, not {type(value).__qualname__}")


def unplain(value):
    """The inverse of :func:`plain`: the same numpy types and values back (on the CPU, where numpy
    lives, whatever device the tensors were loaded onto)."""
    if isinstance(value, dict):
        if len(value) == 1 and NDARRAY in value:
            return value[NDARRAY].cpu().numpy()
        if len(value) == 1 and NPSCALAR in value:
            return value[NPSCALAR].cpu().numpy()[0]
        copy = type(value)((key, unplain(item)) for key, item in value.items())
        if hasattr(value, "_metadata"):
            copy._metadata = value._metadata
        return copy
    if isinstance(value, (list, tuple)):
        return type(value)(unplain(item) for item in value)
    return value


def folder_for(results: str | Path) -> Path:
    """Checkpoints live beside the results file, never as ``*.h5`` in a sweep's output folder."""
    return Path(f"{results}.ckpt")


def path_for(folder: Path, rank: int, completed: int, run_id: str) -> Path:
    return folder / f"rank{rank}.round{completed}.{run_id}.pt"


def journal_path(folder: Path, client: int, run_id: str) -> Path:
    """Where client ``client`` of run ``run_id`` journals its private releases (mpicd.privacy.journal)."""
    return folder / f"client{int(client)}.{run_id}.releases"


def inventory(folder: Path) -> dict[str | None, dict[int, list[int]]]:
    """Every checkpoint in the folder: {run id (None: made before run ids): {rank: rounds, newest first}}."""
    found: dict[str | None, dict[int, list[int]]] = {}
    if not folder.is_dir():
        return found
    for entry in folder.iterdir():
        match = _NAME.match(entry.name)
        if match:
            rounds = found.setdefault(match.group(3), {}).setdefault(int(match.group(1)), [])
            rounds.append(int(match.group(2)))
    for ranks in found.values():
        for rounds in ranks.values():
            rounds.sort(reverse=True)
    return found


def held(folder: Path, rank: int) -> list[int]:
    """Rounds this rank holds checkpoints for, of any run, newest first (for tools that wait for one)."""
    return sorted({n for ranks in inventory(folder).values() for n in ranks.get(rank, [])}, reverse=True)


def available(folder: Path, rank: int, run_id: str) -> list[int]:
    """Rounds-completed counts this rank holds checkpoints of run ``run_id`` for, newest first."""
    return inventory(folder).get(run_id, {}).get(rank, [])


def save(
    folder: Path,
    rank: int,
    completed: int,
    state: dict,
    run_id: str,
    during=lambda: None,
    claimed: int | None = None,
    key: bytes | None = None,
) -> Path:
    """Atomically write this rank's state after ``completed`` rounds; drop all but this run's
    newest KEEP and, with ``claimed`` (the rounds the results file holds: its rows are flushed
    every few rounds, mpicd.results.writer.flush_interval), the newest at or before it, the one a
    resume after a crash starts from. A failed write (a full disk) removes its temporary file and leaves the older
    checkpoints as they were. ``during``: called with the temporary file written but not yet
    renamed (fault injection: ``debug.fail_at: in_checkpoint``). ``key``: the site key the file is
    MACed under (default: :func:`mpicd.core.sitekey.load`)."""
    key = sitekey.load() if key is None else key
    private_folder(folder, "the checkpoint folder")
    final = path_for(folder, rank, completed, run_id)
    tmp = exclusive.name(folder, f".{final.name}.{os.getpid()}.", ".tmp")
    try:
        with exclusive.open_new(tmp, 0o600) as fh:
            body = io.BytesIO()
            torch.save(plain({**state, "run_id": run_id}), body)
            body = body.getbuffer()
            fh.write(MAGIC + _mac(key, rank, completed, run_id, body) + len(body).to_bytes(8, "big"))
            fh.write(body)
            fh.flush()
            during()
            os.fsync(fh.fileno())
        os.replace(tmp, final)
    except BaseException as err:
        tmp.unlink(missing_ok=True)
        full = disk_full(err)
        if full is None:
            raise
        newest = available(folder, rank, run_id)[:1]
        last = (
            f", the last one took {path_for(folder, rank, newest[0], run_id).stat().st_size / 2**20:.1f} MiB"
            if newest
            else ""
        )
        # torch.save hides the cause in a RuntimeError ("unexpected pos") and its chain: say it plainly
        error = OSError(
            f"cannot write the checkpoint after {completed} rounds in {folder}: {full.strerror} "
            f"({shutil.disk_usage(folder).free / 2**20:.1f} MiB free there{last}); the rounds before it "
            f"are in the results file and the older checkpoints are intact: free space and run again with --resume"
        )
        error.errno = full.errno
        raise error from None
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the rename itself survives a crash
    finally:
        os.close(dir_fd)
    rounds = available(folder, rank, run_id)
    usable = next((c for c in rounds if claimed is None or c <= claimed), None)
    for old in rounds[KEEP:]:
        if old != usable:
            path_for(folder, rank, old, run_id).unlink(missing_ok=True)
    return final


def disk_full(err: BaseException) -> OSError | None:
    """The OSError for want of space (ENOSPC, EDQUOT) in ``err`` or the exceptions it was raised
    from or during, or None."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
            return err
        err = err.__cause__ or err.__context__
    return None


_PARSED = 2**28  # bytes of a refused file parsed for opcodes
_CALLS = ("GLOBAL", "STACK_GLOBAL", "INST", "OBJ", "REDUCE", "NEWOBJ", "NEWOBJ_EX", "BUILD")


def _is_pickle(path: Path) -> bool:
    """Whether the file starts with whole, consistent pickles one of which names or calls something
    (a raw pickle planted there, of any protocol, or torch's legacy format, a few pickles in a row):
    :func:`pickletools.dis` checks the opcodes, stack and memo, and never resolves nor calls what they
    name. Garbage (zeros, a cut-short write) is no such pickle."""
    try:
        with open(path, "rb") as fh:  # in memory: a garbled length (BINBYTES8) then reads what is there
            stream = io.BytesIO(fh.read(_PARSED))
    except OSError:
        return False
    while stream.tell() < len(stream.getbuffer()):
        start = stream.tell()
        try:
            pickletools.dis(stream, out=io.StringIO())  # raises on garbage: stack, memo, arguments
        except Exception:  # noqa: BLE001 - no opcode there, a cut-short argument, an unbalanced stack
            return False
        stream.seek(start)
        if any(op.name in _CALLS for op, _, _ in pickletools.genops(stream)):
            return True
    return False


def _mac(key: bytes, client: int, completed: int, run_id: str, body) -> bytes:
    """The MAC of a checkpoint: of its bytes and of where it belongs (client, rounds, run), so that no
    file passes for another client's, another round's or another run's."""
    return sitekey.mac(key, _MAC_TAG, f"{int(client)} {int(completed)} {run_id}".encode(), bytes(body))


def load(
    folder: Path, rank: int, completed: int, run_id: str, device: torch.device, key: bytes | None = None
) -> dict | None:
    """The state of run ``run_id`` saved after ``completed`` rounds, or None if it is absent or torn
    (bytes that are no checkpoint, no zip and no pickle: zeros after a crash); :class:`Refused`
    naming it when anything else is there: a file whose MAC does not verify under the site key
    ``key`` (default :func:`mpicd.core.sitekey.load`) -- forged, altered, or written under another
    site key -- is refused before a byte of it is parsed; a zip or a pickle without the MAC is
    not one mpicd wrote. What the MAC covers is still loaded with the weights-only loader."""
    path = path_for(folder, rank, completed, run_id)
    key = sitekey.load() if key is None else key
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as err:  # a link planted there (ELOOP), a folder: not a checkpoint mpicd wrote
        raise Refused(path, f"cannot be opened as a checkpoint ({err.strerror or err})") from None
    with os.fdopen(fd, "rb") as fh:
        data = memoryview(fh.read())
    head = len(MAGIC) + 32 + 8
    if bytes(data[: len(MAGIC)]) != MAGIC:
        if zipfile.is_zipfile(path) or _is_pickle(path):
            raise Refused(
                path, "not a checkpoint mpicd wrote: a torch or pickle file without mpicd's MAC; nothing in it was used"
            )
        return None  # not a zip that opens, nor a pickle: garbage where a checkpoint was (zeros after a crash)
    if len(data) < head or len(data) < head + int.from_bytes(data[head - 8 : head], "big"):
        return None  # cut short (a crash): torn, ignored; never used, whoever cut it
    if not hmac.compare_digest(bytes(data[len(MAGIC) : head - 8]), _mac(key, rank, completed, run_id, data[head:])):
        raise Refused(
            path,
            f"its MAC does not verify under the site key {sitekey.location()}: it was altered, forged, or written "
            "under another site key (another user's, or another node's where the key is not shared); nothing "
            "in it was used",
        )
    try:
        state = torch.load(io.BytesIO(data[head:]), map_location=device, weights_only=True)
    except Exception as err:  # noqa: BLE001 - MACed by this site yet refused: say so, never use it
        raise Refused(path, f"its MAC verifies but the weights-only loader refused it ({err})") from None
    if not isinstance(state, dict) or state.get("run_id") != run_id:  # the MAC binds it; checked all the same
        return None
    return unplain(state)


def discard(folder: Path, rank: int, run_id: str, newer_than: int = -1) -> None:
    """Delete this rank's checkpoints of run ``run_id`` past round ``newer_than`` (-1: all of them),
    and every temporary file of this rank and run: one that a killed write left behind (SIGKILL
    inside :func:`save` skips its clean-up) is never a checkpoint, and none of this rank's writes
    is in flight when it calls this (else a complete run's folder would never be empty)."""
    for completed in available(folder, rank, run_id):
        if completed > newer_than:
            path_for(folder, rank, completed, run_id).unlink(missing_ok=True)
    if folder.is_dir():
        torn = re.compile(rf"^\.rank{rank}\.round\d+\.{re.escape(run_id)}\.pt\.\d+(\.[0-9a-f]{{16}})?\.tmp$")
        for entry in folder.iterdir():
            if torn.match(entry.name):
                entry.unlink(missing_ok=True)


def remove_all(folder: Path) -> int:
    """Delete every checkpoint (and torn temporary file, and release journal) in the folder, of any
    run; the folder too if that leaves it empty. Returns the number of files deleted (``--overwrite``)."""
    if not folder.is_dir():
        return 0
    removed = 0
    for entry in folder.iterdir():
        if _NAME.match(entry.name) or _TEMPORARY.match(entry.name) or _JOURNAL.match(entry.name):
            entry.unlink(missing_ok=True)
            removed += 1
    try:
        folder.rmdir()
    except OSError:
        pass  # something else lives there: leave it
    return removed
