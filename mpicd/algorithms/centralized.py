"""Centralised training (the upper reference): every rank trains on the union of all clients' data.

``trains_on_union`` makes the loop give every rank the concatenation of all clients' training
sets (the same held-out evaluation set as every other algorithm); nothing crosses MPI. Each rank
keeps its own shuffle order, so the N models are N runs of centralised training, each scored
by the minority accuracy of that rank's client (its non-expertise class). Every rank reads the
union from the dataset file itself: bytes per round per rank 0 (no ``payloads``).
"""

from __future__ import annotations

from mpicd.algorithms.base import Algorithm


class Centralized(Algorithm):
    name = "centralized"
    trains_on_union = True
