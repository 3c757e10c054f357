"""Local training only: each client trains alone and nothing crosses MPI (the lower reference).

Bytes per round per rank: 0 (no ``payloads``).
"""

from __future__ import annotations

from mpicd.algorithms.base import Algorithm


class LocalOnly(Algorithm):
    name = "local"

    @classmethod
    def check_private(cls, params) -> None:
        """Nothing leaves the rank: privacy costs nothing (epsilon 0: the privacy study's reference)."""
