"""The random streams of the private path: ``seeds.rng(seed, seeds.PRIVACY, a, b, use)``.

``use`` (the last key word) says what the stream is for, so no two coincide (see mpicd/seeds.py):
a release's Poisson sample then its noise (a = client, b = round: keyed by the client, not the MPI
rank that holds it, as every client stream in mpicd/seeds.py), DP-SGD's batch sampling and noise
(torch generators, same a, b), the audit's neighbouring releases (a = trial, b = 0 without the
canary, 1 with it) and the membership attack's draws (a = trial, b = 0).
"""

from __future__ import annotations

import numpy as np

from .. import seeds

RELEASE = 0  # one release: its Poisson sample, then its noise, in that order
DPSGD_SAMPLING = 1
DPSGD_NOISE = 2
AUDIT = 3
ATTACK = 4


def release_generator(seed: int, client: int, round_index: int) -> np.random.Generator:
    """The generator of one client's release in one round (what the algorithms will use)."""
    return seeds.rng(seed, seeds.PRIVACY, client, round_index, RELEASE)
