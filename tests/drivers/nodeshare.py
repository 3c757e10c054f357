"""Run under mpiexec: the node-shared dataset (mpicd.data.node_shared) against a private load, on every rank.

``check CONFIG [key=value ...]``: ``prepare(config)`` and ``prepare(config, comm)`` in one job; every
array equal bit for bit, dtype and shape, every other Dataset field equal, the shared arrays
read-only and (more than one rank) inside one MAP_SHARED mapping of the same file on every rank
(the private ones in a private mapping), the metadata counted in the ledger outside rounds; the
window released, a second one left to be freed at exit (one rank: its own load, no window). Then
``data.path`` set to a missing file: every rank raises the ConfigError of a private load, word for
word. Prints ``rank R ok``.

``run CONFIG OUT_DIR [key=value ...]``: the round loop on a private load writes OUT_DIR/private.h5,
then ``mpicd run`` (shared, the CLI in this process) writes OUT_DIR/shared.h5.
"""

import dataclasses
import os
import sys
from pathlib import Path

import numpy as np

from mpicd.config.loading import load_config
from mpicd.config.sections import ConfigError
from mpicd.data import Arrays
from mpicd.mpi.comm import Comm
from mpicd.mpi.placement import abort_on_exception
from mpicd.run.plan import prepare

comm = Comm()
mode, config_path = sys.argv[1], sys.argv[2]


def mapping_of(array: np.ndarray) -> tuple[str, int, int]:
    """(permissions, device, inode) of the /proc/self/maps line holding the array's first byte."""
    address = array.__array_interface__["data"][0]
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            start, end = (int(v, 16) for v in fields[0].split("-"))
            if start <= address < end:
                major, minor = (int(v, 16) for v in fields[3].split(":"))
                return fields[1], os.makedev(major, minor), int(fields[4])
    raise AssertionError(f"rank {comm.rank}: address {address:#x} is in no mapping")


def check(overrides: list[str]) -> None:
    config = load_config(config_path, [f"clients={comm.size}", *overrides])
    private = prepare(config)
    before = comm.ledger.outside_rounds.bytes_sent["bcast"], comm.ledger.outside_rounds.bytes_recv["bcast"]
    plan = prepare(config, comm)
    mine, theirs = plan.dataset, private.dataset
    names = [f.name for f in dataclasses.fields(mine)]
    inodes = []
    for name in names:
        a, b = getattr(mine, name), getattr(theirs, name)
        if not isinstance(b, Arrays):
            assert type(a) is type(b) and a == b, (comm.rank, name, a, b)
            continue
        for part in ("x", "y"):
            x, y = getattr(a, part), getattr(b, part)
            assert x.dtype == y.dtype and x.shape == y.shape, (comm.rank, name, part, x.dtype, x.shape)
            assert x.tobytes() == y.tobytes(), f"rank {comm.rank}: {name}.{part} differs from a private load"
            assert not x.flags.writeable and y.flags.writeable, (comm.rank, name, part)
            try:
                x.reshape(-1)[0] = 0
                raise AssertionError(f"rank {comm.rank}: {name}.{part} could be written")
            except ValueError:
                pass
            assert mapping_of(y)[0][3] == "p", (comm.rank, name, part, mapping_of(y))
            if comm.size > 1:  # alone on its node, Open MPI backs the window with private memory
                perms, device, inode = mapping_of(x)
                assert perms[3] == "s" and inode != 0, (comm.rank, name, part, perms, inode)
                inodes += [device, inode]
    # one segment per node: every rank maps the same file (this box is one node)
    everyone = comm.allgather(np.array(inodes, dtype=np.int64), channel="payload")
    assert (everyone == everyone[0]).all() and len(set(inodes[1::2])) == (comm.size > 1), everyone
    sent = comm.ledger.outside_rounds.bytes_sent["bcast"] - before[0]
    recv = comm.ledger.outside_rounds.bytes_recv["bcast"] - before[1]
    counted = comm.allgather(np.array([sent, recv], dtype=np.int64), channel="payload")
    if comm.size > 1:  # alone on its node a rank keeps its own load: no window, nothing sent
        assert counted[0, 0] > 8 and counted[0, 1] == 0, counted  # rank 0 leads the node: it only sends
        assert (counted[1:, 0] == 0).all() and (counted[1:, 1] == counted[0, 0]).all(), counted
    assert (plan.shared is None) == (comm.size == 1) and (counted == 0).all() == (comm.size == 1)
    plan.release()
    assert plan.shared is None or plan.shared.win is None
    again = prepare(config, comm)  # a second window, left to be freed at exit

    bad = load_config(config_path, [f"clients={comm.size}", *overrides, "data.path=/nonexistent/data.npz"])
    messages = []
    for share in (None, comm):
        try:
            prepare(bad, share)
            raise AssertionError(f"rank {comm.rank}: a missing data.path was accepted")
        except ConfigError as err:
            messages.append((err.key, str(err)))
    assert messages[0] == messages[1] and messages[0][0] == "data.path", messages
    assert again.dataset.train.x.tobytes() == theirs.train.x.tobytes()
    print(f"rank {comm.rank} ok", flush=True)


def run(out: Path, overrides: list[str]) -> None:
    from mpicd.cli import main
    from mpicd.mpi.placement import place
    from mpicd.run.loop import run_rounds

    config = load_config(config_path, [f"clients={comm.size}", *overrides])
    plan = prepare(config)
    run_rounds(plan, comm, place(comm.mpi, config.device), out / "private.h5", log=lambda line: None)
    assert plan.shared is None
    status = main(["run", config_path, f"clients={comm.size}", *overrides, "--out", str(out / "shared.h5")])
    assert status == 0, status
    print(f"rank {comm.rank} ok", flush=True)


with abort_on_exception(comm.mpi):
    if mode == "check":
        check(sys.argv[3:])
    else:
        run(Path(sys.argv[3]), sys.argv[4:])
