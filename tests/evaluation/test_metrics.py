import numpy as np

from mpicd.evaluation import metrics


def test_recall_minority_balanced_and_accuracy():
    labels = np.array([0, 0, 0, 0, 1, 1])
    predictions = np.array([0, 0, 0, 1, 1, 0])
    recall = metrics.per_class_recall(labels, predictions, 2)
    np.testing.assert_allclose(recall, [0.75, 0.5])
    assert metrics.minority_accuracy(recall, expertise_class=0) == 0.5
    assert metrics.minority_accuracy(recall, expertise_class=1) == 0.75
    assert metrics.balanced_accuracy(recall) == 0.625
    assert metrics.accuracy(labels, predictions) == 4 / 6


def test_absent_class_has_nan_recall_and_is_ignored_in_means():
    recall = metrics.per_class_recall(np.array([0, 0, 2]), np.array([0, 1, 2]), 3)
    assert np.isnan(recall[1])
    assert metrics.balanced_accuracy(recall) == 0.75
    assert metrics.minority_accuracy(recall, expertise_class=0) == 1.0
