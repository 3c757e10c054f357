"""Run under mpiexec: how far the student's mean feature of the teacher's expertise class is from
the received representation R, before and after each local epoch (argv: config, lambda, folder,
overrides...).

Writes folder/rank<r>.txt with one line per round: "round before after".
"""

import sys
from pathlib import Path

import torch

from mpicd.config.loading import load_config
from mpicd.mpi.comm import Comm
from mpicd.mpi.placement import abort_on_exception
from mpicd.run.client import Client
from mpicd.run.plan import prepare

comm = Comm()
with abort_on_exception(comm.mpi):
    plan = prepare(load_config(sys.argv[1], [f"clients={comm.size}", f"algorithm.lambda={sys.argv[2]}", *sys.argv[4:]]))
    client = Client(plan, comm, "cpu")
    algorithm = client.algorithm

    def distance() -> float:
        own = client.train_y == int(plan.partition.expertise[algorithm.teacher()])
        client.model.eval()
        with torch.no_grad():
            mean = client.model.features(client.train_x[own]).mean(dim=0)
        return float(torch.linalg.vector_norm(mean - algorithm.received[algorithm.teacher()][0]))

    lines = []
    for r in range(3):
        algorithm.before_epoch(r)
        before = distance()
        client.local_epochs(r)
        lines.append(f"{r} {before!r} {distance()!r}\n")
    (Path(sys.argv[3]) / f"rank{comm.rank}.txt").write_text("".join(lines))
