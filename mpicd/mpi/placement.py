"""Where this rank lives: rank, local rank, device, threads, and abort-on-exception.

One rank is one client. The local rank (rank among the processes of this node, from
``COMM_TYPE_SHARED``) picks the GPU among the visible ones, so CUDA_VISIBLE_DEVICES and Slurm's
GPU binding are honoured; without GPUs the node's cores are split between its ranks.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from mpi4py import MPI

from mpicd.core.schema import ConfigError


@dataclass(frozen=True)
class Placement:
    rank: int
    size: int
    local_rank: int
    local_size: int
    device: str  # "cpu" or "cuda:<i>"
    threads: int  # torch intra-op threads on CPU


def local_rank_and_size(comm: MPI.Comm) -> tuple[int, int]:
    """Rank among the processes sharing this node's memory, and how many there are."""
    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    try:
        return node.Get_rank(), node.Get_size()
    finally:
        node.Free()


def visible_gpus(environ: Mapping[str, str], installed: int | None = None) -> list[str]:
    """The GPUs CUDA shows this process, in CUDA's order, as CUDA_VISIBLE_DEVICES names them.

    Unset: every installed GPU ("0".."installed-1"). Set: its comma-separated entries, indices or
    ``GPU-``/``MIG-`` UUIDs, up to the first invalid one (not a non-negative index, or an index
    >= ``installed`` where that is known): CUDA shows only the GPUs before it ("0,2,-1,1": 0 and 2).
    Empty: none. Torch's ``cuda:i`` is the i-th of these. Slurm's GPU binding works by setting it.
    """
    value = environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return [str(i) for i in range(installed or 0)]
    shown: list[str] = []
    for entry in (e.strip() for e in value.split(",")) if value.strip() else ():
        index_ok = entry.isdigit() and (installed is None or int(entry) < installed)
        if not (index_ok or entry.startswith(("GPU-", "MIG-"))):
            break
        shown.append(entry)
    return shown


def gpu_for(local_rank: int, visible: Sequence[str]) -> tuple[int, str] | None:
    """(torch's index, the GPU as CUDA_VISIBLE_DEVICES names it) of the rank with this local rank:
    the node's ranks take the visible GPUs in turn, so with more ranks than GPUs they share them
    round robin; None without a GPU."""
    if not visible:
        return None
    index = local_rank % len(visible)
    return index, visible[index]


def choose_device(requested: str, local_rank: int, gpu_count: int) -> str:
    """auto: a GPU by local rank where there is one; cpu: CPU; cuda: a GPU or an error."""
    gpu = gpu_for(local_rank, [str(i) for i in range(gpu_count)])
    if requested == "cpu" or (requested == "auto" and gpu is None):
        return "cpu"
    if gpu is None:
        raise ConfigError(
            "device",
            "cuda was requested but no GPU is visible "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})",
        )
    return f"cuda:{gpu[0]}"


def cpu_threads(local_size: int) -> int:
    """Slurm's --cpus-per-task where it is set (SLURM_CPUS_PER_TASK: the CPUs this task was given),
    else this rank's share of the cores it may run on."""
    slurm = os.environ.get("SLURM_CPUS_PER_TASK", "")
    if slurm.isdigit() and int(slurm) > 0:
        return int(slurm)
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count() or 1
    return max(1, min(usable, (os.cpu_count() or 1) // max(1, local_size)))


def place(comm: MPI.Comm, requested_device: str) -> Placement:
    """Pin this rank: choose its device, set torch's threads, make CPU kernels deterministic."""
    import torch

    local_rank, local_size = local_rank_and_size(comm)
    # cuBLAS needs a fixed workspace for deterministic GEMMs; it must be set before CUDA starts.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    gpu_count = torch.cuda.device_count() if requested_device != "cpu" else 0
    device = choose_device(requested_device, local_rank, gpu_count)
    threads = cpu_threads(local_size)
    torch.set_num_threads(threads)
    deterministic_algorithms()
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
    return Placement(comm.Get_rank(), comm.Get_size(), local_rank, local_size, device, threads)


def deterministic_algorithms() -> None:
    """``torch.use_deterministic_algorithms(True, warn_only=True)`` minus its first line, which
    imports ``torch._inductor.config`` (and torch._dynamo: ~2 s of CPU and ~150 MiB per rank) only
    to set a flag for compiled code; mpicd compiles nothing. Falls back to the public call if the
    private setter it wraps ever disappears."""
    import torch

    setter = getattr(torch._C, "_set_deterministic_algorithms", None)
    if setter is None:
        torch.use_deterministic_algorithms(True, warn_only=True)
    else:
        setter(True, warn_only=True)


@contextmanager
def abort_on_exception(comm: MPI.Comm = MPI.COMM_WORLD, where=None):
    """Any exception on any rank: print its traceback and MPI_Abort the whole job.

    Without this a rank that dies leaves the others blocked in their next collective forever.
    The first line names the rank and, inside a round, the round (``where()``: "rank R, round N"),
    then the error itself; the traceback follows.
    """
    try:
        yield
    except SystemExit:
        raise
    except BaseException as err:  # noqa: BLE001 - everything, KeyboardInterrupt included, must abort
        sys.stdout.flush()
        place = where() if where is not None else f"rank {comm.Get_rank()}"
        message = str(err).removeprefix("mpicd: ").removeprefix(place + ": ") or type(err).__name__
        sys.stderr.write(f"mpicd: {place} failed: {message}\n{traceback.format_exc()}")
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(1)
