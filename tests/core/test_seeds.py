"""Random streams: distinct (purpose, key) pairs never share a stream, checked three ways.

1. The aliases of the old encoding (a trailing 0, a key word >= 2**32) are gone.
2. The proof in mpicd/core/seeds.py holds for the installed numpy: SeedSequence is inverted by hand
   (its published constants and steps, written out here), so the four key words are recovered
   from the generator's state, and PCG64's state is the seeding formula applied to them.
3. Every stream of a run is distinct: all streams of N clients x R rounds x E epochs x C classes
   enumerated by hand, and every stream a real ``mpicd run`` under mpiexec draws (recorded).
"""

import json
import re

import numpy as np
import pytest
import torch

from mpicd.core import seeds

from conftest import DRIVERS, QUICKSTART, ROOT, mpiexec

M32 = 2**32


def state(generator: np.random.Generator) -> tuple[int, int]:
    s = generator.bit_generator.state["state"]
    return s["state"], s["inc"]


# --- 1. the old aliases ---------------------------------------------------------------------------


def test_a_trailing_zero_key_is_a_different_stream():
    # Old code: SeedSequence([seed, TEACHERS, r]) == SeedSequence([seed, TEACHERS, r, 0]), so rank 0's
    # per-batch teacher stream replayed the round's shared teacher assignment.
    for seed in (0, 1, 12345):
        for r in range(5):
            assert state(seeds.rng(seed, seeds.TEACHERS, r)) != state(seeds.rng(seed, seeds.TEACHERS, r, 0))
        assert state(seeds.rng(seed, seeds.PARTITION)) != state(seeds.rng(seed, seeds.PARTITION, 0))
        assert state(seeds.rng(seed, seeds.K_SUBSET, 1)) != state(seeds.rng(seed, seeds.K_SUBSET, 1, 0, 0))
        assert seeds.torch_seed(seed, seeds.INIT) != seeds.torch_seed(seed, seeds.INIT, 0)


def test_the_same_name_is_the_same_stream_and_numpy_ints_are_accepted():
    a = seeds.rng(3, seeds.SHUFFLE, 1, 2, 0).integers(0, 1 << 62, size=8)
    b = seeds.rng(np.int64(3), seeds.SHUFFLE, np.int32(1), 2, np.uint8(0)).integers(0, 1 << 62, size=8)
    assert np.array_equal(a, b)
    assert seeds.torch_seed(3, seeds.INIT) == seeds.torch_seed(3, seeds.INIT) < 2**63


@pytest.mark.parametrize(
    "args",
    [
        (0, seeds.TEACHERS, M32),  # old code: [0, 4, 2**32] == [0, 4, 0, 1]: an alias
        (0, seeds.TEACHERS, -1),
        (0, seeds.SHUFFLE, 1, 2, 3, 4),  # more than three key words
        (-1, seeds.INIT),
        (0, 99),  # unknown purpose
        (0, seeds.TEACHERS, 1.0),  # not an integer
    ],
)
def test_keys_outside_the_encoding_are_rejected(args):
    with pytest.raises((ValueError, TypeError)):
        seeds.rng(*args)


def test_large_seeds_still_give_distinct_streams():
    big = [0, 1, M32 - 1, M32, M32 + 1, 2**64 + 5]
    states = {state(seeds.rng(s, seeds.TEACHERS, 0)) for s in big}
    assert len(states) == len(big)


# --- 2. the proof, against the installed numpy ---------------------------------------------------

# numpy/random/bit_generator.pyx (SeedSequence, after O'Neill's seed_seq_fe): constants and steps.
INIT_A, MULT_A, INIT_B, MULT_B = 0x43B0D7E5, 0x931E8875, 0x8B51F9DD, 0x58F38DED
MIX_MULT_L, MIX_MULT_R = 0xCA01F9DD, 0x4973F715
PCG_MULT = (2549297995355413924 << 64) + 4865540595714422341  # PCG_DEFAULT_MULTIPLIER_128


def hash_constants(start: int, mult: int, n: int) -> list[tuple[int, int]]:
    """(xor constant, multiplier) of the n successive hash calls: xor the old constant, multiply by the new."""
    out, h = [], start
    for _ in range(n):
        nxt = h * mult % M32
        out.append((h, nxt))
        h = nxt
    return out


def hashmix(v: int, k: tuple[int, int]) -> int:
    v = (v ^ k[0]) * k[1] % M32
    return v ^ (v >> 16)


def unhash(v: int, k: tuple[int, int]) -> int:
    v ^= v >> 16  # x ^ (x >> 16) is its own inverse on 32 bits
    return (v * pow(k[1], -1, M32) % M32) ^ k[0]


