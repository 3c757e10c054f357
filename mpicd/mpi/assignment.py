"""Which MPI rank holds which client: N clients on R <= N ranks (``clients_per_rank``).

``clients_per_rank: one`` (the default) is one client per rank, client i on rank i, and the job
must have exactly ``clients`` ranks. ``balanced`` allows any R <= N ranks; each rank then holds
several clients and trains them in turn every round (:mod:`mpicd.run.loop`). The assignment is
deterministic and depends only on the clients' training-set sizes and R:

* R = N: client i on rank i (one each, as with ``one``);
* R < N: longest processing time first (Graham 1969): clients in decreasing order of their
  training-set size (ties: the lower client index first), each to the rank whose clients hold the
  fewest training images so far (ties: the rank with fewer clients, then the lower rank). The
  largest load is then at most 4/3 of the optimum (Graham's bound), and every rank gets a client.

A rank's clients are listed in increasing client index; what a client computes does not depend on
the rank it is on or on the other clients there (:mod:`mpicd.core.seeds` keys every stream by client).
"""

from __future__ import annotations

import numpy as np

from mpicd.core.schema import ConfigError

MODES = ("one", "balanced")


def assign(train_sizes, ranks: int) -> np.ndarray:
    """(clients,) int64: the rank of each client; see the module docstring."""
    sizes = [int(s) for s in np.asarray(train_sizes).reshape(-1)]
    clients = len(sizes)
    if not 1 <= ranks <= clients:
        raise ValueError(f"assignment: {ranks} ranks for {clients} clients (need 1 <= ranks <= clients)")
    if ranks == clients:
        return np.arange(clients, dtype=np.int64)
    load, count = [0] * ranks, [0] * ranks
    owner = np.empty(clients, dtype=np.int64)
    for client in sorted(range(clients), key=lambda i: (-sizes[i], i)):
        rank = min(range(ranks), key=lambda r: (load[r], count[r], r))
        owner[client] = rank
        load[rank] += sizes[client]
        count[rank] += 1
    return owner


def clients_of(owner: np.ndarray, rank: int) -> list[int]:
    """The clients ``rank`` holds, in increasing client index."""
    return [int(i) for i in np.flatnonzero(np.asarray(owner) == rank)]


def check_ranks(clients: int, ranks: int, mode: str, hint: str) -> None:
    """ConfigError unless ``ranks`` MPI ranks can hold ``clients`` clients under ``mode``; ``hint``:
    how to start ``clients`` ranks with the launcher in use."""
    if mode == "one" and clients != ranks:
        raise ConfigError(
            "clients",
            f"the config has {clients} clients but the job has {ranks} MPI ranks: {hint}, or set "
            f"clients={ranks}"
            + (", or clients_per_rank=balanced to train several clients on each rank" if ranks < clients else ""),
        )
    if mode == "balanced" and ranks > clients:
        raise ConfigError(
            "clients",
            f"the config has {clients} clients but the job has {ranks} MPI ranks: at most one rank per "
            f"client ({hint}), or set clients={ranks}",
        )


class Assignment:
    """The run's assignment, the same on every rank: ``owner[i]`` is client i's rank."""

    def __init__(self, owner: np.ndarray, rank: int):
        self.owner = np.asarray(owner, dtype=np.int64)
        self.clients = len(self.owner)
        self.ranks = int(self.owner.max()) + 1 if self.clients else 0
        self.rank = rank
        self.mine = clients_of(self.owner, rank)

    @classmethod
    def of(cls, train_sizes, ranks: int, rank: int) -> "Assignment":
        return cls(assign(train_sizes, ranks), rank)

    @classmethod
    def one_per_rank(cls, clients: int, rank: int) -> "Assignment":
        return cls(np.arange(clients, dtype=np.int64), rank)

    def held_by(self, rank: int) -> list[int]:
        return clients_of(self.owner, rank)

    def counts(self) -> np.ndarray:
        """(ranks,) the number of clients each rank holds."""
        return np.bincount(self.owner, minlength=self.ranks)
