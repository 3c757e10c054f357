"""A run's identity: a random id drawn when the run first starts, and the hash of what it computes.

Both are written into the results file (attrs ``run_id`` and ``config_hash``) and into every
checkpoint, so that a resume can tell this run's checkpoints from those of another run that
happen to lie in the same folder (a deleted results file, a sweep file changed since), and so
that ``mpicd verify`` can tell whether a file's config is the one its hash was made from.
"""

from __future__ import annotations

import hashlib
import json
import secrets

from mpicd.config.sections import computed_config

RUN_ID_CHARS = 16  # 64 random bits as hex: collisions between runs of one folder are not a concern


def new_run_id() -> str:
    return secrets.token_hex(RUN_ID_CHARS // 2)


def config_hash(resolved: dict) -> str:
    """sha256 of the resolved config minus its operational keys (``config.OPERATIONAL_KEYS``),
    as canonical JSON (sorted keys): equal for two runs that compute the same thing."""
    canonical = json.dumps(computed_config(resolved), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def is_run_id(text: object) -> bool:
    return isinstance(text, str) and len(text) == RUN_ID_CHARS and all(c in "0123456789abcdef" for c in text)