def unmix(r: int, y: int) -> int:
    """The x with mix(x, y) = r, where mix(x, y) = (L x - R y) ^ ((L x - R y) >> 16)."""
    r ^= r >> 16
    return (r + MIX_MULT_R * y) * pow(MIX_MULT_L, -1, M32) % M32


def invert_seed_sequence(out: list[int], tail: list[int]) -> list[int]:
    """The four leading entropy words of a SeedSequence whose generate_state(4) is ``out``."""
    pairs = [(s, d) for s in range(4) for d in range(4) if s != d]
    ka = hash_constants(INIT_A, MULT_A, 4 + len(pairs) + 4 * len(tail))
    kb = hash_constants(INIT_B, MULT_B, 4)
    pool = [unhash(out[i], kb[i]) for i in range(4)]
    calls = iter(reversed(ka[4 + len(pairs) :]))
    for word in reversed(tail):
        for d in reversed(range(4)):
            pool[d] = unmix(pool[d], hashmix(word, next(calls)))
    for (s, d), k in reversed(list(zip(pairs, ka[4 : 4 + len(pairs)]))):
        pool[d] = unmix(pool[d], hashmix(pool[s], k))
    return [unhash(pool[i], ka[i]) for i in range(4)]


@pytest.mark.parametrize("seed", [0, 1, 7, M32 - 1, 2**40 + 3])
def test_seed_sequence_is_a_bijection_of_the_four_key_words(seed):
    tail = [seed >> (32 * i) & (M32 - 1) for i in range(max(1, (seed.bit_length() + 31) // 32))]  # numpy's split
    draws = np.random.default_rng(1).integers(0, M32, size=(200, 4)).tolist()
    keys = [seeds.entropy(seed, seeds.SHUFFLE, 3, 17, 0)[:4], seeds.entropy(seed, seeds.PARTITION)[:4], *draws]
    for words in keys:
        ss = np.random.SeedSequence([*words, seed])
        assert invert_seed_sequence(ss.generate_state(4).tolist(), tail) == words
        # PCG64 seeding: state = ((inc + initstate) * MULT + inc) mod 2**128, inc = 2 initseq + 1
        v = [int(x) for x in ss.generate_state(4, np.uint64)]
        initstate, inc = (v[0] << 64) | v[1], (((v[2] << 64) | v[3]) << 1 | 1) % 2**128
        pcg = np.random.default_rng(ss).bit_generator.state["state"]
        assert (pcg["state"], pcg["inc"]) == (((inc + initstate) * PCG_MULT + inc) % 2**128, inc)
    # and seeds hands SeedSequence exactly those words followed by the seed
    assert np.array_equal(
        seeds.seed_sequence(seed, seeds.SHUFFLE, 3, 17, 0).generate_state(8),
        np.random.SeedSequence([*keys[0], seed]).generate_state(8),
    )


def test_entropy_words_are_the_documented_layout():
    assert seeds.entropy(5, seeds.TEACHERS, 9) == [seeds.TEACHERS + (1 << 16), 9, 0, 0, 5]
    assert seeds.entropy(5, seeds.SHUFFLE, 1, 2, 3) == [seeds.SHUFFLE + (3 << 16), 1, 2, 3, 5]
    assert seeds.entropy(5, seeds.INIT) == [seeds.INIT, 0, 0, 0, 5]


# --- 3. every stream of a run -------------------------------------------------------------------

# Every stream a run draws, as (kind, purpose, key names): kept in step with the call sites by
# test_every_call_site_is_enumerated and test_a_real_run_draws_only_enumerated_distinct_streams.
STREAMS = {
    ("rng", seeds.PARTITION, ()),
    ("rng", seeds.HOLDOUT, ()),
    ("rng", seeds.VAL, ()),
    ("torch", seeds.INIT, ()),
    ("rng", seeds.SHUFFLE, ("rank", "round", "epoch")),
    ("rng", seeds.TEACHERS, ("round",)),
    ("rng", seeds.BATCH_TEACHERS, ("round", "rank")),
    ("rng", seeds.K_SUBSET, ("rank", "round", "class")),
    # mpicd/privacy/streams.py with privacy.noise: seeded (releases, DP-SGD; audit: trial, neighbour, use)
    ("rng", seeds.PRIVACY, ("rank", "round", "use")),
    ("rng", seeds.PARTICIPATION, ("round",)),
    ("rng", seeds.CALIBRATION, ("round",)),  # CCVR's virtual features, the same on every client
}


PRIVACY_USES = 5  # mpicd.privacy.streams: RELEASE, DPSGD_SAMPLING, DPSGD_NOISE, AUDIT, ATTACK


def enumerate_streams(clients: int, rounds: int, epochs: int, classes: int):
    ranges = {"rank": range(clients), "round": range(rounds), "epoch": range(epochs), "class": range(classes)}
    ranges["use"] = range(PRIVACY_USES)
    for kind, purpose, names in sorted(STREAMS):
        for key in np.ndindex(*(len(ranges[n]) for n in names)):
            yield kind, purpose, tuple(int(k) for k in key)


@pytest.mark.parametrize("seed, split_seed", [(0, 0), (3, 0), (2**40, 7)])
def test_every_stream_of_a_run_is_distinct(seed, split_seed):
    numpy_states, torch_seeds = [], []
    for kind, purpose, key in enumerate_streams(clients=16, rounds=40, epochs=3, classes=8):
        s = split_seed if purpose in (seeds.HOLDOUT, seeds.VAL) else seed
        if kind == "rng":
            numpy_states.append(state(seeds.rng(s, purpose, *key)))
        else:
            torch_seeds.append(seeds.torch_seed(s, purpose, *key))
    assert len(numpy_states) == 1 + 1 + 1 + 16 * 40 * 3 + 40 + 40 * 16 + 16 * 40 * 8 + 16 * 40 * PRIVACY_USES + 40 + 40
    assert len(set(numpy_states)) == len(numpy_states)
    assert len(torch_seeds) == 1
    # torch's CPU generator keeps the low 32 bits of a seed: those must differ too
    assert len({t % M32 for t in torch_seeds}) == len(torch_seeds)


def test_torch_cpu_generator_keeps_only_32_bits_of_a_seed():
    """Why the torch seeds above are compared modulo 2**32 (if torch changes, this tells)."""
    a = torch.randperm(50, generator=torch.Generator().manual_seed(12345))
    b = torch.randperm(50, generator=torch.Generator().manual_seed(12345 + M32))
    assert torch.equal(a, b)


CALL = re.compile(r"seeds\.(rng|torch_seed|seed_sequence)\(\s*[^,()]+,\s*seeds\.([A-Z_]+)")


def test_every_call_site_is_enumerated():
    """A new stream in mpicd/ (a new purpose at a call site) must be added to STREAMS above."""
    found = {(fn, name) for path in (ROOT / "mpicd").rglob("*.py") for fn, name in CALL.findall(path.read_text())}
    assert {name for _, name in found} >= {"PARTITION", "INIT", "SHUFFLE", "TEACHERS", "BATCH_TEACHERS", "K_SUBSET"}
    kinds = {(kind, purpose) for kind, purpose, _ in STREAMS}
    for fn, name in found:
        kind = "torch" if fn == "torch_seed" else "rng"
        assert (kind, getattr(seeds, name)) in kinds, f"seeds.{fn}(..., seeds.{name}) is not in STREAMS"


def test_a_real_run_draws_only_enumerated_distinct_streams(tmp_path):
    """mpicd run under mpiexec, recording every stream each rank creates (tests/drivers/seed_streams.py)."""
    result = mpiexec(4, str(DRIVERS / "seed_streams.py"), str(QUICKSTART), str(tmp_path), timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    calls = [c for r in range(4) for c in json.loads((tmp_path / f"rank{r}.json").read_text())]
    shapes = {(kind, purpose, len(names)) for kind, purpose, names in STREAMS}
    seen, by_name = set(), {}
    for call in calls:
        if call["kind"] == "foreign":  # a SeedSequence made outside mpicd.core.seeds
            by_name.setdefault(("foreign", tuple(call["entropy"])), set()).add(tuple(call["state"]))
            continue
        kind, purpose, key = call["kind"], call["purpose"], tuple(call["key"])
        assert (kind, purpose, len(key)) in shapes, f"stream not enumerated in STREAMS: {call}"
        seen.add((kind, purpose))
        value = tuple(call["state"]) if kind == "rng" else (call["state"] % M32,)
        by_name.setdefault((kind, call["seed"], purpose, key), set()).add(value)
    # every stream of the run was drawn: init, shuffles, partition, teachers, per-batch teachers, k-subsets
    assert seen >= {
        ("rng", seeds.PARTITION),
        ("torch", seeds.INIT),
        ("rng", seeds.SHUFFLE),
        ("rng", seeds.TEACHERS),
        ("rng", seeds.BATCH_TEACHERS),
        ("rng", seeds.K_SUBSET),
    }
    assert sum(1 for name in by_name if name[0] == "rng" and name[2] == seeds.SHUFFLE) == 4 * 3 * 2
    # one name -> one state on every rank, and distinct names -> distinct states
    assert all(len(values) == 1 for values in by_name.values())
    numpy_states = [next(iter(v)) for name, v in by_name.items() if name[0] in ("rng", "foreign")]
    torch_states = [next(iter(v)) for name, v in by_name.items() if name[0] == "torch"]
    assert len(set(numpy_states)) == len(numpy_states)
    assert len(set(torch_states)) == len(torch_states)
