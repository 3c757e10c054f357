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

Two partitions keep the class prevalence instead (``data.partition``): *natural* gives every client
the training split's prevalence p, and *dirichlet* draws client i's class proportions
q_i ~ Dirichlet(alpha p) (Hsu, Qi & Brown 2019, "Measuring the effects of non-identical data
distribution"; E[q_i] = p, Var[q_ic] = p_c (1 - p_c) / (alpha + 1)). Each client gets M images
(``data.images_per_client``, by default the most every class allows), q_i M rounded by largest
remainders; a client's expertise class is then its most frequent class (ties: the lowest).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mpicd.config.sections import ConfigError
from mpicd.core import seeds

SKEW_MODES = ("symmetric", "authors")
SCHEMES = ("expertise", "natural", "dirichlet")


@dataclass(frozen=True, eq=False)
class Partition:
    train_indices: tuple[np.ndarray, ...]  # per client: sorted int64 indices into dataset.train
    expertise: np.ndarray  # (clients,) int64, the expertise class of each client
    train_counts: np.ndarray  # (clients, classes) int64
    base_per_class: int  # images of each class a client gets before skew (0: natural or dirichlet)
    scheme: str = "expertise"  # data.partition
    proportions: np.ndarray | None = None  # natural, dirichlet: (clients, classes) the q_i the counts round
    images_per_client: int | None = None  # natural, dirichlet: M
    alpha: float | None = None  # dirichlet: the concentration

    @property
    def description(self) -> str:
        """One line for the results file and ``mpicd check``, e.g. ``dirichlet (alpha 0.5), 120 images per client``."""
        if self.scheme == "expertise":
            return f"expertise classes round-robin, {self.base_per_class} images per class before skew"
        scheme = f"dirichlet (alpha {self.alpha:g})" if self.scheme == "dirichlet" else "natural prevalence"
        return f"{scheme}, {self.images_per_client} images per client"


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
    scheme: str = "expertise",
    alpha: float | None = None,
    images_per_client: int | None = None,
) -> Partition:
    """Give client i ``base`` images of its expertise class and ``kept_after_skew(base, skew)`` of each other.

    ``base`` is ``images_per_class``, or by default the most every class can give every client
    (min over classes of count // clients), so the expertise class really is the majority.
    ``skew_mode="authors"`` reproduces the authors' code: only clients whose expertise class is 0
    lose images of their other classes; every other client keeps ``base`` of every class.
    ``scheme`` natural or dirichlet: :func:`prevalence_partition` (skew, mode and cap unused).
    """
    labels = np.asarray(labels)
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise ValueError(f"labels must lie in 0..{num_classes - 1}, got {labels.min()}..{labels.max()}")
    if scheme not in SCHEMES:
        raise ConfigError("data.partition", f"must be one of {', '.join(SCHEMES)}, got {scheme!r}")
    if scheme != "expertise":
        return prevalence_partition(labels, num_classes, num_clients, scheme, alpha, images_per_client, seed)
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


def largest_remainder(total: int, proportions: np.ndarray) -> np.ndarray:
    """Integers summing to ``total`` closest to ``total * proportions`` (one row each): the floors,
    then one more to each of the largest fractional parts (ties: the lowest class)."""
    exact = total * np.asarray(proportions, dtype=np.float64)
    counts = np.floor(exact + 1e-9).astype(np.int64)
    for row, frac in zip(counts, exact - counts):
        short = total - int(row.sum())
        if short > 0:
            row[np.argsort(-frac, kind="stable")[:short]] += 1
    return counts


def class_proportions(labels: np.ndarray, num_classes: int, num_clients: int, scheme: str, alpha, seed: int):
    """(clients, classes): the prevalence p on every row (natural), or q_i ~ Dirichlet(alpha p) per
    client (dirichlet) from the partition's own stream (key 1: the class permutations stay the same)."""
    counts = np.bincount(labels, minlength=num_classes)
    absent = np.flatnonzero(counts == 0)
    if len(absent):
        raise ConfigError("data.partition", f"class {int(absent[0])} has no training images")
    prevalence = counts / counts.sum()
    if scheme == "natural":
        return np.tile(prevalence, (num_clients, 1))
    if alpha is None or not alpha > 0:
        raise ConfigError("data.dirichlet_alpha", f"partition dirichlet needs a concentration > 0, got {alpha!r}")
    return seeds.rng(seed, seeds.PARTITION, 1).dirichlet(alpha * prevalence, size=num_clients)


def prevalence_partition(
    labels: np.ndarray,
    num_classes: int,
    num_clients: int,
    scheme: str,
    alpha: float | None,
    images_per_client: int | None,
    seed: int,
) -> Partition:
    """Every client ``M`` images, ``largest_remainder(M, q_i)`` of each class (see the module docstring).

    ``M`` is ``images_per_client``, or the largest that every class can supply at these proportions
    (found by bisection). Natural deals each permuted class like cards as the expertise partition
    does (nested across ``M``); dirichlet hands out consecutive runs of it, client 0 first.
    """
    q = class_proportions(labels, num_classes, num_clients, scheme, alpha, seed)
    available = np.bincount(labels, minlength=num_classes)

    def need(m: int) -> np.ndarray:
        return largest_remainder(m, q).sum(axis=0)

    lo, hi = 0, len(labels) // num_clients  # need(0) fits; find the largest m that fits
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if np.all(need(mid) <= available) else (lo, mid - 1)
    largest = lo
    if largest == 0:
        raise ConfigError(
            "clients",
            f"{len(labels)} training images cannot give each of {num_clients} clients one image "
            f"at the {scheme} proportions",
        )
    m = largest if images_per_client is None else images_per_client
    needed = need(m)
    if np.any(needed > available):
        c = int(np.argmax(needed - available))  # the most overdrawn class
        short = ", ".join(str(int(k)) for k in np.flatnonzero(needed > available))
        raise ConfigError(
            "data.images_per_client",
            f"{m} per client x {num_clients} clients at the {scheme} proportions needs {int(needed[c])} images "
            f"of class {c}, which has {int(available[c])} in the training split (short: classes {short}); the "
            f"largest that fits is {largest}",
        )
    train_counts = largest_remainder(m, q)
    rng = seeds.rng(seed, seeds.PARTITION)  # the same class permutations as the expertise partition
    taken: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for c in range(num_classes):
        order = rng.permutation(np.flatnonzero(labels == c))
        starts = np.concatenate([[0], np.cumsum(train_counts[:, c])])
        for i in range(num_clients):
            hand = order[i::num_clients] if scheme == "natural" else order[starts[i] :]
            taken[i].append(hand[: train_counts[i, c]])
    return Partition(
        train_indices=tuple(np.sort(np.concatenate(parts)).astype(np.int64) for parts in taken),
        expertise=np.argmax(train_counts, axis=1).astype(np.int64),  # the first maximum: ties -> lowest class
        train_counts=train_counts,
        base_per_class=0,
        scheme=scheme,
        proportions=q,
        images_per_client=m,
        alpha=alpha if scheme == "dirichlet" else None,
    )
