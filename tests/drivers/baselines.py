"""Run under mpiexec: everything the baseline tests need from one MPI job (one start-up, ~10 s
each on a small box, instead of one per check). argv: OUT_DIR [PNEUMONIA_NPZ or -].

1. ``stats``: FedAvg, FedProto (both weightings), FedDistill (both teachers) and FedAMP (both
   similarities) for a few rounds on the quick-start data (skew 0.6: clients hold different
   counts of each class), calling the algorithm's hooks directly, and dumping what each rank had
   before, sent, received and derived after every exchange to ``OUT/<variant>_rank<r>.npz`` (keys
   ``<name>_<round>``). Ranks get different training-set sizes (rank r drops 3 r samples) so
   FedAvg's weights differ, and rank 0 drops class 1 for FedProto / FedDistill so that a class is
   absent on one client. For those two the driver also keeps its own float64 per-class sums of the
   features / logits of every batch the client trained on and their counts (``sums``, ``seen``),
   read from the batches, not from the algorithm, for the tests' serial recomputation.
2. ``identical``: FedAvg with every rank holding rank 0's data and shuffle order, next to a
   single-process local run on the same data: ``OUT/identical_rank<r>.npz``.
3. ``runs``: ``mpicd run`` (the real CLI entry point, in this process) for every algorithm on
   the quick-start data (also with ``train.sampler: balanced``) and, if given, PneumoniaMNIST:
   ``OUT/<name>.h5``.
"""

import sys
import types
from pathlib import Path

import numpy as np
import torch

from mpicd.algorithms import REGISTRY
from mpicd.algorithms.aggregate import averaged_tensors, flatten
from mpicd.cli import main
from mpicd.config.loading import load_config
from mpicd.mpi.comm import Comm
from mpicd.mpi.placement import abort_on_exception
from mpicd.run.client import Client
from mpicd.run.plan import prepare

from driver_settings import IDENTICAL_ROUNDS, RUN_ROUNDS, STATS_ROUNDS

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "configs" / "quickstart.yaml"
PNEUMONIA_CONFIG = ROOT / "configs" / "pneumoniamnist.yaml"

STATS_VARIANTS = {
    "fedavg": "{name: fedavg}",
    "fedproto": "{name: fedproto}",  # weighting: samples
    "fedproto_equal": "{name: fedproto, weighting: equal}",
    "feddistill": "{name: feddistill}",  # exclude_self: true
    "feddistill_include": "{name: feddistill, exclude_self: false}",
    "fedamp": "{name: fedamp}",
    "fedamp_cosine": "{name: fedamp, similarity: cosine}",
}

comm = Comm()
out = Path(sys.argv[1])
pneumonia = sys.argv[2] if len(sys.argv) > 2 and sys.argv[2] != "-" else None
torch.set_num_threads(1)


def set_data(client: Client, keep: torch.Tensor) -> None:
    client.train_x, client.train_y = client.train_x[keep], client.train_y[keep]
    client.algorithm.ctx.train_x, client.algorithm.ctx.train_y = client.train_x, client.train_y


class BatchRecorder:
    """Wraps ``algorithm.extra_loss`` to sum, per class, the features or logits of every batch."""

    def __init__(self, algorithm, num_classes: int, width: int, logits: bool):
        self.shape, self.logits, self.inner = (num_classes, width), logits, algorithm.extra_loss
        algorithm.extra_loss = self
        self.reset()

    def reset(self) -> None:
        self.sums, self.seen = np.zeros(self.shape), np.zeros(self.shape[0], dtype=np.int64)

    def __call__(self, batch):
        values = (batch.logits if self.logits else batch.features).detach().numpy().astype(np.float64)
        np.add.at(self.sums, batch.y.numpy(), values)
        self.seen += np.bincount(batch.y.numpy(), minlength=self.shape[0])
        return self.inner(batch)


