"""One client (this rank): its data, model, optimizer and algorithm; local training and evaluation."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from . import metrics, seeds
from .algorithms import Batch, Context
from .models import build_model
from .plan import Plan


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
