"""The interface between the round loop and an algorithm: a few hooks, nothing else.

The loop trains one local epoch per round and asks the algorithm three things: what to
exchange before the epoch, what extra loss to add to a batch (after showing it the batch), what
to exchange after the epoch. All communication goes through ``ctx.comm`` so the ledger sees every byte.
"""

from __future__ import annotations

import ast
import operator
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from mpicd.core.schema import ConfigError
from mpicd.models.networks import FeatureHeadModel, num_parameters
from mpicd.mpi.accounting import KINDS

if TYPE_CHECKING:  # the comm layer imports MPI; `mpicd check` must work without it
    from mpicd.mpi.comm import Comm
    from mpicd.privacy.budget import Budget


@dataclass
class Context:
    """What an algorithm may know about its client and the run.

    ``index`` and ``clients`` are this client's index and the number of clients (with
    ``clients_per_rank: one`` they equal the MPI rank and size); ``comm.rank`` is the MPI rank,
    ``owner[i]`` the rank holding client i (:mod:`mpicd.mpi.assignment`).
    """

    comm: "Comm"
    model: FeatureHeadModel
    device: torch.device
    seed: int
    num_classes: int
    expertise: np.ndarray  # (clients,) expertise class of every client
    train_x: torch.Tensor  # this client's training data, on ``device``
    train_y: torch.Tensor
    client: int | None = None  # this client's index (None: the MPI rank)
    owner: np.ndarray | None = None  # (clients,) the rank of every client (None: client i on rank i)
    participants: np.ndarray | None = None  # the round's participating clients (None: all; mpicd.run.participation)
    privacy: "Budget | None" = None  # this client's privacy budget (mpicd.privacy.budget; None: privacy off)
    rounds: int | None = None  # the run's rounds (CCVR acts after the last)

    @property
    def participating(self) -> bool:
        return self.participants is None or self.index in self.participants

    @property
    def index(self) -> int:
        return self.comm.rank if self.client is None else self.client

    @property
    def clients(self) -> int:
        return self.comm.size if self.owner is None else len(self.owner)

    @property
    def owners(self) -> np.ndarray:
        return np.arange(self.comm.size) if self.owner is None else self.owner


@dataclass
class Batch:
    """One training minibatch after the forward pass (features and logits keep their graph)."""

    x: torch.Tensor
    y: torch.Tensor
    features: torch.Tensor | None  # None under DP-SGD (mpicd.run.client.Client.private_epochs)
    logits: torch.Tensor


@dataclass
class NoParams:
    """For algorithms without hyper-parameters."""


@dataclass(frozen=True)
class Sizes:
    """What a round's bytes depend on: N ranks, C classes, D feature dimension, P parameters and
    B floating-point buffer elements (BatchNorm statistics; 0 for lenet, fedavgcnn and mlp)."""

    N: int
    C: int
    D: int
    P: int
    B: int = 0

    @classmethod
    def of(cls, model: FeatureHeadModel, clients: int) -> "Sizes":
        return cls(
            N=clients,
            C=model.num_classes,
            D=model.feature_dim,
            P=num_parameters(model),
            B=sum(b.numel() for b in model.buffers() if b.is_floating_point()),
        )


_ARITHMETIC = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def _evaluate(node: ast.AST, names: dict) -> int:
    """An integer formula of +, -, * over names and integers (no eval: the text is the declaration)."""
    if isinstance(node, ast.Expression):
        return _evaluate(node.body, names)
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.Name) and node.id in names:
        return names[node.id]
    if isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC:
        return _ARITHMETIC[type(node.op)](_evaluate(node.left, names), _evaluate(node.right, names))
    raise ValueError(f"payload formula: unsupported {ast.dump(node)}")


ROUNDS = ("every", "last")  # when a payload crosses: every round, or the last round only


