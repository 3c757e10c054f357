"""Every random stream of a run, named by (seed, purpose, key) so that no two can coincide.

A stream is one purpose (a constant below) and a key of at most three integers in [0, 2**32)
(client, round, epoch, class...). A client's streams are keyed by the client, never by the MPI
rank that holds it, so the same clients give the same numbers on any layout (:mod:`mpicd.mpi.assignment`;
with one client per rank the client is the rank, the keys of older versions). Adding a draw in
one place never shifts another stream, and the same config and seed give the same numbers on
every machine.

Why distinct (purpose, key) pairs give distinct numpy streams for one seed, by construction:

1. Encoding. numpy's SeedSequence receives four 32-bit words
   ``[purpose + 2**16 * len(key), key[0], key[1], key[2]]`` (absent key words 0), then the seed
   as numpy splits an int (32-bit words, lowest first). Fixed width plus the length makes the
   four words injective in (purpose, key). (The old ``[seed, purpose, *key]`` was not:
   SeedSequence pads entropy shorter than its 4-word pool with zeros, so a trailing 0 vanished
   and ``rng(s, TEACHERS, r)`` was ``rng(s, TEACHERS, r, 0)``, rank 0's per-batch stream.)
2. SeedSequence is a bijection of its first four words once the rest is fixed: each word is
   hashed alone (xor a constant, times an odd constant mod 2**32, ``x ^= x >> 16``: all
   invertible), pool words are mixed pairwise by ``x <- odd * x - h(other)`` then the
   xor-shift (invertible in ``x``), the seed words are mixed in the same way, and each of the
   first four output words of ``generate_state`` is an invertible hash of one pool word.
3. PCG64 (``default_rng``) takes those four words as its 128-bit initial state, which its
   seeding maps bijectively to the generator's state for a given increment.

So distinct (purpose, key) -> distinct words -> distinct pool -> distinct generator state.
tests/core/test_seeds.py inverts step 2 against the installed numpy and checks every stream of a run.
Torch's CPU generator (mt19937) keeps only the low 32 bits of a seed, so no encoding can make
:func:`torch_seed` values distinct by construction; the tests check a run's torch seeds differ.
"""

from __future__ import annotations

import operator

import numpy as np

# Purposes of the random streams (the key each call site uses in brackets).
INIT = 1  # the common initial model (), torch
SHUFFLE = 2  # a client's minibatch order (client, round, epoch), torch
K_SUBSET = 3  # co-distillation: a teacher's k images of a class (client, round, class)
TEACHERS = 4  # co-distillation: the round's shared teacher assignment (round,)
PARTITION = 5  # who holds which training image ()
BATCH_TEACHERS = 6  # co-distillation, teacher_per batch: a client's per-minibatch teachers (round, client)
HOLDOUT = 7  # a stratified held-out test split (), seeded by split_seed
VAL = 8  # a stratified validation split (), seeded by split_seed
PRIVACY = 9  # differential privacy: a release's Poisson sample and noise, DP-SGD, the audit (client, round, use)
PARTICIPATION = 10  # participation < 1: the round's sample of participating clients (round,)
CALIBRATION = 11  # CCVR: the virtual features and their minibatch order, the same on every client (round,)
PURPOSES = frozenset(
    {INIT, SHUFFLE, K_SUBSET, TEACHERS, PARTITION, BATCH_TEACHERS, HOLDOUT, VAL, PRIVACY, PARTICIPATION, CALIBRATION}
)

KEY_WORDS = 3
_WORD = 2**32


def entropy(seed: int, purpose: int, *key: int) -> list[int]:
    """The words SeedSequence receives: injective in (seed, purpose, key), see the module docstring."""
    seed, purpose, key = operator.index(seed), operator.index(purpose), [operator.index(k) for k in key]
    if purpose not in PURPOSES:
        raise ValueError(f"unknown random-stream purpose {purpose!r}")
    if seed < 0:
        raise ValueError(f"a seed must be non-negative, got {seed}")
    if len(key) > KEY_WORDS or any(not 0 <= k < _WORD for k in key):
        raise ValueError(f"a stream key is at most {KEY_WORDS} integers in [0, 2**32), got {tuple(key)}")
    return [purpose + (len(key) << 16), *key, *[0] * (KEY_WORDS - len(key)), seed]


def seed_sequence(seed: int, purpose: int, *key: int) -> np.random.SeedSequence:
    return np.random.SeedSequence(entropy(seed, purpose, *key))


def rng(seed: int, purpose: int, *key: int) -> np.random.Generator:
    return np.random.default_rng(seed_sequence(seed, purpose, *key))


def torch_seed(seed: int, purpose: int, *key: int) -> int:
    """A 63-bit torch seed from the same words as :func:`rng` (a hash: see the module docstring)."""
    return int(seed_sequence(seed, purpose, *key).generate_state(1, dtype=np.uint64)[0] >> np.uint64(1))
