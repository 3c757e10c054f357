"""One rank per node on a four-node namespace cluster (the module fixture ``netns4``): each rank is
local rank 0 of its own host and gets the threads Slurm gave its task."""

from __future__ import annotations

import pytest

from conftest import QUICKSTART
from test_multinode import gpu_of, job_env, placement, sbatch, valid_rows

pytestmark = pytest.mark.multinode


def test_four_nodes_one_rank_each(netns4):
    out, log = netns4.root / "four.h5", netns4.root / "four.out"
    rc, _ = sbatch(
        netns4,
        "-N", "4", "--ntasks-per-node=1", "--cpus-per-task=2", f"--output={log}",
        "slurm/mpicd.sbatch", str(QUICKSTART), "rounds=1", "--out", str(out),
        env=job_env(netns4),
    )  # fmt: skip
    assert rc == 0, log.read_text()
    assert placement(out) == [(f"node{r + 1}", 0, gpu_of(0), 2) for r in range(4)]
    valid_rows(out, 1)