@dataclass(frozen=True)
class Payload:
    """What one rank sends each round under some options: the single declaration that the docs' payload
    table (:func:`mpicd.algorithms.payload_table`), ``tools/bench_comm.py`` and the byte tests read.

    ``sent`` / ``recv`` are one client's bytes per round as formulas in N, C, D, P, B (:class:`Sizes`)
    and S, the number of students it serves in the round (co-distillation's plan): what it sends
    and receives in a deployment with one site per client, and with one client per rank what its
    rank sends and receives. ``rank_sent`` / ``rank_recv``: what crosses MPI from a rank that holds
    K clients (mpicd.mpi.assignment), T the rows it sends (co-distillation: for each other rank, its
    teachers with a student there) and U the rows it receives (the teachers on other ranks of its
    clients); empty: the same as ``sent`` / ``recv`` (a rank sums its clients' contributions).
    With K = 1, T = S and U = 1 they are ``sent`` / ``recv``. ``when``: the option values under
    which it applies (empty: always). ``rounds``: ``every`` round (at most one such payload applies
    to any options), or the ``last`` round only, on top of the every-round one (bytes of one kind
    add up).
    """

    kind: str  # one of mpicd.mpi.accounting.KINDS
    what: str
    shape: str
    sent: str
    recv: str
    when: tuple[tuple[str, object], ...] = ()
    rank_sent: str = ""
    rank_recv: str = ""
    dtypes: tuple[str, ...] = ("float32",)  # what its buffers may be (mpicd.mpi.channels: others are refused)
    rounds: str = "every"  # "every" round, or only the "last" (CCVR's statistics, next to its every-round payload)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"payload kind {self.kind!r} is not one of {KINDS}")
        if self.rounds not in ROUNDS:
            raise ValueError(f"payload rounds {self.rounds!r} is not one of {ROUNDS}")
        self.bytes(Sizes(1, 1, 1, 1, 1), 1)  # a malformed formula fails at import
        self.rank_bytes(Sizes(1, 1, 1, 1, 1), 1, 1, 1)

    def applies(self, params) -> bool:
        return all(getattr(params, key) == value for key, value in self.when)

    def bytes(self, sizes: Sizes, students: int = 0) -> tuple[int, int]:
        names = {**asdict(sizes), "S": students}
        return tuple(_evaluate(ast.parse(f, mode="eval"), names) for f in (self.sent, self.recv))

    def rank_bytes(self, sizes: Sizes, clients: int, rows_sent: int = 0, rows_recv: int = 0) -> tuple[int, int]:
        """A rank's MPI bytes per round: K = ``clients`` it holds, T = ``rows_sent``, U = ``rows_recv``."""
        names = {**asdict(sizes), "K": clients, "T": rows_sent, "U": rows_recv}
        formulas = (self.rank_sent or self.sent, self.rank_recv or self.recv)
        return tuple(_evaluate(ast.parse(f, mode="eval"), names) for f in formulas)


