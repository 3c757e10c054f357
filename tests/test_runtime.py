"""Rank placement: local rank from the shared-memory communicator, GPU by local rank, CPU threads."""

import os

import pytest
import torch

from mpicd.config import ConfigError
from mpicd.runtime import choose_device, cpu_threads

from conftest import DRIVERS, mpiexec


def test_gpu_chosen_by_local_rank_among_visible_gpus():
    assert choose_device("auto", 0, 0) == "cpu"
    assert choose_device("cpu", 3, 8) == "cpu"
    assert [choose_device("auto", r, 4) for r in range(6)] == [
        "cuda:0",
        "cuda:1",
        "cuda:2",
        "cuda:3",
        "cuda:0",
        "cuda:1",
    ]
    with pytest.raises(ConfigError) as err:
        choose_device("cuda", 0, 0)
    assert err.value.key == "device"


def test_cores_are_split_between_the_ranks_of_a_node():
    cores = os.cpu_count()
    assert cpu_threads(1) == min(cores, len(os.sched_getaffinity(0)))
    assert cpu_threads(cores) == 1
    assert cpu_threads(4 * cores) == 1


def test_threads_follow_slurm_cpus_per_task(monkeypatch):
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "3")  # sbatch --cpus-per-task=3: 3 threads whatever the node has
    assert [cpu_threads(n) for n in (1, 4, 64)] == [3, 3, 3]
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "")
    assert cpu_threads(4 * os.cpu_count()) == 1
    monkeypatch.delenv("SLURM_CPUS_PER_TASK")
    assert cpu_threads(4 * os.cpu_count()) == 1


def test_local_ranks_under_mpiexec(tmp_path):
    result = mpiexec(3, str(DRIVERS / "placement.py"), str(tmp_path), timeout=120)
    assert result.returncode == 0, result.stderr
    rows = [(tmp_path / f"rank{r}.txt").read_text().split() for r in range(3)]
    assert sorted(int(row[0]) for row in rows) == [0, 1, 2]
    gpus = torch.cuda.device_count()
    for local_rank, local_size, device, _ in rows:
        assert local_size == "3"
        assert device == (f"cuda:{int(local_rank) % gpus}" if gpus else "cpu")
