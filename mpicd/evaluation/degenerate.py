"""Runs that learned nothing class-discriminative: a client that predicts one class for its whole
held-out set scores 0 minority accuracy and looks like a result (0.000 ± 0.000, "ties").

A client *predicts a single class* in a round when its test recall is one-hot: 1 for one class,
0 for every other (every class has held-out images, so no other prediction gives that). It is
flagged when that holds in each of its last LAST_ROUNDS evaluated rounds (fewer if the run has
fewer). The run prints a warning and records the clients (attr ``single_class_clients``); the
report warns per run and gives a cell made only of runs in which *every* client is flagged no
verdict ("degenerate").
"""

from __future__ import annotations

import numpy as np

LAST_ROUNDS = 3


def one_hot(recall: np.ndarray) -> np.ndarray:
    """(..., classes) recall -> (...) bool: exactly one class at 1 and the rest at 0."""
    recall = np.asarray(recall, dtype=np.float64)
    return (np.isclose(recall, 1.0).sum(axis=-1) == 1) & (np.isclose(recall, 0.0).sum(axis=-1) == recall.shape[-1] - 1)


def single_class_clients(recall: np.ndarray, evaluated: np.ndarray, last: int = LAST_ROUNDS) -> list[int]:
    """Clients whose recall (rounds, clients, classes) is one-hot in each of the last ``last`` of the
    ``evaluated`` round indexes."""
    window = np.asarray(evaluated, dtype=np.int64)[-last:]
    if not len(window):
        return []
    return [int(c) for c in np.flatnonzero(one_hot(recall[window]).all(axis=0))]


def warning(clients: list[int], total: int, last: int) -> str:
    who = (
        "every client"
        if len(clients) == total
        else f"client{'s' if len(clients) > 1 else ''} {', '.join(map(str, clients))}"
    )
    return (
        f"{who} predicted a single class for the whole held-out set in the last {last} evaluated "
        "rounds: the scores say it learned nothing class-discriminative, not how well it separates classes"
    )