class Algorithm:
    """Subclass, set ``name`` and ``Params``, override the hooks you need, add a registry line."""

    name: ClassVar[str]
    Params: ClassVar[type] = NoParams
    trains_on_union: ClassVar[bool] = False  # True: every rank trains on all clients' training data
    carried: ClassVar[tuple[str, ...]] = ()  # attributes that carry state from one round to the next
    payloads: ClassVar[tuple[Payload, ...]] = ()  # what leaves a rank each round, per option; none: nothing
    dpsgd: ClassVar[bool] = False  # True: with privacy, the local training is DP-SGD (it shares models)
    # True: every client ends a round holding the same predictor (FedAvg's global model), so a rank's
    # clients whose predictor_tensors are equal bit for bit are evaluated once (mpicd.evaluation.predictors).
    # False (personalised models): every client is evaluated itself, whatever its tensors.
    shared_at_evaluation: ClassVar[bool] = False
    # True: besides predict (the client's model), predict_generic is scored on the held-out splits in the
    # /metrics/generic_* columns (FedRoD's generic model next to its personal one)
    scores_generic: ClassVar[bool] = False

    def state_dict(self) -> dict:
        """What a checkpoint must hold for the next round to equal an uninterrupted run's."""
        return {name: getattr(self, name) for name in self.carried}

    def load_state_dict(self, state: dict) -> None:
        for name in self.carried:
            setattr(self, name, state[name])

    def __init__(self, params, ctx: Context):
        self.params = params
        self.ctx = ctx

    @classmethod
    def check(cls, params, train_counts: np.ndarray, expertise: np.ndarray) -> None:
        """Reject hyper-parameters the partition cannot satisfy (ConfigError), before training."""

    @classmethod
    def check_private(cls, params) -> None:
        """Reject a ``privacy`` section (ConfigError) unless these options have a private path:
        every value that leaves a rank clipped and noised (mpicd.privacy). Default: none."""
        raise ConfigError("privacy", f"algorithm {cls.name} has no private path (privacy: null, or another algorithm)")

    @classmethod
    def payload_for(cls, params) -> Payload | None:
        """The declared every-round payload that ``params`` select (None: nothing leaves the rank)."""
        chosen = [p for p in cls.payloads if p.applies(params) and p.rounds == "every"]
        if len(chosen) > 1:
            raise RuntimeError(f"{cls.name}: {len(chosen)} payloads apply to {params}")
        return chosen[0] if chosen else None

    @classmethod
    def payloads_for(cls, params, last: bool = False) -> list[Payload]:
        """Every declared payload that ``params`` select in a round: the every-round one, and in the
        run's ``last`` round also those declared for it alone."""
        every = cls.payload_for(params)
        return [
            *([every] if every else []),
            *(p for p in cls.payloads if p.rounds == "last" and last and p.applies(params)),
        ]

    @classmethod
    def bytes_per_round(cls, sizes: Sizes, params, students: int = 0, last: bool = False) -> dict[str, tuple[int, int]]:
        """This rank's (sent, received) bytes in one round for every kind of :data:`mpicd.mpi.accounting.KINDS`;
        ``students``: how many clients this rank teaches in the round (co-distillation); ``last``: the
        run's last round (:attr:`Payload.rounds`)."""
        counts = dict.fromkeys(KINDS, (0, 0))
        for payload in cls.payloads_for(params, last):
            sent, recv = payload.bytes(sizes, students)
            counts[payload.kind] = (counts[payload.kind][0] + sent, counts[payload.kind][1] + recv)
        return counts

    @classmethod
    def rank_bytes_per_round(
        cls, sizes: Sizes, params, clients: int, rows_sent: int = 0, rows_recv: int = 0, last: bool = False
    ) -> dict[str, tuple[int, int]]:
        """What crosses MPI from a rank holding ``clients`` clients in one round, per kind (see
        :class:`Payload`: K, T, U; ``last`` as :meth:`bytes_per_round`)."""
        counts = dict.fromkeys(KINDS, (0, 0))
        for payload in cls.payloads_for(params, last):
            sent, recv = payload.rank_bytes(sizes, clients, rows_sent, rows_recv)
            counts[payload.kind] = (counts[payload.kind][0] + sent, counts[payload.kind][1] + recv)
        return counts

    @classmethod
    def release_attrs(cls, settings) -> dict:
        """Results-file attributes describing a private release besides the default ones
        (mpicd.run.metadata; ``settings``: mpicd.privacy.budget.Settings). Default: none."""
        return {}

    def before_epoch(self, round_index: int) -> None:
        """Exchange what the coming epoch needs (co-distillation's representations): the hook of a
        rank holding this one client. An algorithm that communicates implements :meth:`before_round`
        and calls it with ``[self]`` here."""

    def observe_batch(self, batch: Batch) -> None:
        """Every training minibatch, before :meth:`extra_loss`: collect what the exchange needs (the
        per-class statistics of FedProto and FedDistill). Called whatever extra_loss returns, so a
        statistic never depends on the loss term being on."""

    def extra_loss(self, batch: Batch) -> torch.Tensor | None:
        """A term added to the batch's classification loss, or None."""
        return None

    def training_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """The logits the client's local softmax trains on: the model's own by default. A method that
        changes that softmax (FedLC's calibrated logits, FedRS's restricted softmax) overrides this,
        row by row, so the loss stays a mean of per-sample terms; evaluation reads the raw logits."""
        return logits

    def classification_loss(
        self, batch: Batch, weight: torch.Tensor | None = None, reduction: str = "mean"
    ) -> torch.Tensor:
        """The batch's classification term (``/metrics/train_ce``): the cross-entropy of
        :meth:`training_logits`, weighted by ``weight`` (``train.loss: balanced``); the same on the
        DP-SGD path, where ``batch.features`` is None (Opacus sees the model's output only)."""
        return F.cross_entropy(self.training_logits(batch.logits), batch.y, weight=weight, reduction=reduction)

    def after_epoch(self, round_index: int) -> None:
        """Exchange what the finished epoch produced (averaging, prototypes, logits); one client
        on the rank, as :meth:`before_epoch`."""

    @classmethod
    def before_round(cls, members: list["Algorithm"], round_index: int) -> None:
        """Rank level, before the epochs of every client this rank holds (``members``, in client
        order, all ranks calling it together): one exchange for all of them. Default: each
        client's :meth:`before_epoch` (right for an algorithm whose hook does not communicate)."""
        for member in members:
            member.before_epoch(round_index)

    @classmethod
    def after_round(cls, members: list["Algorithm"], round_index: int) -> None:
        """Rank level, after the epochs of every client this rank holds; see :meth:`before_round`."""
        for member in members:
            member.after_epoch(round_index)

    def drop_update(self, round_index: int) -> None:
        """This client's update of the round is dropped (``on_nonfinite: skip``): it still takes
        part in the round's remaining exchanges, contributing nothing. Default: nothing to do."""

    def privacy_spent(self, round_index: int) -> None:
        """DP-SGD: this client's budget refused the round's steps (mpicd.run.client); from now on what it
        shares must be post-processing of its earlier private steps. Default: as a dropped update."""
        self.drop_update(round_index)

    def parameter_loss(self) -> torch.Tensor | None:
        """A loss term of the parameters alone (no data), or None: with DP-SGD it is added to the
        noised gradient (free of privacy cost) rather than to the per-sample losses."""
        return None

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """Logits used for evaluation."""
        return self.ctx.model(x)

    def predict_generic(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of the method's generic model (:attr:`scores_generic`): the model's own by default."""
        return self.ctx.model(x)

    def trained_parameters(self) -> list[torch.nn.Parameter]:
        """Tensors the algorithm holds outside the model that the client's optimizer trains with it
        (FedRoD's personal head): stepped, reset and checkpointed with the model's; none by default."""
        return []

    def predictor_tensors(self) -> list[torch.Tensor]:
        """Every tensor :meth:`predict` reads in eval mode: the model's parameters and buffers, but
        BatchNorm's ``num_batches_tracked`` (a step counter read only in training with momentum None,
        which no mpicd model uses). An algorithm whose predict reads more state adds it here."""
        model = self.ctx.model
        counters = {
            f"{name}.num_batches_tracked" if name else "num_batches_tracked"
            for name, module in model.named_modules()
            if isinstance(module, torch.nn.modules.batchnorm._BatchNorm)
        }
        return [*model.parameters(), *(b for name, b in model.named_buffers() if name not in counters)]

    def teacher(self) -> int:
        """The client this rank learned from in the current round, -1 if none."""
        return -1
