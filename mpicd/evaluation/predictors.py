"""Held-out evaluation of a rank's clients: each distinct predictor once, every client scored from it.

Clients packed on a rank (:mod:`mpicd.mpi.assignment`) often hold the same model at evaluation time: FedAvg
ends every round with the global model on every client. Evaluating it for each client repeats the same
forward passes over the held-out splits K times (64 FedAvg clients on 2 ranks, 20 rounds: 126 s of
their /metrics/eval_seconds against 9 s of training; BENCHMARKS.md, "Each distinct model evaluated
once"). So an algorithm declares that its
clients end a round with the same predictor (:attr:`mpicd.algorithms.Algorithm.shared_at_evaluation`),
and the clients of a rank whose predictor tensors (:meth:`~mpicd.algorithms.Algorithm.predictor_tensors`)
are also equal bit for bit are grouped: the first predicts, and each client's scores (per-class
recall, accuracy, the minority accuracy of its own expertise class, the personalised accuracy of its
own label distribution) come from those predictions, the same numbers as predicting for each.
The bits are checked, not assumed: a declared algorithm whose clients differ in a round (every
update dropped, a model changed by hand) is evaluated per client, and an undeclared (personalised)
one always is.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mpicd.evaluation import metrics


@dataclass(frozen=True)
class Scores:
    """Metrics of one client's model on one evaluation split."""

    recall: np.ndarray  # (classes,)
    acc: float
    balanced_acc: float
    minority_acc: float
    personal_acc: float  # weighted by the client's own training label distribution (metrics.personal_accuracy)


def predicted_labels(algorithm, x: torch.Tensor, batch_size: int, generic: bool = False) -> np.ndarray:
    """The class ``algorithm.predict`` (``generic``: ``predict_generic``) gives each row of ``x`` (its
    model in eval mode, no gradient), in batches of ``batch_size``: one device-to-host copy per split,
    not one per batch."""
    algorithm.ctx.model.eval()
    predict = algorithm.predict_generic if generic else algorithm.predict
    with torch.no_grad():
        labels = [predict(x[i : i + batch_size]).argmax(dim=1) for i in range(0, len(x), batch_size)]
    return torch.cat(labels).cpu().numpy()


def scores(
    labels: np.ndarray, predictions: np.ndarray, num_classes: int, expertise_class: int, distribution: np.ndarray
) -> Scores:
    """One client's scores from predictions on a split; ``expertise_class`` decides its minority classes,
    ``distribution`` (its training images of each class) weighs its personalised accuracy."""
    recall = metrics.per_class_recall(labels, predictions, num_classes)
    return Scores(
        recall=recall,
        acc=metrics.accuracy(labels, predictions),
        balanced_acc=metrics.balanced_accuracy(recall),
        minority_acc=metrics.minority_accuracy(recall, expertise_class),
        personal_acc=metrics.personal_accuracy(recall, distribution),
    )


def for_expertise(scores: Scores, expertise_class: int, distribution: np.ndarray) -> Scores:
    """The scores of another client with the same predictions on the same split: recall, accuracy and
    balanced accuracy are the same; the minority accuracy is of its own expertise class's complement,
    the personalised accuracy weighted by its own label ``distribution``."""
    return Scores(
        recall=scores.recall.copy(),
        acc=scores.acc,
        balanced_acc=scores.balanced_acc,
        minority_acc=metrics.minority_accuracy(scores.recall, expertise_class),
        personal_acc=metrics.personal_accuracy(scores.recall, distribution),
    )


def _bits(tensors: list[torch.Tensor]) -> tuple[tuple, list[torch.Tensor]]:
    """The tensors' shapes, dtypes and devices, and each one's bytes (a view, no copy): equal only
    when every element is the same bit pattern (-0.0 is not 0.0, and a NaN equals the same NaN),
    which is what makes two forward passes give the same output."""
    layout = tuple((t.shape, t.dtype, t.device) for t in tensors)
    return layout, [t.detach().reshape(-1).contiguous().view(torch.uint8) for t in tensors]


def _equal(a: tuple, b: tuple) -> bool:
    return a[0] == b[0] and all(torch.equal(x, y) for x, y in zip(a[1], b[1]))


def same_tensors(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    """Whether two predictors' tensors are equal bit for bit (same count, shapes, dtypes and bytes)."""
    return _equal(_bits(a), _bits(b))


def predictor_groups(algorithms: list, once: bool = True) -> list[list[int]]:
    """Positions in ``algorithms`` (one rank's clients, in order) grouped by the predictor they hold.

    A client joins the first group whose first member's tensors equal its own bit for bit, both of
    an algorithm that declares ``shared_at_evaluation``; any other client is a group of one.
    ``once`` False: every client a group of its own (``eval.shared_models: per_client``).
    """
    groups: list[list[int]] = []
    held: list[tuple | None] = []  # each group's first member's bits (None: never shared)
    for i, algorithm in enumerate(algorithms):
        mine = _bits(algorithm.predictor_tensors()) if once and type(algorithm).shared_at_evaluation else None
        for group, theirs in zip(groups, held):
            if mine is not None and theirs is not None and _equal(mine, theirs):
                group.append(i)
                break
        else:
            groups.append([i])
            held.append(mine)
    return groups
