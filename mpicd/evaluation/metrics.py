"""Held-out metrics of one client: per-class recall, minority-class, balanced and overall accuracy."""

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


def accuracy(labels: np.ndarray, predictions: np.ndarray) -> float:
    return float((labels == predictions).mean()) if labels.size else float("nan")
