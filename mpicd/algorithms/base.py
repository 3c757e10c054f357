"""The interface between the round engine and an algorithm (:class:`Algorithm`): what an algorithm
declares, the hooks its writer overrides, and the machinery derived from them that the engine calls.

Each round the engine asks an algorithm three things: what to exchange before the local epochs, what
to add to each batch's loss (after showing it the batch), what to exchange after the epochs. All
communication goes through ``ctx.comm``, so the ledger sees every byte.
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

if TYPE_CHECKING:  # annotations only: the comm layer imports MPI, and `mpicd check` must work without it
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


def _defined(owner, name: str):
    """The function behind ``owner``'s attribute ``name`` (a class or an instance; a classmethod's function)."""
    attribute = getattr(owner, name)
    return getattr(attribute, "__func__", attribute)


def _overrides(owner, name: str) -> bool:
    """Whether ``owner`` (an algorithm class or instance) replaces :class:`Algorithm`'s hook ``name``."""
    return _defined(owner, name) is not _defined(Algorithm, name)


class Algorithm:
    """One federated method. Subclass it, set ``name`` and ``Params``, declare ``payloads``, override
    the hooks it needs, and add a line to :data:`mpicd.algorithms.REGISTRY`.

    **Declarations** (class attributes): ``name`` (``algorithm.name``), ``Params`` (the dataclass of its
    keys), ``payloads`` (what leaves a rank each round: the byte checks, ``mpicd verify`` and the docs'
    payload table read it), ``carried`` (attributes a checkpoint keeps), and four flags:
    ``trains_on_union``, ``dpsgd``, ``shared_at_evaluation``, ``scores_generic``.

    **Hooks an algorithm writer overrides** (each default: nothing, or the model's own):

    * before training, classmethods: :meth:`check` (the partition against the parameters),
      :meth:`check_private` (whether a ``privacy`` section has a private path), :meth:`release_attrs`;
    * each round, in the order the engine calls them: :meth:`before_round`; per batch
      :meth:`training_logits` (in :meth:`classification_loss`), :meth:`observe_batch`, :meth:`extra_loss`,
      and :meth:`parameter_loss` (added after the noise under DP-SGD); :meth:`after_round`. :meth:`drop_update` and
      :meth:`privacy_spent` when a client's update is dropped or its budget spent. An exchange is
      written once, at rank level (``before_round`` / ``after_round`` over the clients a rank holds);
      the per-client :meth:`before_epoch` / :meth:`after_epoch` run it for one client, unless
      overridden for what does not communicate;
    * evaluation: :meth:`predict`, :meth:`predict_generic`, :meth:`predictor_tensors`, :meth:`teacher`;
    * state beyond the model: :meth:`trained_parameters`, :meth:`state_dict` / :meth:`load_state_dict`
      (``carried`` by default);
    * a point-to-point exchange whose rows depend on who talks to whom: :meth:`p2p_rows`.

    **Machinery** the engine, the byte checks and ``mpicd verify`` call, derived from the above and not
    meant to be overridden: :meth:`classification_loss` (the cross-entropy of :meth:`training_logits`),
    :meth:`payload_for`, :meth:`payloads_for`, :meth:`bytes_per_round` and :meth:`rank_bytes_per_round`
    (the ``payloads`` that apply, evaluated; co-distillation zeroes them for a single client).
    """

    # ------------------------------------------------------------------ declarations
    name: ClassVar[str]
    Params: ClassVar[type] = NoParams
    payloads: ClassVar[tuple[Payload, ...]] = ()  # what leaves a rank each round, per option; none: nothing
    carried: ClassVar[tuple[str, ...]] = ()  # attributes that carry state from one round to the next
    trains_on_union: ClassVar[bool] = False  # True: every rank trains on all clients' training data
    dpsgd: ClassVar[bool] = False  # True: with privacy, the local training is DP-SGD (it shares models)
    # True: every client ends a round holding the same predictor (FedAvg's global model), so a rank's
    # clients whose predictor_tensors are equal bit for bit are evaluated once (mpicd.evaluation.predictors).
    # False (personalised models): every client is evaluated itself, whatever its tensors.
    shared_at_evaluation: ClassVar[bool] = False
    # True: besides predict (the client's model), predict_generic is scored on the held-out splits in the
    # /metrics/generic_* columns (FedRoD's generic model next to its personal one)
    scores_generic: ClassVar[bool] = False

    def __init__(self, params, ctx: Context):
        self.params = params
        self.ctx = ctx

    # ------------------------------------------------------------------ hooks: before training
    @classmethod
    def check(cls, params, train_counts: np.ndarray, expertise: np.ndarray) -> None:
        """Reject hyper-parameters the partition cannot satisfy (ConfigError), before training."""

    @classmethod
    def check_private(cls, params) -> None:
        """Reject a ``privacy`` section (ConfigError) unless these options have a private path:
        every value that leaves a rank clipped and noised (mpicd.privacy). Default: none."""
        raise ConfigError("privacy", f"algorithm {cls.name} has no private path (privacy: null, or another algorithm)")

    @classmethod
    def release_attrs(cls, settings) -> dict:
        """Results-file attributes describing a private release besides the default ones
        (mpicd.run.metadata; ``settings``: mpicd.privacy.budget.Settings). Default: none."""
        return {}

    # ------------------------------------------------------------------ hooks: the round
    @classmethod
    def before_round(cls, members: list["Algorithm"], round_index: int) -> None:
        """Rank level, before the epochs of every client this rank holds (``members``, in client
        order, all ranks calling it together): one exchange for all of them (co-distillation's
        representations). Default: each client's own :meth:`before_epoch`, if it has one."""
        for member in members:
            if _overrides(member, "before_epoch"):  # the default before_epoch would come back here
                member.before_epoch(round_index)

    def before_epoch(self, round_index: int) -> None:
        """One client's preparation for its epoch, called instead of :meth:`before_round` where a rank
        holds this one client; override it for what does not communicate (FedProto resets its sums).
        Default: :meth:`before_round` for ``[self]`` if the class has one, else nothing."""
        if _overrides(self, "before_round"):
            type(self).before_round([self], round_index)

    def training_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """The logits the client's local softmax trains on: the model's own by default. A method that
        changes that softmax (FedLC's calibrated logits, FedRS's restricted softmax) overrides this,
        row by row, so the loss stays a mean of per-sample terms; evaluation reads the raw logits."""
        return logits

    def observe_batch(self, batch: Batch) -> None:
        """Every training minibatch, before :meth:`extra_loss`: collect what the exchange needs (the
        per-class statistics of FedProto and FedDistill). Called whatever extra_loss returns, so a
        statistic never depends on the loss term being on."""

    def extra_loss(self, batch: Batch) -> torch.Tensor | None:
        """A term added to the batch's classification loss, or None."""
        return None

    def parameter_loss(self) -> torch.Tensor | None:
        """A loss term of the parameters alone (no data), or None: with DP-SGD it is added to the
        noised gradient (free of privacy cost) rather than to the per-sample losses."""
        return None

    @classmethod
    def after_round(cls, members: list["Algorithm"], round_index: int) -> None:
        """Rank level, after the epochs of every client this rank holds: one exchange for all of them
        (averaging, prototypes, logits); see :meth:`before_round`. Default: each client's own
        :meth:`after_epoch`, if it has one."""
        for member in members:
            if _overrides(member, "after_epoch"):  # the default after_epoch would come back here
                member.after_epoch(round_index)

    def after_epoch(self, round_index: int) -> None:
        """One client's closing step after its epoch, called instead of :meth:`after_round` where a
        rank holds this one client. Default: :meth:`after_round` for ``[self]`` if the class has one,
        else nothing."""
        if _overrides(self, "after_round"):
            type(self).after_round([self], round_index)

    def drop_update(self, round_index: int) -> None:
        """This client's update of the round is dropped (``on_nonfinite: skip``): it still takes
        part in the round's remaining exchanges, contributing nothing. Default: nothing to do."""

    def privacy_spent(self, round_index: int) -> None:
        """DP-SGD: this client's budget refused the round's steps (mpicd.run.client); from now on what it
        shares must be post-processing of its earlier private steps. Default: as a dropped update."""
        self.drop_update(round_index)

    # ------------------------------------------------------------------ hooks: evaluation
    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """Logits used for evaluation."""
        return self.ctx.model(x)

    def predict_generic(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of the method's generic model (:attr:`scores_generic`): the model's own by default."""
        return self.ctx.model(x)

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

    # ------------------------------------------------------------------ hooks: state beyond the model
    def trained_parameters(self) -> list[torch.nn.Parameter]:
        """Tensors the algorithm holds outside the model that the client's optimizer trains with it
        (FedRoD's personal head): stepped, reset and checkpointed with the model's; none by default."""
        return []

    def state_dict(self) -> dict:
        """What a checkpoint must hold for the next round to equal an uninterrupted run's."""
        return {name: getattr(self, name) for name in self.carried}

    def load_state_dict(self, state: dict) -> None:
        for name in self.carried:
            setattr(self, name, state[name])

    # ------------------------------------------------------------------ hooks: bytes
    @classmethod
    def p2p_rows(cls, params, teachers: np.ndarray, owner: np.ndarray) -> list[tuple[int, int]] | None:
        """Every rank's (T, U) in a round (:class:`Payload`'s rank formulas): the rows rank r sends and
        receives point to point, given the round's ``teachers`` (t(i) per client, -1 for none:
        ``/comm/teacher``) and ``owner[i]``, the rank of client i; a list over ranks 0..max(owner).
        Raise ValueError for ``teachers`` the exchange cannot have drawn. Default: None, no exchange
        whose rows depend on who teaches whom (T and U are then 0)."""
        return None

    # ------------------------------------------------------------------ machinery
    def classification_loss(
        self, batch: Batch, weight: torch.Tensor | None = None, reduction: str = "mean"
    ) -> torch.Tensor:
        """The batch's classification term (``/metrics/train_ce``): the cross-entropy of
        :meth:`training_logits`, weighted by ``weight`` (``train.loss: balanced``); the same on the
        DP-SGD path, where ``batch.features`` is None (Opacus sees the model's output only)."""
        return F.cross_entropy(self.training_logits(batch.logits), batch.y, weight=weight, reduction=reduction)

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
