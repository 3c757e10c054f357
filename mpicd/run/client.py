"""One client: its data, model, optimizer and algorithm; local training and evaluation.

A rank holds one client (``clients_per_rank: one``) or several (:mod:`mpicd.mpi.assignment`); each client
has its own model, optimizer and algorithm state (one model per client rather than one model
with each client's state swapped in: BENCHMARKS.md, "Clients per rank", has the measurement), and
:func:`train_clients` trains a rank's clients in turn between the algorithm's rank-level exchanges.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import torch

from mpicd.evaluation import diagnostics
from mpicd.evaluation import predictors as evaluation
from mpicd.algorithms import Batch, Context
from mpicd.core import seeds
from mpicd.evaluation.predictors import Scores
from mpicd.models import optim
from mpicd.models.networks import build_model
from mpicd.privacy.budget import Budget
from mpicd.run import sampling
from mpicd.run.plan import Plan


@dataclass(frozen=True)
class EpochLoss:
    """Sample-weighted mean training loss of a round and its two parts (total = ce + extra)."""

    total: float
    ce: float
    extra: float


class NonFiniteLoss(ArithmeticError):
    """A minibatch's loss is NaN or inf (found before its backward pass: the model is untouched)."""


def batch_bounds(n: int, batch_size: int) -> list[tuple[int, int]]:
    """[start, stop) of each minibatch over ``n`` shuffled samples.

    A trailing batch of a single sample is merged into the one before it (which then holds
    batch_size + 1): BatchNorm in training mode cannot normalise one sample (ResNet-18 on
    28x28 images reaches a 1x1 map), and one image would otherwise weigh as much as a batch.
    """
    bounds = [(start, min(start + batch_size, n)) for start in range(0, n, batch_size)]
    if batch_size > 1 and len(bounds) > 1 and bounds[-1][1] - bounds[-1][0] == 1:
        bounds[-2:] = [(bounds[-2][0], n)]
    return bounds


