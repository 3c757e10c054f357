"""Partial participation (``participation: C``, FedAvg's C): which clients take part in a round.

Each round a sample of ``m = max(1, floor(C N))`` of the N clients, drawn without replacement from
the stream (seed, PARTICIPATION, round) (:mod:`mpicd.core.seeds`), the same on every rank and layout,
trains and communicates; the others neither train nor send nor receive, and keep their state
(model, optimizer, algorithm), except under FedAvg, where every client takes the round's average
(the global model a server would hand it when it is next selected). Co-distillation draws its
teachers and students among the participants. ``C = 1`` (the default) is every client, no draw.
The round's participants are recorded in ``/metrics/participated``.
"""

from __future__ import annotations

import numpy as np

from mpicd.core import seeds


def sample_size(clients: int, fraction: float) -> int:
    """m = max(1, floor(C N)) (a hair of tolerance, so that C = 0.3 of 10 clients is 3)."""
    return max(1, min(clients, int(np.floor(fraction * clients + 1e-9))))


def participants(seed: int, round_index: int, clients: int, fraction: float) -> np.ndarray | None:
    """The round's participating clients, sorted; None when every client takes part (C = 1)."""
    if fraction >= 1.0:
        return None
    drawn = seeds.rng(seed, seeds.PARTICIPATION, round_index).choice(
        clients, size=sample_size(clients, fraction), replace=False
    )
    return np.sort(drawn).astype(np.int64)
