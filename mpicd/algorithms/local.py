"""Local training only: each client trains alone and nothing crosses MPI (the lower reference)."""

from __future__ import annotations

from .base import Algorithm


class LocalOnly(Algorithm):
    name = "local"