class Client:
    """One client: its data, model, optimizer and algorithm.

    ``index``: the client (default: this MPI rank, one client per rank); ``owner``: the rank of
    every client (:mod:`mpicd.mpi.assignment`; default client i on rank i); ``shared``: a dict the clients
    of one rank pass to each other, so that they hold one copy of the evaluation splits (and of the
    union, for an algorithm that trains on it) rather than one each.
    """

    def __init__(self, plan: Plan, comm, device: str, index: int | None = None, owner=None, shared=None):
        cfg = plan.config
        self.plan, self.comm, self.device = plan, comm, torch.device(device)
        self.index = rank = comm.rank if index is None else int(index)
        shared = {} if shared is None else shared
        train = plan.dataset.train
        if plan.algorithm_cls.trains_on_union:
            if "union" not in shared:
                own = np.concatenate(plan.partition.train_indices)
                shared["union"] = (
                    torch.from_numpy(train.x[own]).to(self.device),
                    torch.from_numpy(train.y[own]).to(self.device),
                )
            self.train_x, self.train_y = shared["union"]
        else:
            own = plan.partition.train_indices[rank]
            self.train_x = torch.from_numpy(train.x[own]).to(self.device)
            self.train_y = torch.from_numpy(train.y[own]).to(self.device)
        if "eval_sets" not in shared:
            sets = {"test": (torch.from_numpy(plan.dataset.test.x).to(self.device), plan.dataset.test.y)}
            if plan.dataset.val is not None:
                sets["val"] = (torch.from_numpy(plan.dataset.val.x).to(self.device), plan.dataset.val.y)
            shared["eval_sets"] = sets
        self.eval_sets = shared["eval_sets"]
        torch.manual_seed(seeds.torch_seed(cfg.seed, seeds.INIT))  # one common initial model
        self.model = build_model(
            cfg.model.name, plan.dataset.input_shape, plan.dataset.num_classes, cfg.model.feature_dim, cfg.model.hidden
        ).to(self.device)
        self.class_weights = (  # train.loss: balanced, from the split this rank trains on
            balanced_weights(self.train_y, plan.dataset.num_classes) if cfg.train.loss == "balanced" else None
        )
        self.expertise_class = int(plan.partition.expertise[rank])
        self.diagnose = bool(cfg.eval.diagnostics)  # eval.diagnostics: measured in train_round, see round_diagnostics
        self._grad_share: diagnostics.GradShare | None = None
        self._r_distance = math.nan
        self.algorithm = plan.algorithm_cls(
            plan.algorithm_params,
            Context(
                comm=comm,
                model=self.model,
                device=self.device,
                seed=cfg.seed,
                num_classes=plan.dataset.num_classes,
                expertise=plan.partition.expertise,
                train_x=self.train_x,
                train_y=self.train_y,
                client=rank,
                owner=None if owner is None else np.asarray(owner),
                privacy=None if plan.privacy is None else Budget(plan.privacy, cfg.seed, rank),
                rounds=cfg.rounds,
            ),
        )
        self.dpsgd = plan.privacy is not None and plan.algorithm_cls.dpsgd  # private local training
        trained = [*self.model.parameters(), *self.algorithm.trained_parameters()]  # FedRoD's personal head too
        self.optimizer = torch_optimizer(trained, cfg.train) if self.dpsgd else make_optimizer(trained, cfg.train)

    def train_round(self, round_index: int, fault=None, guard=None) -> EpochLoss:
        """One round's training: the algorithm's exchange before the epoch, the local epochs, its
        exchange after. ``fault`` (:class:`mpicd.run.faults.FaultInjector`) is given its places,
        ``guard`` (:class:`mpicd.run.nonfinite.NonFiniteGuard`) checks the model before each exchange
        and handles a non-finite loss; with neither, a non-finite loss raises NonFiniteLoss.
        A dropped update's loss is NaN."""
        at = fault.at if fault is not None else (lambda place: None)
        at("before_exchange")
        if guard is not None:
            guard.check_model("at the start of the round")
        self.algorithm.before_epoch(round_index)
        self._grad_share, self._r_distance = None, math.nan
        if self.diagnose:  # eval mode, no gradient, no random stream: training is untouched
            self._r_distance = self._distance_to_reference()
        loss = self.guarded_epochs(round_index, guard)
        at("after_epoch")
        if guard is not None:
            guard.check_model("after the local epoch")
        self.algorithm.after_epoch(round_index)
        return loss

    def guarded_epochs(self, round_index: int, guard=None) -> EpochLoss:
        """:meth:`local_epochs`, a non-finite loss handed to ``guard`` (NaN loss: update dropped)."""
        loss = EpochLoss(math.nan, math.nan, math.nan)
        if guard is None or not guard.dropped:
            try:
                loss = self.local_epochs(round_index)
            except NonFiniteLoss as err:
                if guard is None:
                    raise
                guard.failed(str(err))  # abort: raises; skip: back to the round's start, update dropped
        return loss

    def local_epochs(self, round_index: int) -> EpochLoss:
        """Train ``train.local_epochs`` epochs; returns the sample-weighted mean loss and its parts."""
        cfg, model, algorithm = self.plan.config, self.model, self.algorithm
        if self.dpsgd:
            from mpicd.privacy import dpsgd  # Opacus, which imports torch._dynamo: private training only

            budget = algorithm.ctx.privacy
            q, steps = dpsgd.schedule(len(self.train_y), cfg.train.batch_size)  # as Opacus takes them
            if budget.request(round_index, steps * cfg.train.local_epochs, q, budget.settings.sigma):
                return self.private_epochs(round_index, steps * cfg.train.local_epochs)
            algorithm.privacy_spent(round_index)  # trained below; what it shares: the algorithm's hook
        model.train()
        if cfg.train.optimizer_state == "reset":
            self.optimizer.reset()  # a fresh optimizer for this round's local training
        total_ce, total_extra, seen = 0.0, 0.0, 0
        shares = self._grad_share = diagnostics.GradShare(model.parameters()) if self.diagnose else None
        labels = self.train_y.cpu().numpy() if cfg.train.sampler == "balanced" else None  # what it draws by
        for epoch in range(cfg.train.local_epochs):
            stream = seeds.rng(cfg.seed, seeds.SHUFFLE, self.index, round_index, epoch)
            order = torch.from_numpy(  # on the data's device once per epoch: no host copy per batch
                sampling.epoch_order(len(self.train_y), cfg.train.sampler, stream, labels)
            ).to(self.device)
            for b, (start, stop) in enumerate(batch_bounds(len(order), cfg.train.batch_size)):
                index = order[start:stop]
                x, y = self.train_x[index], self.train_y[index]
                features = model.features(x)
                batch = Batch(x, y, features, model.head(features))
                ce = algorithm.classification_loss(batch, self.class_weights)
                algorithm.observe_batch(batch)  # always, whatever the loss term: the statistics it exchanges
                extra = algorithm.extra_loss(batch)
                loss = ce if extra is None else ce + extra
                value = float(loss.detach())
                if not math.isfinite(value):
                    raise NonFiniteLoss(
                        f"the training loss is {value} (epoch {epoch}, batch {b}: cross-entropy "
                        f"{float(ce.detach())}, {algorithm.name} term "
                        f"{'none' if extra is None else float(extra.detach())})"
                    )
                if shares is not None:  # separate autograd.grad calls: nothing lands in .grad
                    shares.add(ce, extra)
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                self.optimizer.step()
                total_ce += float(ce.detach()) * len(y)
                if extra is not None:
                    total_extra += float(extra.detach()) * len(y)
                seen += len(y)
        seen = max(seen, 1)
        return EpochLoss((total_ce + total_extra) / seen, total_ce / seen, total_extra / seen)

    def private_epochs(self, round_index: int, charged: int) -> EpochLoss:
        """DP-SGD (mpicd.privacy.dpsgd, Opacus) for ``train.local_epochs`` epochs of Poisson-sampled
        batches, ``charged`` steps already spent in the client's budget (and checked against the
        steps the optimizer took); the model is unwrapped after, so the algorithm's exchange sees the
        plain module. The sampling and the noise come from the client's streams of the round (its
        secret key; the seed with privacy.noise: seeded). A data-free term of the algorithm
        (:meth:`~mpicd.algorithms.Algorithm.parameter_loss`, FedAMP's proximal term) is added to the
        noised gradient of each step; its per-sample share would be clipped and noised for nothing."""
        from mpicd.privacy import dpsgd  # Opacus, which imports torch._dynamo: private training only
        from mpicd.privacy.streams import DPSGD_NOISE, DPSGD_SAMPLING

        cfg, budget = self.plan.config, self.algorithm.ctx.privacy
        s = budget.settings
        self.model.train()  # evaluation left it in eval mode; Opacus' validator needs training mode
        private = dpsgd.make_private(
            self.model, self.optimizer, self.train_x, self.train_y, batch_size=cfg.train.batch_size,
            noise_multiplier=s.sigma, max_grad_norm=s.clip,
            sampling=budget.stream(round_index, DPSGD_SAMPLING), noise=budget.stream(round_index, DPSGD_NOISE),
        )  # fmt: skip
        total, extra, seen = 0.0, 0.0, 0
        params = [p for p in self.model.parameters() if p.requires_grad]

        def parameter_term(optimizer) -> None:  # after the noise: the gradient of a data-free term
            nonlocal extra
            term = self.algorithm.parameter_loss()
            if term is not None:
                for p, g in zip(params, torch.autograd.grad(term, params)):
                    p.grad.add_(g)
                extra += float(term.detach()) * batch_size

        private.optimizer.step_hook = parameter_term

        def classification(logits, y, reduction="mean"):  # the algorithm's term of the model's output
            return self.algorithm.classification_loss(Batch(None, y, None, logits), None, reduction)

        try:
            private.module.train()
            for _ in range(cfg.train.local_epochs):
                for x, y in private.batches():
                    batch_size = len(y)
                    private.optimizer.zero_grad(set_to_none=True)
                    loss = dpsgd.batch_loss(private.module, x, y, classification)
                    if not math.isfinite(float(loss.detach())):
                        raise NonFiniteLoss(f"the training loss is {float(loss.detach())} (DP-SGD step)")
                    dpsgd.backward(loss)
                    total, seen = total + float(loss.detach()) * len(y), seen + len(y)
                    private.optimizer.step()  # an empty batch is a step too: its noise is added
        finally:
            private.module.to_standard_module()  # Opacus' hooks off the model: next round wraps it again
        private.check_charged(charged)
        budget.released(round_index, list(self.model.state_dict().values()))  # the model leaves after the round
        ce, extra = total / max(seen, 1), extra / max(seen, 1)
        return EpochLoss(ce + extra, ce, extra)

    def _distance_to_reference(self) -> float:
        """r_distance: ||m - R|| / ||R||, m this client's own eval-mode class means of the classes the
        received R describes (all its training images of each); NaN without an R."""
        reference = getattr(self.algorithm, "reference", lambda: None)()
        if reference is None:
            return math.nan
        classes, received, outputs = reference
        own = diagnostics.class_means(outputs, self.model, self.train_x, self.train_y, classes)
        return diagnostics.relative_distance(own, received.cpu().numpy())

    def round_diagnostics(self, round_index: int) -> diagnostics.Diagnostics:
        """After the round's ledger row is closed (collective over the round's teacher pairs): the
        grad share and r_distance measured in :meth:`train_round`, and linear CKA with the teacher's
        probe features, which each rank sends to its students with Isend/Irecv + Waitall
        (:meth:`mpicd.mpi.comm.Comm.exchange`: counted outside rounds)."""
        cka = math.nan
        teachers = getattr(self.algorithm, "round_teachers", lambda: None)()
        rank = self.index  # one client per rank (mpicd.run.loop refuses eval.diagnostics otherwise)
        if teachers is not None and len(teachers) > 1:
            _, probe = diagnostics.probe_set(self.eval_sets)
            mine = np.ascontiguousarray(
                diagnostics.eval_outputs(self.model.features, self.model, probe).cpu().numpy(), dtype=np.float32
            )
            teacher = int(teachers[rank])
            theirs = np.empty_like(mine)
            students = [int(s) for s in np.flatnonzero(teachers == rank)]
            self.comm.exchange(
                [(s, mine) for s in students],
                [(teacher, theirs)],
                tag=(round_index + 16384) % 32768,
                channel="diagnostics",
            )
            cka = diagnostics.linear_cka(mine, theirs)
        share = self._grad_share.value() if self._grad_share is not None else math.nan
        return diagnostics.Diagnostics(term_grad_share=share, r_distance=self._r_distance, cka_teacher=cka)

    def evaluate(self, split: str = "test") -> Scores:
        """Metrics on a held-out split (``test`` or ``val``), predicting as the algorithm says; ``train``:
        on the images this rank trains on (eval.train_split, a memorisation audit; no random stream drawn)."""
        return self.scores(split, self.predictions(split))

    def split(self, split: str) -> tuple[torch.Tensor, np.ndarray]:
        """An evaluation split's images (on the device) and labels: ``test``, ``val`` or ``train``."""
        return (self.train_x, self.train_y.cpu().numpy()) if split == "train" else self.eval_sets[split]

    def predictions(self, split: str, generic: bool = False) -> np.ndarray:
        """The class this client's algorithm predicts for each image of the split (``generic``: its
        generic model's, :attr:`~mpicd.algorithms.Algorithm.scores_generic`)."""
        return evaluation.predicted_labels(
            self.algorithm, self.split(split)[0], self.plan.config.train.eval_batch_size, generic
        )

    def scores(self, split: str, predictions: np.ndarray) -> Scores:
        """This client's scores from predictions on the split (its own or a client's with the same model)."""
        return evaluation.scores(
            self.split(split)[1], predictions, self.plan.dataset.num_classes, self.expertise_class, self.distribution
        )

    @property
    def distribution(self) -> np.ndarray:
        """This client's training images of each class (its partition's, also for an algorithm that
        trains on the union): the label distribution its personalised accuracy is weighted by."""
        return self.plan.partition.train_counts[self.index]


