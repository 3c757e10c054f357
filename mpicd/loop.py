"""The round loop: exchange -> local epoch -> exchange -> evaluate -> write a row.

Nothing algorithm-specific happens here; the algorithm's hooks are called in a fixed order and
every byte they move is counted by the communicator's ledger.
"""

from __future__ import annotations

import platform
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import yaml

from . import __version__
from .client import Client
from .models import num_parameters
from .plan import Plan


def software_versions() -> dict:
    import h5py
    import mpi4py
    from mpi4py import MPI

    return {
        "python": platform.python_version(), "numpy": np.__version__, "torch": str(torch.__version__),
        "h5py": h5py.__version__, "hdf5": h5py.version.hdf5_version, "h5py_mpi": bool(h5py.get_config().mpi),
        "mpi4py": mpi4py.__version__, "mpi": MPI.Get_library_version().splitlines()[0].strip(),
    }


def results_attrs(plan: Plan, client: Client) -> dict:
    return {
        "config": yaml.safe_dump(plan.resolved_config, sort_keys=False),
        "mpicd_version": __version__,
        "versions": yaml.safe_dump(software_versions(), sort_keys=False),
        "algorithm": plan.algorithm_cls.name,
        "dataset": plan.dataset.name,
        "clients": plan.config.clients,
        "rounds": plan.config.rounds,
        "seed": plan.config.seed,
        "skew": plan.config.data.skew,
        "images_per_class": plan.partition.base_per_class,
        "num_parameters": num_parameters(client.model),
        "feature_dim": client.model.feature_dim,
        "num_classes": plan.dataset.num_classes,
        "class_names": list(plan.dataset.class_names),
        "eval_split": plan.dataset.eval_split,
    }


def run(plan: Plan, comm, device: str, out: str | Path, log: Callable[[str], None] = print,
        parallel_io: bool | None = None) -> Path:
    """Train ``rounds`` rounds on this rank and write the results file collectively."""
    from .results import ResultsWriter, RoundRow

    cfg, ledger = plan.config, comm.ledger
    client = Client(plan, comm, device)
    test_counts = np.bincount(plan.dataset.test.y, minlength=plan.dataset.num_classes)
    writer = ResultsWriter(
        out, comm, rounds=cfg.rounds, num_classes=plan.dataset.num_classes, attrs=results_attrs(plan, client),
        train_counts=plan.partition.train_counts, test_counts=np.tile(test_counts, (cfg.clients, 1)),
        expertise=plan.partition.expertise, parallel=parallel_io)
    for r in range(cfg.rounds):
        started = time.perf_counter()
        ledger.begin_round()
        client.algorithm.before_epoch(r)
        loss = client.local_epochs(r)
        client.algorithm.after_epoch(r)
        scores = client.evaluate()
        traffic = ledger.end_round()
        elapsed = time.perf_counter() - started
        writer.write_round(r, RoundRow(
            train_loss=loss, test_acc=scores["test_acc"], balanced_acc=scores["balanced_acc"],
            minority_acc=scores["minority_acc"], recall=scores["recall"], traffic=traffic,
            compute_seconds=elapsed - traffic.seconds, teacher=client.algorithm.teacher()))
        # A progress line for rank 0: a small Allreduce outside the round's ledger row.
        summary = comm.allreduce_sum(np.array([scores["minority_acc"], traffic.total_sent, elapsed]))
        if comm.rank == 0:
            log(f"round {r + 1:>4}/{cfg.rounds}  minority_acc {summary[0] / comm.size:.4f}  "
                f"bytes {int(summary[1]):>12,d}  {summary[2] / comm.size:6.2f} s")
    writer.close()  # only on success: a failing rank aborts the job instead (see ResultsWriter.close)
    return Path(out)
