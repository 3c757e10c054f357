"""All randomness of a run derives from (seed, purpose, rank, round, ...) through these functions.

Distinct purposes get distinct streams, so adding a random draw in one place never shifts
another; the same config and seed therefore give the same numbers on every machine.
"""

from __future__ import annotations

import numpy as np

# Purposes of the random streams: one number each so that no two streams ever coincide.
INIT, SHUFFLE, ALGORITHM, TEACHERS, PARTITION = 1, 2, 3, 4, 5


def seed_sequence(seed: int, *key: int) -> np.random.SeedSequence:
    return np.random.SeedSequence([seed, *key])


def rng(seed: int, *key: int) -> np.random.Generator:
    return np.random.default_rng(seed_sequence(seed, *key))


def torch_seed(seed: int, *key: int) -> int:
    """A 63-bit torch seed derived from the same key as :func:`rng`."""
    return int(seed_sequence(seed, *key).generate_state(1, dtype=np.uint64)[0] >> np.uint64(1))
