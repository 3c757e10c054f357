"""The round loop: local epoch -> exchange -> evaluate -> write a row. Nothing algorithm-specific.

``prepare`` does everything that can fail on bad input (config, data, partition, algorithm
hyper-parameters) and holds no MPI state, so ``mpicd check`` reuses it without MPI and ``run``
can agree across ranks on a failure before anyone trains.
"""

from __future__ import annotations

import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
import yaml

from . import __version__, metrics, seeds
from .algorithms import Algorithm, Batch, Context, resolve
from .config import Config, to_mapping
from .data import Dataset, load_dataset
from .data.partition import Partition, make_partition
from .models import build_model, num_parameters


@dataclass
class Plan:
    """A validated experiment, identical on every rank: config, data, partition, algorithm."""

    config: Config
    dataset: Dataset
    partition: Partition
    algorithm_cls: type[Algorithm]
    algorithm_params: object

    @property
    def resolved_config(self) -> dict:
        """The config with every default filled in, the algorithm's hyper-parameters included."""
        tree = to_mapping(self.config)
        tree["algorithm"] = {"name": self.algorithm_cls.name, **to_mapping(self.algorithm_params)}
        return tree


def prepare(config: Config) -> Plan:
    """Validate everything that depends on the input; raises ConfigError naming the culprit."""
    algorithm_cls, params = resolve(config.algorithm)
    dataset = load_dataset(config.data)
    partition = make_partition(dataset.train.y, dataset.num_classes, config.clients, config.data.skew,
                               config.data.images_per_class, config.seed)
    algorithm_cls.check(params, partition.train_counts, partition.expertise)
    build_model(config.model.name, dataset.input_shape, dataset.num_classes,  # a mismatch fails here
                config.model.feature_dim, config.model.hidden)
    return Plan(config, dataset, partition, algorithm_cls, params)


def software_versions() -> dict:
    import h5py
    import mpi4py
    from mpi4py import MPI

    return {
        "python": platform.python_version(), "numpy": np.__version__, "torch": str(torch.__version__),
        "h5py": h5py.__version__, "hdf5": h5py.version.hdf5_version, "h5py_mpi": bool(h5py.get_config().mpi),
        "mpi4py": mpi4py.__version__, "mpi": MPI.Get_library_version().splitlines()[0].strip(),
    }


class Client:
    """This rank's client: its data, model, optimizer and algorithm."""

    def __init__(self, plan: Plan, comm, device: str):
        cfg = plan.config
        self.plan, self.comm, self.device = plan, comm, torch.device(device)
        rank = comm.rank
        train = plan.dataset.train
        own = (np.concatenate(plan.partition.train_indices) if plan.algorithm_cls.trains_on_union
               else plan.partition.train_indices[rank])
        self.train_x = torch.from_numpy(train.x[own]).to(self.device)
        self.train_y = torch.from_numpy(train.y[own]).to(self.device)
        self.test_x = torch.from_numpy(plan.dataset.test.x).to(self.device)
        self.test_y = plan.dataset.test.y
        torch.manual_seed(seeds.torch_seed(cfg.seed, seeds.INIT))  # one common initial model
        self.model = build_model(cfg.model.name, plan.dataset.input_shape, plan.dataset.num_classes,
                                 cfg.model.feature_dim, cfg.model.hidden).to(self.device)
        self.optimizer = make_optimizer(self.model, cfg.train)
        self.expertise_class = int(plan.partition.expertise[rank])
        self.algorithm = plan.algorithm_cls(plan.algorithm_params, Context(
            comm=comm, model=self.model, device=self.device, seed=cfg.seed,
            num_classes=plan.dataset.num_classes, expertise=plan.partition.expertise,
            train_x=self.train_x, train_y=self.train_y))

    def local_epochs(self, round_index: int) -> float:
        """Train ``train.local_epochs`` epochs; returns the sample-weighted mean loss."""
        cfg, model, algorithm = self.plan.config, self.model, self.algorithm
        model.train()
        total, seen = 0.0, 0
        for epoch in range(cfg.train.local_epochs):
            order = torch.randperm(len(self.train_y), generator=torch.Generator().manual_seed(
                seeds.torch_seed(cfg.seed, seeds.SHUFFLE, self.comm.rank, round_index, epoch)))
            for start in range(0, len(order), cfg.train.batch_size):
                index = order[start: start + cfg.train.batch_size].to(self.device)
                x, y = self.train_x[index], self.train_y[index]
                features = model.features(x)
                logits = model.head(features)
                loss = F.cross_entropy(logits, y)
                extra = algorithm.extra_loss(Batch(x, y, features, logits))
                if extra is not None:
                    loss = loss + extra
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                self.optimizer.step()
                total += float(loss.detach()) * len(y)
                seen += len(y)
        return total / max(seen, 1)

    def evaluate(self) -> dict:
        """Metrics on the held-out set, predicting as the algorithm says."""
        self.model.eval()
        batch = self.plan.config.train.eval_batch_size
        with torch.no_grad():
            predictions = np.concatenate([
                self.algorithm.predict(self.test_x[i: i + batch]).argmax(dim=1).cpu().numpy()
                for i in range(0, len(self.test_x), batch)])
        num_classes = self.plan.dataset.num_classes
        recall = metrics.per_class_recall(self.test_y, predictions, num_classes)
        return {"recall": recall, "test_acc": metrics.accuracy(self.test_y, predictions),
                "balanced_acc": metrics.balanced_accuracy(recall),
                "minority_acc": metrics.minority_accuracy(recall, self.expertise_class)}


def make_optimizer(model: torch.nn.Module, train) -> torch.optim.Optimizer:
    """Created once per client; its state (Adam's moments) persists across rounds."""
    if train.optimizer == "adam":
        return torch.optim.Adam(model.parameters(), lr=train.lr, weight_decay=train.weight_decay)
    return torch.optim.SGD(model.parameters(), lr=train.lr, momentum=train.momentum,
                           weight_decay=train.weight_decay)


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
