"""The reference the overhead is measured against: one client as a plain PyTorch loop, written apart
from mpicd's Client (same model, images, batch size, optimizer and threads).
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from mpicd.models.networks import build_model


class BareClient:
    """One client as a plain PyTorch loop, written here apart from mpicd's Client: the reference."""

    def __init__(self, plan, index: int, device: str):
        cfg, data = plan.config, plan.dataset
        own = plan.partition.train_indices[index]
        self.device = torch.device(device)
        self.x = torch.from_numpy(data.train.x[own]).to(self.device)
        self.y = torch.from_numpy(data.train.y[own]).to(self.device)
        self.evals = [torch.from_numpy(s.x).to(self.device) for s in (data.test, data.val) if s is not None]
        torch.manual_seed(cfg.seed)
        self.model = build_model(
            cfg.model.name, data.input_shape, data.num_classes, cfg.model.feature_dim, cfg.model.hidden
        ).to(self.device)
        t = cfg.train
        self.optimizer = (
            torch.optim.Adam(self.model.parameters(), lr=t.lr, weight_decay=t.weight_decay)
            if t.optimizer == "adam"
            else torch.optim.SGD(self.model.parameters(), lr=t.lr, momentum=t.momentum, weight_decay=t.weight_decay)
        )
        self.train_cfg = t
        self.generator = torch.Generator().manual_seed(cfg.seed + index)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def train(self) -> float:
        """One round's local epochs; returns their seconds."""
        started = time.perf_counter()
        self.model.train()
        for _ in range(self.train_cfg.local_epochs):
            order = torch.randperm(len(self.y), generator=self.generator).to(self.device)
            for index in order.split(self.train_cfg.batch_size):
                loss = F.cross_entropy(self.model(self.x[index]), self.y[index])
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                self.optimizer.step()
        self._sync()
        return time.perf_counter() - started

    def evaluate(self) -> None:
        """Predictions on the test and validation splits, as every mpicd round makes them."""
        self.model.eval()
        with torch.no_grad():
            for x in self.evals:
                for chunk in x.split(self.train_cfg.eval_batch_size):
                    self.model(chunk).argmax(dim=1).cpu()
        self._sync()