def stats(variant: str, algorithm: str) -> None:
    plan = prepare(load_config(QUICKSTART, [f"clients={comm.size}", f"algorithm={algorithm}"]))
    client = Client(plan, comm, "cpu")
    alg = client.algorithm
    keep = torch.arange(len(client.train_y)) >= 3 * comm.rank  # n_i differ between ranks
    if variant.startswith(("fedproto", "feddistill")) and comm.rank == 0:
        keep &= client.train_y != 1  # class 1 absent on rank 0
    set_data(client, keep)
    dump = {"n": np.array(len(client.train_y)), "counts": np.bincount(client.train_y.numpy(), minlength=2)}
    recorder = None
    if variant.startswith("fedproto"):
        recorder = BatchRecorder(alg, 2, plan.config.model.feature_dim, logits=False)
    elif variant.startswith("feddistill"):
        recorder = BatchRecorder(alg, 2, 2, logits=True)
    for r in range(STATS_ROUNDS):
        alg.before_epoch(r)
        if recorder:
            recorder.reset()
        client.local_epochs(r)
        if recorder:
            dump[f"sums_{r}"], dump[f"seen_{r}"] = recorder.sums, recorder.seen
        dump[f"pre_{r}"] = flatten(averaged_tensors(client.model))
        alg.after_epoch(r)
        dump[f"post_{r}"] = flatten(averaged_tensors(client.model))
        if variant.startswith("fedproto"):
            dump[f"sent_{r}"], dump[f"received_{r}"] = alg.sent, alg.received
            dump[f"derived_{r}"] = alg.prototypes.numpy()
            dump[f"has_{r}"] = alg.has_prototype.numpy()
        elif variant.startswith("feddistill"):
            dump[f"sent_{r}"], dump[f"received_{r}"] = alg.sent, alg.received
            dump[f"derived_{r}"] = alg.targets.numpy()
            dump[f"has_{r}"] = alg.has_teacher.numpy()
        elif variant.startswith("fedamp"):
            dump[f"xi_{r}"] = alg.xi
            dump[f"cloud_{r}"] = flatten(alg.cloud)
    np.savez(out / f"{variant}_rank{comm.rank}.npz", **dump)


def identical() -> None:
    """FedAvg where every rank trains on rank 0's data in rank 0's order, and one local run."""
    overrides = [f"clients={comm.size}"]
    fed = Client(prepare(load_config(QUICKSTART, [*overrides, "algorithm={name: fedavg}"])), comm, "cpu")
    local_plan = prepare(load_config(QUICKSTART, [*overrides, "algorithm={name: local}"]))
    single = Client(local_plan, types.SimpleNamespace(rank=0, size=1), "cpu")  # one process, rank 0's data
    fed.train_x, fed.train_y = single.train_x, single.train_y
    fed.algorithm.ctx.train_x, fed.algorithm.ctx.train_y = single.train_x, single.train_y
    fed.comm = types.SimpleNamespace(rank=0)  # the loop's shuffle order is keyed by rank: use rank 0's
    dump = {}
    for r in range(IDENTICAL_ROUNDS):
        fed.train_round(r)
        single.local_epochs(r)
        dump[f"fedavg_{r}"] = flatten(averaged_tensors(fed.model))
        dump[f"single_{r}"] = flatten(averaged_tensors(single.model))
    np.savez(out / f"identical_rank{comm.rank}.npz", **dump)


def runs() -> None:
    base = [f"clients={comm.size}", f"rounds={RUN_ROUNDS}"]
    plans = {f"{name}_quick": (QUICKSTART, [f"algorithm={{name: {name}}}"]) for name in REGISTRY}
    plans["fedamp_lambda0_quick"] = (QUICKSTART, ["algorithm={name: fedamp, lambda: 0}"])
    plans["fedproto_nearest_quick"] = (QUICKSTART, ["algorithm={name: fedproto, predict: nearest_prototype}"])
    plans["fedproto_equal_quick"] = (QUICKSTART, ["algorithm={name: fedproto, weighting: equal}"])
    plans["feddistill_include_quick"] = (QUICKSTART, ["algorithm={name: feddistill, exclude_self: false}"])
    plans["fedlc_tau0_quick"] = (QUICKSTART, ["algorithm={name: fedlc, tau: 0}"])  # FedAvg, bit for bit
    plans["fedrs_alpha1_quick"] = (QUICKSTART, ["algorithm={name: fedrs, alpha: 1}"])  # FedAvg, bit for bit
    plans["fedrs_hard_quick"] = (QUICKSTART, ["algorithm={name: fedrs, restriction: hard}"])  # no class lacking
    for name in REGISTRY:  # train.sampler: balanced with every method
        plans[f"{name}_balanced_quick"] = (QUICKSTART, [f"algorithm={{name: {name}}}", "train.sampler=balanced"])
    if pneumonia:
        for name in REGISTRY:
            plans[f"{name}_pneumonia"] = (
                PNEUMONIA_CONFIG,
                [f"algorithm={{name: {name}}}", f"data.path={pneumonia}", "data.images_per_class=40"],
            )
    for label, (config, overrides) in plans.items():
        code = main(["run", str(config), *base, *overrides, "--out", str(out / f"{label}.h5")])
        if code != 0:
            raise RuntimeError(f"mpicd run {label} exited with {code}")


with abort_on_exception(comm.mpi):
    for variant, algorithm in STATS_VARIANTS.items():
        stats(variant, algorithm)
    identical()
    runs()
    comm.mpi.Barrier()
    if comm.rank == 0:
        print("baselines driver done", flush=True)
