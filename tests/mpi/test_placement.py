"""Rank placement: local rank from the shared-memory communicator, GPU by local rank, CPU threads."""

import os

import pytest
import torch

from mpicd.config.sections import ConfigError
from mpicd.mpi.placement import choose_device, cpu_threads, gpu_for, visible_gpus

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


def test_cuda_visible_devices_names_the_gpus_torch_numbers_from_0():
    """Hand-written environments against the CUDA programming guide's rules: unset shows every GPU,
    an entry list remaps ("2,1": cuda:0 is GPU 2), the list ends at the first invalid entry
    ("0,2,-1,1" shows 0 and 2), empty shows none; UUIDs are taken as they are."""
    assert visible_gpus({}, 4) == ["0", "1", "2", "3"]
    assert visible_gpus({}, 0) == [] and visible_gpus({}) == []
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "2,1"}, 4) == ["2", "1"]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "0,2,-1,1"}, 4) == ["0", "2"]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "1,7,0"}, 4) == ["1"]  # 7 is not installed
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "1,7,0"}) == ["1", "7", "0"]  # installed unknown
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}, 4) == []
    uuids = "GPU-8c4e5d0a-1111-2222-3333-444455556666,GPU-0f0e5d0a-aaaa-bbbb-cccc-ddddeeeeffff"
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": uuids}, 2) == uuids.split(",")


def test_each_local_rank_gets_a_gpu_in_turn_and_shares_when_there_are_more_ranks():
    two_of_four = visible_gpus({"CUDA_VISIBLE_DEVICES": "2,3"}, 4)  # e.g. a job given GPUs 2 and 3
    assert [gpu_for(r, two_of_four) for r in range(5)] == [(0, "2"), (1, "3"), (0, "2"), (1, "3"), (0, "2")]
    every = visible_gpus({}, 2)
    assert [gpu_for(r, every) for r in range(3)] == [(0, "0"), (1, "1"), (0, "0")]  # 3 ranks, 2 GPUs
    per_task = visible_gpus({"CUDA_VISIBLE_DEVICES": "3"}, 4)  # srun --gpus-per-task=1: one GPU per task
    assert [gpu_for(r, per_task) for r in range(4)] == [(0, "3")] * 4
    assert gpu_for(0, visible_gpus({"CUDA_VISIBLE_DEVICES": ""}, 4)) is None
    assert gpu_for(5, []) is None
    assert choose_device("auto", 5, len(two_of_four)) == "cuda:1"
