"""Run under mpiexec -n 3: FedAvg through the real ``mpicd run`` (:func:`mpicd.cli.main`, the loop,
the non-finite guard, the fault injector) on the quick-start data with ``data.skew_mode=authors``,
so that the clients' training sets differ in size (clients 0 and 2 lose minority images, client 1
does not: 68, 98 and 68 images), recording what every rank's model is just before and just after
each round's aggregation. argv: OUT_DIR MODE [key=value ...] (extra overrides for the run).

Every rank writes ``OUT/rank<r>.npz``: ``n`` (its training-set size, ``len(train_y)``), ``pre_<round>``
and ``post_<round>`` (float32: its parameters then its floating-point buffers, flattened in the
model's order by this driver, not by mpicd's helpers). The run's file is ``OUT/run.h5``.

MODE ``replay``: afterwards rank 0 also replays the whole run serially, without MPI: one
:class:`mpicd.run.client.Client` per client index (algorithm ``local``, its own data, shuffle order and
optimizer), every round starting from the sample-weighted mean of the replayed models of the round
before, computed here in float64. ``OUT/replay.npz``: ``theta_<round>_<client>`` (each client's
model after its local epoch, before averaging) and ``n_<client>``. MODE ``plain``: no replay.
"""

import sys
import time
import types
from pathlib import Path

import numpy as np
import torch

from mpicd.algorithms.fedavg import FedAvg
from mpicd.cli import main
from mpicd.config.loading import load_config
from mpicd.run.client import Client
from mpicd.run.plan import prepare

from driver_settings import FEDAVG_CLIENTS, FEDAVG_ROUNDS

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "configs" / "quickstart.yaml"
CLIENTS, ROUNDS = FEDAVG_CLIENTS, FEDAVG_ROUNDS

out, mode, extra = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
base = [f"clients={CLIENTS}", f"rounds={ROUNDS}", "data.skew_mode=authors"]


def tensors(model: torch.nn.Module) -> list[torch.Tensor]:
    return [*model.parameters(), *(b for b in model.buffers() if b.is_floating_point())]


def vector(model: torch.nn.Module) -> np.ndarray:
    return np.concatenate([t.detach().cpu().numpy().astype(np.float32).ravel() for t in tensors(model)])


def load(model: torch.nn.Module, values: np.ndarray) -> None:
    offset = 0
    with torch.no_grad():
        for t in tensors(model):
            t.copy_(torch.from_numpy(values[offset : offset + t.numel()].reshape(t.shape)))
            offset += t.numel()
    assert offset == len(values)


record: dict[str, np.ndarray] = {}
aggregate = FedAvg.after_epoch


def recording_after_epoch(self, round_index: int) -> None:
    record["n"] = np.array(len(self.ctx.train_y))
    record[f"pre_{round_index}"] = vector(self.ctx.model)
    aggregate(self, round_index)
    record[f"post_{round_index}"] = vector(self.ctx.model)


FedAvg.after_epoch = recording_after_epoch
code = main(["run", str(QUICKSTART), *base, "algorithm=fedavg", *extra, "--out", str(out / "run.h5")])
if code != 0:
    sys.exit(code)

from mpi4py import MPI  # noqa: E402 - initialised by mpicd's run above

rank = MPI.COMM_WORLD.Get_rank()
np.savez(out / f"rank{rank}.npz", **record)

if mode == "replay" and rank == 0:
    plan = prepare(load_config(QUICKSTART, [*base, "algorithm=local"]))
    clients = [Client(plan, types.SimpleNamespace(rank=j, size=CLIENTS), "cpu") for j in range(CLIENTS)]
    n = np.array([len(c.train_y) for c in clients], dtype=np.float64)
    dump = {f"n_{j}": np.array(int(n[j])) for j in range(CLIENTS)}
    start = vector(clients[0].model)  # the common initial model
    for r in range(ROUNDS):
        theta = []
        for j, client in enumerate(clients):
            load(client.model, start)
            client.local_epochs(r)
            theta.append(vector(client.model))
            dump[f"theta_{r}_{j}"] = theta[-1]
        start = ((n[:, None] * np.stack(theta).astype(np.float64)).sum(axis=0) / n.sum()).astype(np.float32)
    np.savez(out / "replay.npz", **dump)
elif mode not in ("replay", "plain"):
    raise SystemExit(f"unknown mode {mode!r}")

done = MPI.COMM_WORLD.Ibarrier()  # the others wait for the replay without spinning on a core
while not done.Test():
    time.sleep(0.02)
