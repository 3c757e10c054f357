"""One error, agreed across ranks: every rank stops at the same point, and one line says why.

Kept free of torch and the data (the launcher's checks run before either is imported).
"""

from __future__ import annotations

import sys

from mpicd.core.schema import ConfigError


def raise_agreed(comm, error: ConfigError | None) -> None:
    """Collective: when any rank holds an ``error``, the lowest such rank prints it (the rank that knows
    why: one line) and every rank raises a ConfigError marked ``told`` (the caller prints nothing more)."""
    failing = comm.first_failing_rank(error is not None)
    if failing is None:
        return
    if comm.rank == failing:
        sys.stderr.write(f"mpicd: {error}\n")
        sys.stderr.flush()
    raised = error or ConfigError("", f"rank {failing} rejected the input (see its message)")
    raised.told = True
    raise raised