def evaluate_clients(clients: list[Client], splits: tuple[str, ...], once: bool = True):
    """Every client a rank holds on the held-out ``splits`` (``test``, ``val``), each distinct
    predictor once (:mod:`mpicd.evaluation.predictors`; ``once`` False: each client's own), and an
    algorithm's generic model as ``generic_<split>`` where it has one. Returns
    ({client: {split: Scores}}, {client: seconds}); a group's prediction seconds are shared evenly
    among its clients, each client's scoring is its own."""
    found = {c.index: {} for c in clients}
    seconds = dict.fromkeys(found, 0.0)
    start = time.perf_counter()
    groups = evaluation.predictor_groups([c.algorithm for c in clients], once)
    for index in seconds:  # comparing the predictors: the rank's, shared evenly
        seconds[index] += (time.perf_counter() - start) / len(clients)
    for group in groups:
        for split in splits:
            start = time.perf_counter()
            first = clients[group[0]].scores(split, clients[group[0]].predictions(split))
            share = (time.perf_counter() - start) / len(group)
            for i in group:  # the same predictions and labels: only the minority classes and the weights differ
                start = time.perf_counter()
                found[clients[i].index][split] = evaluation.for_expertise(
                    first, clients[i].expertise_class, clients[i].distribution
                )
                seconds[clients[i].index] += share + time.perf_counter() - start
        for i in group[1:]:
            clients[i].model.eval()  # in the mode its own evaluation would have left it
    if type(clients[0].algorithm).scores_generic:  # the generic model too (FedRoD), each client's own
        for c in clients:
            for split in splits:
                start = time.perf_counter()
                found[c.index][f"generic_{split}"] = c.scores(split, c.predictions(split, generic=True))
                seconds[c.index] += time.perf_counter() - start
    return found, seconds


