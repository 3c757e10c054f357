"""Wisconsin diagnostic breast cancer (scikit-learn, built in): the dataset that needs no download.

569 cases, 30 features, 0 = malignant, 1 = benign; stratified held-out and validation splits,
features standardised with the training split's statistics only, so nothing of them leaks in.
"""

from __future__ import annotations

import numpy as np
from sklearn.datasets import load_breast_cancer

from mpicd.config import DataConfig
from mpicd.data.base import Dataset, reject_unused, split_dataset

CLASS_NAMES = ("malignant", "benign")


def load(cfg: DataConfig) -> Dataset:
    reject_unused(cfg, "path", "image_size", "classes")
    bunch = load_breast_cancer()
    return split_dataset("breast_cancer", "tabular", bunch.data.astype(np.float32),
                         bunch.target.astype(np.int64), CLASS_NAMES, cfg, "scikit-learn's load_breast_cancer")
