"""Held-out metrics of one client: per-class recall, minority-class, balanced, overall and personalised accuracy."""

from __future__ import annotations

import numpy as np


def confusion(labels: np.ndarray, predictions: np.ndarray, num_classes: int) -> np.ndarray:
    """(true class, predicted class) counts."""
    return np.bincount(labels * num_classes + predictions, minlength=num_classes**2).reshape(num_classes, num_classes)


def per_class_recall(labels: np.ndarray, predictions: np.ndarray, num_classes: int) -> np.ndarray:
    """Recall of each class; NaN for a class absent from ``labels`` (never the case on our test sets)."""
    matrix = confusion(labels, predictions, num_classes)
    support = matrix.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(support > 0, np.diag(matrix) / support, np.nan)


def minority_accuracy(recall: np.ndarray, expertise_class: int) -> float:
    """The paper's metric for one client: mean recall of its non-expertise class(es).

    With two classes that is the recall of the one other class. With C > 2 classes every class but
    the client's expertise class is a minority class on it (each keeps 1 - skew of its images), so
    the metric is their unweighted (macro) mean recall over the C - 1 classes, whatever their
    sizes in the held-out set; a class absent from it (never on the official splits) is left out.
    """
    others = np.delete(recall, expertise_class)
    return float(np.nanmean(others)) if others.size else float("nan")


def balanced_accuracy(recall: np.ndarray) -> float:
    return float(np.nanmean(recall))


def personal_accuracy(recall: np.ndarray, distribution: np.ndarray) -> float:
    """Personalised accuracy: the expected accuracy on a held-out sample drawn with the client's own
    label distribution, sum_c p_c recall_c / sum_c p_c over the classes present in the split.

    ``distribution``: the client's training images of each class (or their shares: only the ratios
    count), p_c; ``recall``: per class on the split, NaN for a class the split lacks. A sample drawn
    from the split with class shares p (each class's images uniformly) holds class c with probability
    p_c and is right on it with probability recall_c, so its expected accuracy is exactly this sum;
    a class absent from the split cannot be drawn, so p is renormalised over the classes present (a
    class the client lacks, p_c = 0, weighs nothing). NaN when p is 0 on every class present.

    Why the exact weighting rather than a drawn subsample: it is the subsample's expectation with
    none of its sampling noise (no stream to seed, no variance between clients or seeds from the
    draw), and it keeps scoring on the official test split, the same images for every client and
    method. Personalised-FL benchmarks (PFLlib) instead carve 25% of each client's own data as its
    test set, which mpicd cannot do without giving up the official split
    (docs/explanation/two-scoring-protocols.md).
    """
    recall = np.asarray(recall, dtype=np.float64)
    weights = np.asarray(distribution, dtype=np.float64)
    present = ~np.isnan(recall)
    total = weights[present].sum()
    return float((weights[present] * recall[present]).sum() / total) if total > 0 else float("nan")


def accuracy(labels: np.ndarray, predictions: np.ndarray) -> float:
    return float((labels == predictions).mean()) if labels.size else float("nan")