def train_clients(clients: list[Client], round_index: int, fault=None, guards=None):
    """One round of every client a rank holds (in client order), as :meth:`Client.train_round`
    does for one: the algorithm's rank-level exchange before the epochs
    (:meth:`~mpicd.algorithms.Algorithm.before_round`), each client's local epochs in turn, its
    exchange after. Returns ({client: EpochLoss}, {client: seconds}); a client's seconds are its
    own epochs plus an even share of the two exchanges (comm time included)."""
    at = fault.at if fault is not None else (lambda place: None)
    guards = guards or {}
    members = [c.algorithm for c in clients]
    hooks = type(members[0])
    seconds = dict.fromkeys((c.index for c in clients), 0.0)

    def shared(step) -> None:
        start = time.perf_counter()
        step()
        for index in seconds:
            seconds[index] += (time.perf_counter() - start) / len(clients)

    at("before_exchange")
    for c in clients:
        if c.index in guards:
            guards[c.index].check_model("at the start of the round")
    shared(lambda: hooks.before_round(members, round_index))
    losses = {}
    for c in clients:
        start = time.perf_counter()
        c._grad_share, c._r_distance = None, math.nan
        if c.algorithm.ctx.participating:  # mpicd.run.participation: the others sit the round out
            losses[c.index] = c.guarded_epochs(round_index, guards.get(c.index))
        else:
            losses[c.index] = EpochLoss(math.nan, math.nan, math.nan)
        seconds[c.index] += time.perf_counter() - start
    at("after_epoch")
    for c in clients:
        if c.index in guards:
            guards[c.index].check_model("after the local epoch")
    shared(lambda: hooks.after_round(members, round_index))
    return losses, seconds


