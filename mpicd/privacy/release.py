"""The private releases of the representation-sharing algorithms, one function per shape.

* co-distillation's R, the mean feature (or logit) vector of the teacher's expertise class:
  :func:`sampled_private_mean` -- a Poisson sample (rate q) of the class's n images, their clipped
  vectors summed with Gaussian noise, divided by the public expected count q n. Shape (W,).
  With ``classes: all`` the C per-class means are one release (each image is in one class, so one
  record still moves the stacked sums by at most C): :func:`private_class_sums` with public
  counts, divided by each class's public q n_c.
* FedProto's per-class feature sums + counts and FedDistill's per-class logit sums + counts:
  :func:`private_class_sums` -- (C, W) noised sums and (C,) counts, noised (default) or exact;
  :func:`class_sums_payload` lays them out as the algorithms' Allreduce payload
  ``[sums (C W) ; counts (C)]`` (``PerClassMeans.payload(weighted=True)``'s layout).

Why R divides by a public q n and is not a noised count: R is one mean, and a public denominator
makes the release a post-processing of one noised sum, so the accountant sees exactly the
Poisson-subsampled Gaussian with multiplier sigma (a noised count would cost a factor sqrt(2) in
the multiplier, :func:`mpicd.privacy.gaussian.release_multiplier`). Dividing by the realised
sample size instead would leak it (it moves by one with the canary). But n, the number of images
of the class the client holds, is not public under the zero-out adjacency (mpicd.privacy.ADJACENCY:
the null record has no class), unlike the client's dataset size that DP-SGD divides by (Abadi et
al. 2016, lot size L = qN; Opacus' expected batch size): so ``privacy.counts: public`` (q n) is
refused where a run claims privacy, and the default divides by the noised count. Why the per-class releases noise their counts by
default: FedProto weights clients by them and FedDistill needs them to form means over clients,
they differ per class and client, and a class with few images would be exposed by its exact
count; ``noise_counts=False`` is for callers whose counts are public (then pass multiplier sigma).

Assumptions the caller must keep (what the accountant assumes): each record (image) contributes
at most one row (one eval-mode pass, not one row per local epoch); the denominator is fixed before
the data are seen; the generator is used for nothing else between the sample and the noise; the
same release goes to every receiver (one R for all of a teacher's students, one accounting event).
Floating point: the noise is drawn in float64 from numpy's generator and the payload cast to
float32, which is not a certified floating-point-safe Gaussian (Mironov 2012; Jin et al. 2022);
accepted here as in Opacus and TF Privacy.
"""

from __future__ import annotations

import numpy as np

from mpicd.privacy.clip import clip_rows
from mpicd.privacy.gaussian import check_multiplier, gaussian_sum, noise_std
from mpicd.privacy.sampling import poisson_subset


def private_mean(rows, *, clip: float, sigma: float, denominator: float, generator: np.random.Generator) -> np.ndarray:
    """(W,) float64: (sum of the clipped rows + N(0, (sigma C)^2 I)) / ``denominator`` (public, > 0)."""
    denominator = float(denominator)
    if not denominator > 0:
        raise ValueError(f"privacy: a mean's public denominator must be > 0, got {denominator!r}")
    return gaussian_sum(rows, clip=clip, sigma=sigma, generator=generator) / denominator


def sampled_private_mean(
    rows, *, q: float, clip: float, sigma: float, denominator: float, generator: np.random.Generator
) -> np.ndarray:
    """Co-distillation's R: Poisson-sample the n rows at rate q, then :func:`private_mean`.

    ``rows`` are the vectors of all n images of the class (or call :func:`poisson_subset` and
    :func:`private_mean` with the same generator, in that order, to compute only the sampled
    images' vectors: the draws are the same). ``denominator`` should be the public q n.
    """
    rows = np.asarray(rows)
    taken = poisson_subset(len(rows), q, generator)
    return private_mean(rows[taken], clip=clip, sigma=sigma, denominator=denominator, generator=generator)


def private_class_sums(
    rows,
    labels,
    num_classes: int,
    *,
    clip: float,
    sigma: float,
    generator: np.random.Generator,
    noise_counts: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """((C, W) sums, (C,) counts), float64, of the clipped rows by label, Gaussian-noised.

    Sums get N(0, (sigma C)^2) on every entry (all C x W normals drawn first, row by row); counts
    N(0, sigma^2) each when ``noise_counts`` (C more normals), else the exact counts. The
    accountant's multiplier for this release is ``release_multiplier(sigma, noise_counts)``.
    """
    labels = np.asarray(labels)
    rows = np.asarray(rows)
    if labels.ndim != 1 or len(labels) != len(rows):
        raise ValueError(f"privacy: {len(rows)} rows need as many labels, got shape {labels.shape}")
    if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
        raise ValueError(f"privacy: labels must be in 0..{num_classes - 1}")

    clipped = clip_rows(rows.reshape(len(rows), -1), clip)
    sums = np.zeros((num_classes, clipped.shape[1]))
    np.add.at(sums, labels, clipped)
    counts = np.bincount(labels, minlength=num_classes).astype(np.float64)
    sums += generator.normal(0.0, noise_std(clip, sigma), size=sums.shape)
    if noise_counts:
        counts += generator.normal(0.0, check_multiplier(sigma), size=num_classes)
    return sums, counts


def class_sums_payload(sums: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The Allreduce payload ``[sums (C W) ; counts (C)]`` as one contiguous float32 vector."""
    return np.ascontiguousarray(np.concatenate([np.asarray(sums).reshape(-1), np.asarray(counts)]), dtype=np.float32)


def means_from_sums(sums: np.ndarray, counts: np.ndarray, min_count: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Post-processing (free of privacy cost): (C, W) means sums / counts where the (noised)
    count is >= ``min_count``, zero rows elsewhere, and the (C,) bool mask of classes kept."""
    counts = np.asarray(counts, dtype=np.float64)
    keep = counts >= min_count
    means = np.zeros_like(np.asarray(sums, dtype=np.float64))
    means[keep] = np.asarray(sums, dtype=np.float64)[keep] / counts[keep, None]
    return means, keep
