"""The order in which a client's epoch visits its training images (``train.sampler``).

``shuffle`` (the default): a permutation of its n images, each seen once per epoch.

``balanced``: class-balanced sampling, the simple baseline that FL benchmarks on medical data find
hard to beat under label skew (FedMedICL, MICCAI 2024): n draws with replacement, image i drawn with
probability 1 / (K n_{y_i}), K the classes the client holds and n_c its images of class c, so every
class it holds is drawn equally often in expectation (torch's ``WeightedRandomSampler`` with weights
1 / n_{y_i}, ``replacement=True``, ``num_samples=n``). The epoch keeps its length (n draws, the same
batches per epoch); a minority image is seen several times, a majority image may not be seen. A class
the client lacks stays absent: sampling cannot invent it.

Both draw from the client's shuffle stream of the (round, epoch) (:data:`mpicd.core.seeds.SHUFFLE`), so
the order is the same on every layout of clients on ranks.

With privacy: DP-SGD (FedAvg, FedAMP) refuses ``balanced`` (:func:`mpicd.run.plan.check_dpsgd`): its
accountant charges every step as a Poisson sample that takes each image independently at one rate q,
while balanced draws take a minority image at a higher rate, set by the class sizes, which zero-out
adjacency keeps private. The representation releases (co-distillation, FedProto, FedDistill) draw
their own Poisson sample at ``privacy.sample_rate`` from all the client's images after the epoch,
whatever order the epoch took: the sampler changes the model they read, which their accounting
already takes as any model, so they accept it.
"""

from __future__ import annotations

import numpy as np


def class_balanced_probabilities(labels: np.ndarray) -> np.ndarray:
    """p_i = 1 / (K n_{y_i}) for each image i (float64, sums to 1), K the distinct labels, n_c their counts."""
    labels = np.asarray(labels)
    classes, inverse, counts = np.unique(labels, return_inverse=True, return_counts=True)
    return 1.0 / (len(classes) * counts[inverse].astype(np.float64))


def epoch_order(n: int, sampler: str, rng: np.random.Generator, labels: np.ndarray | None = None) -> np.ndarray:
    """The indices into the client's n images that one epoch visits, in order (int64, length n);
    ``labels`` (n,): the images' classes, which ``balanced`` draws by."""
    if sampler == "shuffle":
        return rng.permutation(n)
    if sampler == "balanced":
        if len(labels) != n:
            raise ValueError(f"train.sampler balanced: {len(labels)} labels for {n} images")
        if n == 0:
            return np.zeros(0, dtype=np.int64)
        return rng.choice(n, size=n, replace=True, p=class_balanced_probabilities(labels))
    raise ValueError(f"unknown train.sampler {sampler!r}")
