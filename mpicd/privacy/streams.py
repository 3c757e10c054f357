"""The random streams of the private path, one per (client, round, use).

``use`` (the last key word) says what the stream is for, so no two coincide: a release's Poisson
sample then its noise (keyed by the client, not the MPI rank that holds it, as every client
stream in mpicd/core/seeds.py), DP-SGD's batch sampling and its noise, the audit's neighbouring
releases (a = trial, b = 0 without the canary, 1 with it) and the membership attack's draws.

What a release rests on is drawn from the client's secret key and the run's nonce (``privacy.noise:
secret``, the default: :class:`mpicd.privacy.secret.SecretStream`), which no peer can redraw and no
other run at the site repeats; ``privacy.noise:
seeded`` draws it from ``seeds.rng(seed, seeds.PRIVACY, client, round, use)`` instead, which every
peer can redraw from the config: repeatable, and not private. The audit's and the attack's draws
are the auditor's own experiment, not a release to anyone, and stay seeded.
"""

from __future__ import annotations

from mpicd.core import seeds
from mpicd.privacy.secret import SecretStream

RELEASE = 0  # one release: its Poisson sample, then its noise, in that order
DPSGD_SAMPLING = 1
DPSGD_NOISE = 2
AUDIT = 3
ATTACK = 4

NOISE = ("secret", "seeded")  # privacy.noise


def stream(noise: str, key: bytes | None, nonce: bytes | None, seed: int, client: int, round_index: int, use: int):
    """The generator of one use: ``random(n)`` uniforms and ``normal(0, std, size)``, from the
    client's ``key`` and the run's ``nonce`` (noise "secret") or from the public ``seed`` (noise "seeded")."""
    if noise == "secret":
        if key is None or nonce is None:
            raise ValueError("privacy: secret noise needs the client's key and the run's nonce")
        return SecretStream(key, nonce, client, round_index, use)
    if noise == "seeded":
        return seeds.rng(seed, seeds.PRIVACY, client, round_index, use)
    raise ValueError(f"privacy.noise must be one of {NOISE}, got {noise!r}")