def balanced_weights(y: torch.Tensor, num_classes: int) -> torch.Tensor:
    """``train.loss: balanced``: class c's cross-entropy weight w_c = n / (C n_c), the inverse of its
    frequency n_c / n in ``y`` (the client's own training split), 0 for a class it lacks.

    ``F.cross_entropy(..., weight=w)`` then gives a batch sum_i w_{y_i} CE_i / sum_i w_{y_i}: the
    weights are normalised by their sum over the batch (torch's mean reduction), so only their
    ratios matter (a batch of one class is plain CE) and the loss stays on the scale of plain CE.
    """
    counts = torch.bincount(y, minlength=num_classes).to(torch.float64)
    weights = torch.where(counts > 0, len(y) / (num_classes * counts.clamp(min=1)), torch.zeros_like(counts))
    return weights.to(torch.get_default_dtype())


def torch_optimizer(parameters: list[torch.nn.Parameter], train):
    """DP-SGD's optimizer: torch.optim's Adam or SGD with the same settings (Opacus wraps a
    torch.optim optimizer; imported here only, so the default path never loads torch._dynamo)."""
    import torch.optim

    if train.optimizer == "adam":
        return torch.optim.Adam(parameters, lr=train.lr, weight_decay=train.weight_decay)
    return torch.optim.SGD(parameters, lr=train.lr, momentum=train.momentum, weight_decay=train.weight_decay)


def make_optimizer(parameters: list[torch.nn.Parameter], train) -> optim.Optimizer:
    """Created once per client; its state (Adam's moments) persists across rounds unless
    ``train.optimizer_state: reset`` (then :meth:`~mpicd.models.optim.Optimizer.reset` before every
    round's local training). mpicd's own Adam/SGD (``mpicd.models.optim``: torch.optim's arithmetic
    without importing torch._dynamo)."""
    if train.optimizer == "adam":
        return optim.Adam(parameters, lr=train.lr, weight_decay=train.weight_decay)
    return optim.SGD(parameters, lr=train.lr, momentum=train.momentum, weight_decay=train.weight_decay)
