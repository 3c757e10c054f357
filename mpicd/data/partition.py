"""Split a training set among clients: expertise classes round-robin, skew, an images-per-class cap.

Any number of classes C >= 2: client i is expert in class i mod C, every other class is one of its
minority classes. With fewer clients than classes some classes are no client's expertise (a
minority class everywhere); with more, several clients share an expertise class.

Deterministic from the seed; clients' sets are disjoint and only ever index the training split.
Nested: each class is permuted once from the seed and dealt to the clients like cards, client i
taking positions i, i + N, i + 2N, ... of it, and a client keeps a prefix of its hand. The
permutation does not depend on the skew or the cap, so with the same seed and client count a
client's images at a higher skew (or a lower cap) are a subset of those at a lower skew (or a
higher cap), and its expertise-class images do not change with the skew: comparing skews
changes the skew only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mpicd import seeds
from mpicd.config import ConfigError

SKEW_MODES = ("symmetric", "authors")


@dataclass(frozen=True, eq=False)
class Partition:
    train_indices: tuple[np.ndarray, ...]  # per client: sorted int64 indices into dataset.train
    expertise: np.ndarray  # (clients,) int64, the expertise class of each client
    train_counts: np.ndarray  # (clients, classes) int64
    base_per_class: int  # images of each class a client gets before skew


def expertise_classes(num_clients: int, num_classes: int) -> np.ndarray:
    """Round-robin: client i is expert in class i % num_classes."""
    return np.arange(num_clients, dtype=np.int64) % num_classes


def kept_after_skew(n: int, skew: float) -> int:
    """Images a client keeps of a non-expertise class it would have had ``n`` of: floor((1 - skew) * n).

    The 1e-9 absorbs float error, so that e.g. skew 0.6 of 10 keeps exactly 4.
    """
    return int(np.floor((1.0 - skew) * n + 1e-9))


def make_partition(
    labels: np.ndarray,
    num_classes: int,
    num_clients: int,
    skew: float,
    images_per_class: int | None,
    seed: int,
    skew_mode: str = "symmetric",
) -> Partition:
    """Give client i ``base`` images of its expertise class and ``kept_after_skew(base, skew)`` of each other.

    ``base`` is ``images_per_class``, or by default the most every class can give every client
    (min over classes of count // clients), so the expertise class really is the majority.
    ``skew_mode="authors"`` reproduces the authors' code: only clients whose expertise class is 0
    lose images of their other classes; every other client keeps ``base`` of every class.
    """
    labels = np.asarray(labels)
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise ValueError(f"labels must lie in 0..{num_classes - 1}, got {labels.min()}..{labels.max()}")
    if not 0.0 <= skew < 1.0:
        raise ConfigError("data.skew", f"must be in [0, 1), got {skew!r}")
    if skew_mode not in SKEW_MODES:
        raise ConfigError("data.skew_mode", f"must be one of {', '.join(SKEW_MODES)}, got {skew_mode!r}")
    counts = np.bincount(labels, minlength=num_classes)
    largest = int(counts.min()) // num_clients
    if largest == 0:
        c = int(counts.argmin())
        raise ConfigError(
            "clients", f"class {c} has {counts[c]} training images, fewer than one per client for {num_clients} clients"
        )
    base = largest if images_per_class is None else images_per_class
    if base * num_clients > counts.min():  # name the class that sets the limit: the rarest one
        c = int(counts.argmin())
        short = [int(k) for k in np.flatnonzero(counts < base * num_clients)]
        raise ConfigError(
            "data.images_per_class",
            f"{base} per client x {num_clients} clients needs {base * num_clients} images of every "
            f"class; class {c}, the rarest, has {counts[c]} in the training split (short: classes "
            f"{', '.join(map(str, short))}); the largest allowed value is {largest} = {counts[c]} // {num_clients}",
        )
    expertise = expertise_classes(num_clients, num_classes)
    loses = np.arange(num_classes)[None, :] != expertise[:, None]
    if skew_mode == "authors":
        loses &= (expertise == 0)[:, None]
    train_counts = np.where(loses, kept_after_skew(base, skew), base).astype(np.int64)
    empty = np.argwhere(train_counts == 0)
    if len(empty):
        i, c = (int(v) for v in empty[0])
        raise ConfigError(
            "data.skew",
            f"client {i} (expertise class {expertise[i]}) would get 0 images of "
            f"class {c}: floor((1 - {skew}) * {base}) = 0; a class missing on a client is an "
            f"error, so lower data.skew or raise data.images_per_class",
        )
    rng = seeds.rng(seed, seeds.PARTITION)
    taken: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for c in range(num_classes):
        order = rng.permutation(np.flatnonzero(labels == c))
        for i in range(num_clients):
            taken[i].append(order[i::num_clients][: train_counts[i, c]])
    train_indices = tuple(np.sort(np.concatenate(parts)).astype(np.int64) for parts in taken)
    return Partition(train_indices=train_indices, expertise=expertise, train_counts=train_counts, base_per_class=base)
