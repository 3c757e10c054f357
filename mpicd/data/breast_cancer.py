"""Wisconsin diagnostic breast cancer (scikit-learn, built in): the dataset that needs no download.

569 cases, 30 features, 0 = malignant, 1 = benign; a stratified held-out split, features
standardised with the training split's statistics only, so nothing of the test set leaks in.
"""

from __future__ import annotations

import numpy as np
from sklearn.datasets import load_breast_cancer

from mpicd.config import DataConfig
from mpicd.data.base import Arrays, Dataset, holdout_description, reject_unused, stratified_holdout

CLASS_NAMES = ("malignant", "benign")


def load(cfg: DataConfig) -> Dataset:
    reject_unused(cfg, "path", "image_size", "classes")
    bunch = load_breast_cancer()
    x = bunch.data.astype(np.float64)
    y = bunch.target.astype(np.int64)
    train, test = stratified_holdout(y, cfg, CLASS_NAMES, "scikit-learn's load_breast_cancer")
    mean = x[train].mean(axis=0)
    std = x[train].std(axis=0)
    std[std == 0] = 1.0
    x = ((x - mean) / std).astype(np.float32)
    return Dataset(name="breast_cancer", train=Arrays(x[train], y[train]), test=Arrays(x[test], y[test]),
                   val=None, num_classes=len(CLASS_NAMES), class_names=CLASS_NAMES, kind="tabular",
                   eval_split=holdout_description(cfg, len(test), "cases"))
