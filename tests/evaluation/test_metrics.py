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


# ------------------------------------------------------------------ personalised accuracy, by hand


def test_personal_accuracy_weights_each_recall_by_the_clients_own_label_distribution():
    # 80 and 20 training images: 0.8 * 0.9 + 0.2 * 0.5 = 0.72 + 0.10 = 0.82
    assert metrics.personal_accuracy(np.array([0.9, 0.5]), np.array([80, 20])) == 0.82
    # only the ratios count: the shares give the same number
    assert abs(metrics.personal_accuracy(np.array([0.9, 0.5]), np.array([0.8, 0.2])) - 0.82) < 1e-15
    # the other client's distribution (20, 80): 0.2 * 0.9 + 0.8 * 0.5 = 0.18 + 0.40 = 0.58
    assert abs(metrics.personal_accuracy(np.array([0.9, 0.5]), np.array([20, 80])) - 0.58) < 1e-15


def test_a_class_absent_from_the_split_is_left_out_and_the_rest_renormalised():
    # 3 classes, counts (50, 30, 20); class 1 has no image in the split (recall NaN): a sample drawn
    # from the split cannot hold it, so p is renormalised over classes 0 and 2: 50 / 70 and 20 / 70
    recall = np.array([0.9, np.nan, 0.5])
    expected = (50 * 0.9 + 20 * 0.5) / 70  # = 55 / 70 = 0.785714...
    assert abs(metrics.personal_accuracy(recall, np.array([50, 30, 20])) - expected) < 1e-15
    assert abs(expected - 11 / 14) < 1e-15
    # not the unrenormalised sum 0.5 * 0.9 + 0.2 * 0.5 = 0.55
    assert abs(metrics.personal_accuracy(recall, np.array([50, 30, 20])) - 0.55) > 0.2


def test_a_class_the_client_lacks_weighs_nothing():
    # the client has no training image of class 2 (a Dirichlet partition): its recall does not count,
    # however bad: (60 * 0.8 + 40 * 0.6 + 0 * 0.0) / 100 = (48 + 24) / 100 = 0.72
    recall = np.array([0.8, 0.6, 0.0])
    assert abs(metrics.personal_accuracy(recall, np.array([60, 40, 0])) - 0.72) < 1e-15
    # a client of one class scores that class's recall alone
    assert metrics.personal_accuracy(recall, np.array([0, 25, 0])) == 0.6
    # no weight on any class the split holds: nothing to draw, NaN
    assert np.isnan(metrics.personal_accuracy(np.array([np.nan, 0.6]), np.array([10, 0])))


def test_a_one_class_predictor_scores_its_majority_share():
    # predicting the expertise class 0 always: recall (1, 0); balanced accuracy 0.5, minority accuracy
    # 0, but personalised accuracy = the client's share of class 0, 100 / (100 + 10) = 0.909...
    recall = metrics.per_class_recall(np.array([0, 0, 1, 1, 1]), np.array([0, 0, 0, 0, 0]), 2)
    assert metrics.minority_accuracy(recall, expertise_class=0) == 0.0
    assert metrics.balanced_accuracy(recall) == 0.5
    assert abs(metrics.personal_accuracy(recall, np.array([100, 10])) - 10 / 11) < 1e-15
