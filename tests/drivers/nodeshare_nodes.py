"""Run under mpirun across nodes: who reads the dataset, and what every rank gets (argv: CONFIG LOG).

``mpicd.run.plan.load_dataset`` is wrapped so that each call appends "HOST RANK" to LOG (a file on the
shared file system; one short O_APPEND write per line). Then ``prepare(config, comm)`` (the node-shared
load, as ``mpicd run`` does it) and a private, unwrapped load: every array equal bit for bit, dtype
and shape, read-only; the (device, inode) of the mapping that holds the shared train images, which
the test compares within and across nodes. Writes ``rank R HOST DEVICE INODE`` to LOG.rank<R>
(one file per rank: the ranks' stdout lines interleave when forwarded from two nodes).
"""

import os
import socket
import sys

import numpy as np

import mpicd.run.plan
from mpicd.config.loading import load_config
from mpicd.data import Arrays, load_dataset
from mpicd.mpi.comm import Comm
from mpicd.mpi.placement import abort_on_exception

comm = Comm()
config_path, log = sys.argv[1], sys.argv[2]


def counted(data_config):
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{socket.gethostname()} {comm.rank}\n".encode())
    finally:
        os.close(fd)
    return load_dataset(data_config)


def mapping_of(array: np.ndarray) -> tuple[int, int]:
    """(device, inode) of the /proc/self/maps line holding the array's first byte (0, 0: anonymous)."""
    address = array.__array_interface__["data"][0]
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            start, end = (int(v, 16) for v in fields[0].split("-"))
            if start <= address < end:
                major, minor = (int(v, 16) for v in fields[3].split(":"))
                return os.makedev(major, minor), int(fields[4])
    raise AssertionError(f"rank {comm.rank}: address {address:#x} is in no mapping")


with abort_on_exception(comm.mpi):
    config = load_config(config_path, [f"clients={comm.size}"])
    mpicd.run.plan.load_dataset = counted
    shared = mpicd.run.plan.prepare(config, comm).dataset
    private = load_dataset(config.data)
    for name in ("train", "test", "val"):
        a, b = getattr(shared, name), getattr(private, name)
        assert isinstance(a, Arrays) == isinstance(b, Arrays), (comm.rank, name)
        for part in ("x", "y") if isinstance(b, Arrays) else ():
            x, y = getattr(a, part), getattr(b, part)
            assert x.dtype == y.dtype and x.shape == y.shape, (comm.rank, name, part)
            assert x.tobytes() == y.tobytes(), f"rank {comm.rank}: {name}.{part} differs from a private load"
            assert not x.flags.writeable, (comm.rank, name, part)
    device, inode = mapping_of(shared.train.x)
    with open(f"{log}.rank{comm.rank}", "w") as out:
        out.write(f"rank {comm.rank} {socket.gethostname()} {device} {inode}\n")
    comm.mpi.Barrier()
