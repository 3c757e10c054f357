"""The dataset read once per node: one rank of each node loads it, the node's ranks share it read-only.

If every rank loaded the dataset, a node would decode it N times and hold N copies. Here the
lowest rank of each node (``COMM_TYPE_SHARED``) loads it, copies every array of train/test/val
into one MPI shared-memory window (``MPI.Win.Allocate_shared``; the others allocate 0 bytes and
map the leader's segment) and every rank wraps read-only numpy arrays over it: one copy per node,
whatever the rank count. Everything else about the dataset (array layouts, class names, split
descriptions, normalization) travels as a small JSON byte array through :class:`mpicd.mpi.comm.Comm`,
counted in the caller's ledger outside the rounds; no array is ever pickled.

A ConfigError on the loading rank travels the same way, so every rank of the node raises the same
error at the same point and none is left in a collective (the caller's ``agreed`` settles it
across nodes). Any other exception there aborts the job (``abort_on_exception``).
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import os
import warnings
from collections.abc import Callable

import numpy as np
from mpi4py import MPI

from mpicd.config.sections import ConfigError
from mpicd.data import Arrays, Dataset
from mpicd.mpi.comm import Comm

_ALIGN = 64  # every array starts on a cache line

# mpicd never writes into dataset arrays, and on a GPU they are copied to the device anyway; torch's
# warning about wrapping a read-only array would only repeat this on every rank.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable", category=UserWarning)


class SharedMemory:
    """The window holding a node's dataset; ``free`` releases it (collective over the node's ranks).

    Freed at interpreter exit if nobody did before (all ranks of a node leave ``main`` together; a
    failing rank aborts the job instead, so this never waits for a dead peer). After ``free`` the
    arrays over it must not be touched.
    """

    def __init__(self, win: MPI.Win, nbytes: int):
        self.win: MPI.Win | None = win
        self.nbytes = nbytes
        atexit.register(self.free)

    def free(self) -> None:
        if self.win is not None and not MPI.Is_finalized():
            self.win.Free()
        self.win = None
        atexit.unregister(self.free)


def _layout(dataset: Dataset) -> tuple[dict, list[np.ndarray]]:
    """The dataset as JSON-able metadata (fields, array slots in the window) and its arrays in slot order."""
    meta: dict = {"fields": {}, "tuples": [], "splits": {}, "arrays": []}
    arrays, offset = [], 0
    for f in dataclasses.fields(dataset):
        value = getattr(dataset, f.name)
        if isinstance(value, Arrays) or (value is None and f.name in ("train", "test", "val")):
            meta["splits"][f.name] = None if value is None else []
            for part in ("x", "y") if value is not None else ():
                a = getattr(value, part)
                meta["splits"][f.name].append(len(arrays))
                meta["arrays"].append({"dtype": a.dtype.str, "shape": list(a.shape), "offset": offset})
                arrays.append(a)
                offset += -(-a.nbytes // _ALIGN) * _ALIGN
        else:
            meta["fields"][f.name] = value
            if isinstance(value, tuple):
                meta["tuples"].append(f.name)
    meta["nbytes"] = offset
    return meta, arrays


def check_room(nbytes: int, folder: str = "/dev/shm") -> None:
    """Open MPI backs the window with a file in /dev/shm: past its free space the ranks would die of
    SIGBUS when they touch the pages (containers often give it 64 MiB), so stop with a message."""
    if os.path.isdir(folder):
        stat = os.statvfs(folder)
        free = stat.f_bavail * stat.f_frsize
        if free < nbytes:
            raise ConfigError(
                "data.path",
                f"the dataset needs {nbytes / 2**20:.1f} MiB of shared memory on each "
                f"node but {folder} has {free / 2**20:.1f} MiB free; enlarge it (in a "
                f"container: docker run --shm-size=...)",
            )


def _encode(load: Callable[[], Dataset]) -> tuple[bytes, list[np.ndarray]]:
    """Run ``load``; its metadata as JSON bytes and its arrays, or a ConfigError as JSON and no arrays."""
    try:
        meta, arrays = _layout(load())
        check_room(meta["nbytes"])
    except ConfigError as err:
        meta, arrays = {"error": [err.key, str(err)]}, []
    return json.dumps(meta).encode(), arrays


def _config_error(key: str, text: str) -> ConfigError:
    """The leader's ConfigError, word for word, on this rank."""
    err = ConfigError(key, "")
    err.args = (text,)
    return err


def _read_only(dataset: Dataset) -> Dataset:
    for f in dataclasses.fields(dataset):
        value = getattr(dataset, f.name)
        if isinstance(value, Arrays):
            value.x.flags.writeable = value.y.flags.writeable = False
    return dataset


def load_shared(comm: Comm, load: Callable[[], Dataset]) -> tuple[Dataset, SharedMemory | None]:
    """``load()`` on the lowest rank of each node, shared with the node's ranks; collective over ``comm``.

    Returns a Dataset whose arrays are read-only views of the node's window (bit for bit what
    ``load()`` returned) and the window, which must outlive them. A ConfigError of ``load`` is
    raised on every rank of the node. A rank alone on its node keeps its own load (read-only too):
    nothing to share, so no copy and no window (None).
    """
    node_mpi = comm.mpi.Split_type(MPI.COMM_TYPE_SHARED, key=comm.rank)
    if node_mpi.Get_size() == 1:
        node_mpi.Free()
        return _read_only(load()), None
    try:
        node = Comm(node_mpi)
        node.ledger = comm.ledger  # the metadata bytes count in the caller's ledger, outside rounds
        leader = node.rank == 0
        text, arrays = _encode(load) if leader else (b"", [])
        size = node.bcast(np.array([len(text)], dtype=np.int64), channel="dataset")
        raw = node.bcast(
            np.frombuffer(text, dtype=np.uint8).copy() if leader else np.empty(size[0], np.uint8), channel="dataset"
        )
        meta = json.loads(raw.tobytes())
        if "error" in meta:
            raise _config_error(*meta["error"])
        win = MPI.Win.Allocate_shared(meta["nbytes"] if leader else 0, 1, comm=node_mpi)
        memory = SharedMemory(win, meta["nbytes"])
        buffer, _ = win.Shared_query(0)
        base = np.frombuffer(buffer, dtype=np.uint8)
        views = []
        for slot in meta["arrays"]:
            dtype, shape = np.dtype(slot["dtype"]), tuple(slot["shape"])
            nbytes = dtype.itemsize * int(np.prod(shape, dtype=np.int64))
            views.append(base[slot["offset"] : slot["offset"] + nbytes].view(dtype).reshape(shape))
        for view, array in zip(views, arrays):  # the leader only
            view[...] = array
        del arrays
        win.Fence()  # the leader's stores are visible to every rank of the node from here on
        for view in views:
            view.flags.writeable = False
    finally:
        node_mpi.Free()  # the window keeps its own reference to the node's group
    fields = {name: tuple(v) if name in meta["tuples"] else v for name, v in meta["fields"].items()}
    for split, slots in meta["splits"].items():
        fields[split] = None if slots is None else Arrays(views[slots[0]], views[slots[1]])
    return Dataset(**fields), memory
