"""Co-distillation (Racha et al., arXiv 2411.10383): share one mean feature vector, peer to peer.

Each round every client i learns from a teacher t(i) != i drawn from an RNG seeded by
(seed, round), so every rank knows the whole assignment without a message. A teacher sends
each of its students the mean feature vector R (D floats) of k random images of its expertise
class, computed in eval mode; the student adds lambda * MSE(f(x_b), R) over the batch samples
labelled with the teacher's expertise class. No parameters ever move.
Bytes per round per rank (``payloads``): ``4 D S`` sent to its S students, ``4 D`` received (kind
``p2p``); a single client (N = 1) sends and receives nothing, and a teacher whose update was
dropped (``on_nonfinite: skip``, ``/metrics/skipped``) sends its students empty messages (0 bytes).

Two options reproduce the authors' code (both off by default):

* ``teacher_per: batch``: each minibatch draws its own teacher t != rank (from the stream
  (seed, BATCH_TEACHERS, round, rank), one draw per batch), so any client may be needed: every
  rank Allgathers its representation (``4 D`` sent, ``4 N D`` received) instead of the point-to-point send.
* ``classes: all``: the term covers every sample, against the teacher's mean feature of the
  sample's class; every rank Allgathers its C x D table of per-class means (``4 C D`` sent,
  ``4 N C D`` received), whatever ``teacher_per``.

With either option ``/comm/teacher`` holds the round's shared assignment only when teachers are
drawn per round; per minibatch it is -1.

With ``privacy`` (mpicd/privacy, docs/explanation/privacy.md; ``k: all``, ``teacher_per: round``, ``classes:
expertise`` only) R is :meth:`private_means`: the images of the expertise class Poisson-sampled at
``privacy.sample_rate``, each one's eval-mode vector clipped to ``privacy.clip``, the sum noised
(std sigma C), divided by the noised count (the default), or by the expected count q n (``counts: public``,
only where the run is marked not private: n, a class size, differs between zero-out neighbours);
one release per round the client teaches, the same R for all its students. A teacher whose budget
is spent sends nothing, as a dropped one.

Two more readings of the method (defaults: the published algorithm):

* ``share: logits`` (the paper's text, and the authors' code's default ``kd_type: output``): the
  teacher shares the mean logits head(f(x)) of the same images, C floats instead of D (``4 C S``
  sent, ``4 C`` received; with the options above ``4 C`` / ``4 N C``, or ``4 C C`` / ``4 N C C``), and
  the student's term is the same MSE on its own logits of the matching samples.
* ``term_mean: batch`` (the authors' code): the term's sum over the m matching samples is divided
  by the batch size B instead of m, lambda * sum_b ||f(x_b) - R||^2 / (B W) with W = D (or C for
  logits), so one matching image in a batch of 32 carries lambda / 32 rather than the full lambda.
  With ``classes: all`` every sample matches and both means are the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Union

import numpy as np
import torch
import torch.nn.functional as F

from mpicd.algorithms.aggregate import allgather_over_clients, eval_rows, one_per_rank
from mpicd.algorithms.base import Algorithm, Batch, Context, Payload, Sizes
from mpicd.core import seeds
from mpicd.core.schema import ConfigError, spec
from mpicd.privacy.gaussian import gaussian_sum
from mpicd.privacy.sampling import poisson_subset

MEAN_CHUNK = 256  # images per forward pass when a teacher averages its features


def teacher_assignment(seed: int, round_index: int, clients: int, participants=None) -> np.ndarray:
    """t(i) for every client, uniform over the others; -1 everywhere for a single client.
    ``participants`` (mpicd.run.participation; None: everyone): the draw is among them, as if they were
    the only clients, and the others get -1."""
    if participants is not None:
        taking = np.asarray(participants, dtype=np.int64)
        teachers = np.full(clients, -1, dtype=np.int64)
        among = teacher_assignment(seed, round_index, len(taking))
        teachers[taking] = np.where(among >= 0, taking[np.maximum(among, 0)], -1)
        return teachers
    if clients < 2:
        return np.full(clients, -1, dtype=np.int64)
    draws = seeds.rng(seed, seeds.TEACHERS, round_index).integers(0, clients - 1, size=clients)
    return draws + (draws >= np.arange(clients))


@dataclass
class CoDistillParams:
    lambda_: float = spec(1.0, ge=0.0, doc="weight of the distillation term")
    k: Union[int, Literal["all"]] = spec("all", ge=1, doc="images the teacher averages per class; all = every one")
    teacher_per: Literal["round", "batch"] = spec("round", doc="batch: a new teacher each minibatch (authors' code)")
    classes: Literal["expertise", "all"] = spec(
        "expertise", doc="all: every class against the teacher's per-class means (authors' code)"
    )
    share: Literal["features", "logits"] = spec(
        "features",
        doc="features: the mean feature vector (D floats); logits: the mean logits (C floats, the paper's "
        "text), the term then on the student's logits",
    )
    term_mean: Literal["matching", "batch"] = spec(
        "matching",
        doc="the term's sum over the batch samples of the teacher's class divided by their number "
        "(matching) or by the batch size (batch: authors' code)",
    )


class CoDistillation(Algorithm):
    name = "codistill"
    Params = CoDistillParams
    payloads = (
        Payload(
            "p2p",
            "the mean feature vector R (eval mode) of k images of its expertise class, to each "
            "of its S students this round; R from its own teacher",
            "(1, D) per message",
            sent="4*D*S",
            recv="4*D",
            when=(("teacher_per", "round"), ("classes", "expertise"), ("share", "features")),
            rank_sent="4*D*T",
            rank_recv="4*D*U",
        ),
        Payload(
            "allgather",
            "R as above, to every rank (any rank may teach a minibatch)",
            "(1, D) block, (N, 1, D) gathered",
            sent="4*D",
            recv="4*N*D",
            when=(("teacher_per", "batch"), ("classes", "expertise"), ("share", "features")),
            rank_sent="4*K*D",
        ),
        Payload(
            "allgather",
            "its mean feature vector of each class (eval mode, k images each), to every rank",
            "(C, D) block, (N, C, D) gathered",
            sent="4*C*D",
            recv="4*N*C*D",
            when=(("classes", "all"), ("share", "features")),
            rank_sent="4*K*C*D",
        ),
        Payload(
            "p2p",
            "the mean logits R (eval mode) of k images of its expertise class, to each of its S "
            "students this round; R from its own teacher",
            "(1, C) per message",
            sent="4*C*S",
            recv="4*C",
            when=(("teacher_per", "round"), ("classes", "expertise"), ("share", "logits")),
            rank_sent="4*C*T",
            rank_recv="4*C*U",
        ),
        Payload(
            "allgather",
            "the mean logits R as above, to every rank (any rank may teach a minibatch)",
            "(1, C) block, (N, 1, C) gathered",
            sent="4*C",
            recv="4*N*C",
            when=(("teacher_per", "batch"), ("classes", "expertise"), ("share", "logits")),
            rank_sent="4*K*C",
        ),
        Payload(
            "allgather",
            "its mean logits of each class (eval mode, k images each), to every rank",
            "(C, C) block, (N, C, C) gathered",
            sent="4*C*C",
            recv="4*N*C*C",
            when=(("classes", "all"), ("share", "logits")),
            rank_sent="4*K*C*C",
        ),
    )

    @classmethod
    def bytes_per_round(cls, sizes: Sizes, params, students: int = 0, last: bool = False) -> dict[str, tuple[int, int]]:
        counts = super().bytes_per_round(sizes, params, students, last)
        return counts if sizes.N > 1 else {kind: (0, 0) for kind in counts}  # one client: no peer

    @classmethod
    def rank_bytes_per_round(
        cls, sizes: Sizes, params, clients: int, rows_sent: int = 0, rows_recv: int = 0, last: bool = False
    ) -> dict[str, tuple[int, int]]:
        counts = super().rank_bytes_per_round(sizes, params, clients, rows_sent, rows_recv, last)
        return counts if sizes.N > 1 else {kind: (0, 0) for kind in counts}

    @classmethod
    def p2p_rows(cls, params, teachers: np.ndarray, owner: np.ndarray) -> list[tuple[int, int]] | None:
        """With the point-to-point exchange (``teacher_per: round``, ``classes: expertise``) every rank's
        :meth:`rows_per_rank`; ValueError where a teacher is no other client (the draw never makes one)."""
        if params.teacher_per != "round" or params.classes != "expertise":
            return None
        clients = len(owner)
        if not all(t == -1 or (0 <= t < clients and t != s) for s, t in enumerate(teachers)):
            raise ValueError("a teacher that is no other client")
        return [cls.rows_per_rank(teachers, owner, rank) for rank in range(int(np.max(owner, initial=-1)) + 1)]

    @staticmethod
    def rows_per_rank(teachers: np.ndarray, owner: np.ndarray, rank: int) -> tuple[int, int]:
        """(T, U) of the point-to-point exchange for ``rank`` (see :class:`~mpicd.algorithms.Payload`):
        the rows it sends, one per (teacher on it, other rank holding a student of that teacher),
        and the rows it receives, one per teacher on another rank of its clients."""
        owner = np.asarray(owner)
        pairs = [(s, int(t)) for s, t in enumerate(teachers) if t >= 0]
        sent = {(t, int(owner[s])) for s, t in pairs if owner[t] == rank and owner[s] != rank}
        received = {t for s, t in pairs if owner[s] == rank and owner[t] != rank}
        return len(sent), len(received)

    @classmethod
    def check(cls, params: CoDistillParams, train_counts: np.ndarray, expertise: np.ndarray) -> None:
        if params.k == "all":
            return
        for client, expert in enumerate(expertise):
            shared = range(train_counts.shape[1]) if params.classes == "all" else [int(expert)]
            for c in shared:
                if params.k > train_counts[client, c]:
                    raise ConfigError(
                        "algorithm.k",
                        f"is {params.k}, but client {client} has only "
                        f"{int(train_counts[client, c])} images of class {c}",
                    )

    @classmethod
    def check_private(cls, params: CoDistillParams) -> None:
        """The private R is the per-round expertise-class mean: other readings have no private path."""
        for key, value, needed in (("k", params.k, "all"), ("teacher_per", params.teacher_per, "round"),
                                   ("classes", params.classes, "expertise")):  # fmt: skip
            if value != needed:
                why = " (the images are Poisson-sampled at privacy.sample_rate)" if key == "k" else ""
                raise ConfigError(f"algorithm.{key}", f"is {value!r}, but privacy needs {needed!r}{why}")

    def __init__(self, params: CoDistillParams, ctx: Context):
        super().__init__(params, ctx)
        self.teachers = np.full(ctx.clients, -1, dtype=np.int64)
        self.shared_classes = (
            list(range(ctx.num_classes)) if params.classes == "all" else [int(ctx.expertise[ctx.index])]
        )
        self.received: dict[int, torch.Tensor] = {}  # teacher -> its (classes shared, D) means
        self.batch_teachers: np.random.Generator | None = None

    def subset(self, round_index: int, c: int) -> torch.Tensor:
        """Indices into this client's training set of the images it averages for class ``c``:
        all of them, or k distinct ones drawn from the stream (seed, K_SUBSET, rank, round, c)."""
        ctx = self.ctx
        (index,) = torch.nonzero(ctx.train_y == c, as_tuple=True)
        if self.params.k == "all":
            return index
        pick = seeds.rng(ctx.seed, seeds.K_SUBSET, ctx.index, round_index, c).choice(
            len(index), size=self.params.k, replace=False
        )
        return index[torch.as_tensor(np.sort(pick), device=index.device)]

    @property
    def width(self) -> int:
        """The length of one shared mean: D features, or C logits with ``share: logits``."""
        model = self.ctx.model
        return model.num_classes if self.params.share == "logits" else model.feature_dim

    def class_means(self, round_index: int) -> np.ndarray | None:
        """(classes shared, width): eval-mode mean feature (or, ``share: logits``, mean logits) of
        each shared class's :meth:`subset` (in chunks of MEAN_CHUNK images, so k = all fits in
        memory for any class size). With privacy :meth:`private_means` (None: budget spent)."""
        ctx = self.ctx
        if ctx.privacy is not None:
            return self.private_means(round_index)
        model = ctx.model
        outputs = model if self.params.share == "logits" else model.features
        was_training = model.training
        model.eval()
        rows = []
        with torch.no_grad():
            for c in self.shared_classes:
                index = self.subset(round_index, c)
                total = sum(
                    outputs(ctx.train_x[index[i : i + MEAN_CHUNK]]).sum(dim=0) for i in range(0, len(index), MEAN_CHUNK)
                )
                rows.append(total / len(index))
        model.train(was_training)
        return np.ascontiguousarray(torch.stack(rows).cpu().numpy(), dtype=np.float32)

    def private_means(self, round_index: int) -> np.ndarray | None:
        """(1, width) private R of the expertise class (mpicd.privacy.release's R, computed only for
        the sampled images), or None when the client's budget refuses the release."""
        ctx, budget = self.ctx, self.ctx.privacy
        s = budget.settings
        if not budget.request(round_index):
            return None
        (index,) = torch.nonzero(ctx.train_y == self.shared_classes[0], as_tuple=True)
        generator = budget.generator(round_index)  # the Poisson sample, then the noise
        taken = torch.as_tensor(poisson_subset(len(index), s.q, generator), device=index.device)
        outputs = ctx.model if self.params.share == "logits" else ctx.model.features
        rows = eval_rows(outputs, ctx.model, ctx.train_x[index[taken]], self.width)
        total = gaussian_sum(rows, clip=s.clip, sigma=s.sigma, generator=generator)
        if s.noised_counts:  # post-processing: a noised count below 1 divides by 1
            count = max(len(taken) + generator.normal(0.0, s.sigma), 1.0)
        else:
            count = max(s.q * len(index), 1.0)
        payload = np.ascontiguousarray((total / count)[None], dtype=np.float32)
        budget.released(round_index, payload)  # journaled before it is sent
        return payload

    @classmethod
    def before_round(cls, members: list["CoDistillation"], round_index: int) -> None:
        """The round's teachers (the same draw on every rank) and one exchange for all the clients
        of this rank: point to point (:meth:`_send_to_students`), or one Allgather(v) of every
        client's means with ``teacher_per: batch`` or ``classes: all``."""
        ctx = members[0].ctx
        teachers = teacher_assignment(ctx.seed, round_index, ctx.clients, ctx.participants)
        for m in members:
            m.teachers, m.received = teachers, {}
        if ctx.clients < 2:
            return
        params = members[0].params
        if params.teacher_per == "round" and params.classes == "expertise":
            cls._send_to_students(members, round_index)
            return
        everyone = allgather_over_clients(ctx, {m.ctx.index: m.class_means(round_index) for m in members})
        for m in members:
            m.received = {
                t: torch.from_numpy(everyone[t]).to(m.ctx.device) for t in range(ctx.clients) if t != m.ctx.index
            }
            if params.teacher_per == "batch":
                m.batch_teachers = seeds.rng(ctx.seed, seeds.BATCH_TEACHERS, round_index, m.ctx.index)

    def drop_update(self, round_index: int) -> None:
        self.dropping = round_index  # dropped before the exchange: this round's students get nothing

    dropping: int | None = None

    @classmethod
    def _send_to_students(cls, members: list["CoDistillation"], round_index: int) -> None:
        """The method as published: a teacher's R goes only to this round's students. A student on
        the teacher's rank gets a local copy; every other rank holding students of this rank's
        teachers gets one message, the R of those teachers stacked in client order (one client per
        rank: one R per message). A dropped teacher's R is left out of the message: with one client
        per rank its students get an empty message and train without the term."""
        ctx = members[0].ctx
        comm, owner, teachers = ctx.comm, ctx.owners, members[0].teachers
        mine = {m.ctx.index: m for m in members}
        means: dict[int, np.ndarray] = {}  # this rank's teachers of the round: their R (1, width)
        for t, m in mine.items():
            if np.any(teachers == t) and m.dropping != round_index:
                released = m.class_means(round_index)
                if released is not None:  # None: its privacy budget is spent (mpicd.privacy.budget)
                    means[t] = released
        width = members[0].width
        sends, recvs = [], []
        for other in range(comm.size):
            if other == comm.rank:
                continue
            theirs = np.flatnonzero(owner == other)
            to_them = sorted({int(teachers[s]) for s in theirs if int(teachers[s]) in mine})
            if to_them:
                rows = [means[t] for t in to_them if t in means]
                message = np.concatenate(rows) if rows else np.zeros(0, dtype=np.float32)
                sends.append((other, np.ascontiguousarray(message, dtype=np.float32)))
            from_them = sorted({int(teachers[s]) for s in mine if teachers[s] >= 0 and owner[teachers[s]] == other})
            if from_them:
                recvs.append((other, from_them, np.empty((len(from_them), width), dtype=np.float32)))
        deployment = {}  # per client: R sent to each of its students, R received from its teacher
        for c in mine:
            students = int(np.sum(teachers == c))
            sent = means[c].nbytes * students if c in means else 0
            teacher = int(teachers[c])
            got = 0 if teacher < 0 or (teacher in mine and teacher not in means) else 4 * width
            deployment[c] = (sent, got)
        counts = comm.exchange(
            sends,
            [(other, buffer) for other, _, buffer in recvs],
            tag=round_index % 32768,
            channel="payload",
            allow_empty=True,
            **({} if one_per_rank(ctx) else {"clients": deployment}),
        )
        arrived = dict(means)
        for (_, from_them, buffer), got in zip(recvs, counts):
            if got:  # 0: its one teacher's update was dropped (one client per rank)
                arrived.update({t: buffer[j : j + 1].copy() for j, t in enumerate(from_them)})
        for c, m in mine.items():
            teacher = int(teachers[c])
            m.received = {teacher: torch.from_numpy(arrived[teacher]).to(m.ctx.device)} if teacher in arrived else {}

    def batch_teacher(self) -> int:
        """The teacher of the next minibatch: t(rank), or with ``teacher_per: batch`` a fresh
        uniform draw among the other clients (one draw per call)."""
        rank = self.ctx.index
        if self.batch_teachers is None:
            return int(self.teachers[rank])
        draw = int(self.batch_teachers.integers(0, self.ctx.clients - 1))
        return draw + (draw >= rank)

    def extra_loss(self, batch: Batch) -> torch.Tensor | None:
        if not self.received or self.params.lambda_ == 0.0:
            return None
        teacher = self.batch_teacher()
        means = self.received[teacher]
        outputs = batch.logits if self.params.share == "logits" else batch.features
        if self.params.classes == "all":  # every sample matches: term_mean makes no difference
            return self.params.lambda_ * F.mse_loss(outputs, means[batch.y])
        mask = batch.y == int(self.ctx.expertise[teacher])
        if not bool(mask.any()):
            return None
        selected = outputs[mask]
        if self.params.term_mean == "batch":  # the sum over the matching samples / (B * width)
            squares = F.mse_loss(selected, means[0].expand_as(selected), reduction="sum")
            return self.params.lambda_ * squares / (len(batch.y) * selected.shape[1])
        return self.params.lambda_ * F.mse_loss(selected, means[0].expand_as(selected))

    def teacher(self) -> int:
        return -1 if self.params.teacher_per == "batch" else int(self.teachers[self.ctx.index])

    def round_teachers(self) -> np.ndarray | None:
        """eval.diagnostics: the round's shared assignment t(i) of every rank (-1 for a single
        client), None when teachers are drawn per minibatch."""
        return None if self.params.teacher_per == "batch" else self.teachers

    def reference(self):
        """eval.diagnostics: (classes, R, outputs) of the round's term, R the received (classes, width)
        means and ``outputs`` the student's map they compare with (features, or the model for logits);
        None when nothing was received or teachers are drawn per minibatch."""
        if self.params.teacher_per == "batch" or not self.received:
            return None
        teacher = int(self.teachers[self.ctx.index])
        model = self.ctx.model
        classes = self.shared_classes if self.params.classes == "all" else [int(self.ctx.expertise[teacher])]
        return classes, self.received[teacher], model if self.params.share == "logits" else model.features
