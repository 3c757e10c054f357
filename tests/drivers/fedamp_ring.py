"""Run under mpiexec: FedAMP with ``exchange: allgather`` and ``exchange: ring`` side by side in one
job, for both similarities. argv: OUT_DIR.

Each rank builds two clients from the same quick-start config and seed, one per exchange, each on
its own ``Comm`` (so each ledger counts only its own exchange), and runs them in lockstep for
ROUNDS rounds through the loop's hooks. Per round it dumps, for each exchange, the model before the
exchange (``pre``), this rank's xi row, its cloud model u_i and the round's ledger row
(``sent_<kind>``, ``recv_<kind>``) to ``OUT/<similarity>_<exchange>_rank<r>.npz``
(keys ``<name>_<round>``). Then ``mpicd run`` (the CLI entry point, in this process) with
``exchange: ring`` writes ``OUT/ring_run.h5``.
"""

import sys
from pathlib import Path

import numpy as np
import torch

from mpicd.algorithms.aggregate import flatten
from mpicd.cli import main
from mpicd.config.loading import load_config
from mpicd.mpi.comm import KINDS, Comm
from mpicd.mpi.placement import abort_on_exception
from mpicd.run.client import Client
from mpicd.run.plan import prepare

from driver_settings import FEDAMP_RING_ROUNDS

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "configs" / "quickstart.yaml"
ROUNDS = FEDAMP_RING_ROUNDS
EXCHANGES = ("allgather", "ring")

world = Comm()
out = Path(sys.argv[1])
torch.set_num_threads(1)


def lockstep(similarity: str) -> None:
    clients, dumps = {}, {}
    for exchange in EXCHANGES:
        algorithm = f"algorithm={{name: fedamp, similarity: {similarity}, exchange: {exchange}}}"
        config = load_config(QUICKSTART, [f"clients={world.size}", algorithm])
        clients[exchange], dumps[exchange] = Client(prepare(config), Comm(world.mpi), "cpu"), {}
    for r in range(ROUNDS):
        for exchange, client in clients.items():
            alg, ledger, dump = client.algorithm, client.comm.ledger, dumps[exchange]
            ledger.begin_round()
            alg.before_epoch(r)
            client.local_epochs(r)
            dump[f"pre_{r}"] = flatten(list(client.model.parameters()))
            alg.after_epoch(r)
            row = ledger.end_round()
            dump[f"xi_{r}"], dump[f"cloud_{r}"] = alg.xi, flatten(alg.cloud)
            for kind in KINDS:
                dump[f"sent_{kind}_{r}"] = np.int64(row.bytes_sent[kind])
                dump[f"recv_{kind}_{r}"] = np.int64(row.bytes_recv[kind])
    for exchange, dump in dumps.items():
        np.savez(out / f"{similarity}_{exchange}_rank{world.rank}.npz", **dump)


with abort_on_exception(world.mpi):
    for similarity in ("gaussian", "cosine"):
        lockstep(similarity)
    code = main(
        [
            "run",
            str(QUICKSTART),
            f"clients={world.size}",
            "rounds=2",
            "algorithm={name: fedamp, exchange: ring}",
            "--out",
            str(out / "ring_run.h5"),
        ]
    )
    if code != 0:
        raise RuntimeError(f"mpicd run exited with {code}")
    world.mpi.Barrier()
    if world.rank == 0:
        print("fedamp ring driver done", flush=True)
