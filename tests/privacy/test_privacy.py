"""mpicd.privacy: clipping, sampling, the Gaussian mechanism, the releases, the accountant, the audit.

Expected values come from hand-made vectors, closed-form formulas (the analytic Gaussian
mechanism of Balle & Wang 2018, the Clopper-Pearson end points), a published number (Abadi et
al. 2016, section 3.1) and independent implementations (a naive RDP sum, Opacus' PRV accountant,
the algorithms' own PerClassMeans payload).
"""

from __future__ import annotations

import math
import stat

import numpy as np
import pytest
import torch
from scipy.optimize import brentq
from scipy.special import gammaln, logsumexp
from scipy.stats import norm

from conftest import require_pneumonia
from mpicd.algorithms.aggregate import PerClassMeans
from mpicd.privacy import accountant, audit, secret, streams
from mpicd.privacy.clip import clip_rows
from mpicd.privacy.gaussian import gaussian_sum, noise_std, release_multiplier
from mpicd.privacy.release import (
    class_sums_payload,
    means_from_sums,
    private_class_sums,
    private_mean,
    sampled_private_mean,
)
from mpicd.privacy.sampling import poisson_subset

DELTA = 1e-5


# --- clipping -------------------------------------------------------------------------------


def test_clip_hand_made_vectors():
    rows = np.array([[3.0, 4.0], [0.3, 0.4], [0.0, 0.0], [-6.0, 8.0], [0.6, 0.8]])
    clipped = clip_rows(rows, 1.0)
    np.testing.assert_allclose(
        clipped, [[0.6, 0.8], [0.3, 0.4], [0.0, 0.0], [-0.6, 0.8], [0.6, 0.8]], rtol=0, atol=1e-15
    )
    assert np.array_equal(clipped[1:3], rows[1:3])  # within the bound: untouched, bit for bit
    assert np.array_equal(clipped[4], rows[4])  # norm exactly 1 (in float64 0.6^2 + 0.8^2 <= 1)
    assert (np.sqrt((clipped**2).sum(axis=1)) <= 1.0).all()
    np.testing.assert_array_equal(clip_rows([[0.0, -5.0]], 2.5), [[0.0, -2.5]])


def test_clip_never_exceeds_bound_and_keeps_direction():
    rows = np.random.default_rng(0).normal(size=(2000, 37)) * np.logspace(-3, 6, 2000)[:, None]
    for bound in (1e-3, 0.7, 1.0, 3.3):
        clipped = clip_rows(rows, bound)
        norms = np.sqrt(np.einsum("ij,ij->i", clipped, clipped))
        assert (norms <= bound).all()
        big = np.sqrt((rows**2).sum(axis=1)) > bound
        np.testing.assert_allclose(norms[big], bound, rtol=1e-13)
        cosine = (clipped * rows).sum(axis=1) / (norms * np.sqrt((rows**2).sum(axis=1)))
        np.testing.assert_allclose(cosine, 1.0, rtol=1e-12)


@pytest.mark.parametrize("bad", [[[np.nan, 1.0]], [[np.inf, 0.0]]])
def test_clip_rejects_non_finite(bad):
    with pytest.raises(ValueError, match="non-finite"):
        clip_rows(bad, 1.0)


@pytest.mark.parametrize("bound", [0.0, -1.0, math.inf, math.nan])
def test_clip_rejects_bad_bound(bound):
    with pytest.raises(ValueError, match="clipping bound"):
        clip_rows([[1.0, 2.0]], bound)


# --- sampling -------------------------------------------------------------------------------


def test_poisson_subset_rate_and_stream_position():
    n, q = 200_000, 0.3
    taken = poisson_subset(n, q, np.random.default_rng(5))
    assert abs(len(taken) - q * n) < 5 * math.sqrt(n * q * (1 - q))
    assert np.array_equal(taken, np.unique(taken)) and taken.dtype == np.int64
    # independent inclusion: the two halves' rates agree with q, the pair (i, i+1) with q^2
    first = np.isin(np.arange(n), taken)
    assert abs(first[:-1:2].mean() - q) < 0.01 and abs((first[:-1:2] & first[1::2]).mean() - q * q) < 0.01
    # exactly n uniforms drawn whatever q: what follows does not depend on the sample
    for rate in (0.01, 1.0):
        g, ref = np.random.default_rng(9), np.random.default_rng(9)
        poisson_subset(1000, rate, g)
        ref.random(1000)
        assert g.random() == ref.random()
    assert np.array_equal(poisson_subset(50, 1.0, np.random.default_rng(0)), np.arange(50))


@pytest.mark.parametrize("q", [0.0, -0.1, 1.5, math.nan])
def test_poisson_subset_rejects_bad_rate(q):
    with pytest.raises(ValueError, match="sampling rate"):
        poisson_subset(10, q, np.random.default_rng(0))


# --- Gaussian mechanism and releases ----------------------------------------------------------


def test_gaussian_sum_noise_scale_matches_formula():
    rows = np.array(
        [[3.0, 4.0] + [0.0] * 39998, [1.0] + [0.0] * 39999]
    )  # clipped to C = 2: [1.2, 1.6, ...], [1, 0, ...]
    clip, sigma = 2.0, 1.5
    release = gaussian_sum(rows, clip=clip, sigma=sigma, generator=np.random.default_rng(1))
    exact = np.zeros(40000)
    exact[:2] = [1.2 + 1.0, 1.6]
    noise = release - exact
    assert noise_std(clip, sigma) == 3.0
    # the sample std of 40000 normals is within 1% of the truth with overwhelming probability (sd 0.35%)
    assert abs(noise.std() / (sigma * clip) - 1) < 0.015 and abs(noise.mean()) < 5 * 3.0 / 200
    off = gaussian_sum(rows, clip=clip, sigma=0.0, generator=np.random.default_rng(1))
    np.testing.assert_allclose(off, exact, atol=1e-15)


def test_private_class_sums_noise_scales_and_exact_part():
    rows = np.array([[3.0, 4.0], [0.1, 0.0], [0.0, -2.0]])
    labels = np.array([1, 1, 0])
    sums, counts = private_class_sums(rows, labels, 3, clip=1.0, sigma=0.0, generator=np.random.default_rng(0))
    np.testing.assert_allclose(sums, [[0.0, -1.0], [0.7, 0.8], [0.0, 0.0]], atol=1e-15)
    np.testing.assert_array_equal(counts, [1.0, 2.0, 0.0])
    wide = np.zeros((1, 20000))
    sums, counts = private_class_sums(wide, [0], 500, clip=0.5, sigma=2.0, generator=np.random.default_rng(3))
    assert abs(sums.std() / (2.0 * 0.5) - 1) < 0.01  # sums: sigma C
    counts[0] -= 1.0
    assert abs(counts.std() / 2.0 - 1) < 0.1  # counts: sigma (sensitivity 1), 500 draws
    exact = private_class_sums(
        wide, [0], 500, clip=0.5, sigma=2.0, generator=np.random.default_rng(3), noise_counts=False
    )
    assert exact[1][0] == 1.0 and exact[1][1:].sum() == 0.0
    assert release_multiplier(2.0, True) == pytest.approx(2.0 / math.sqrt(2)) and release_multiplier(2.0, False) == 2.0


def test_class_sums_payload_matches_the_algorithms_layout():
    """With the noise off and rows within the bound, the private payload is FedProto's weighted payload."""
    rng = np.random.default_rng(4)
    rows = rng.normal(size=(40, 6)) * 0.1  # norms < 1: nothing clipped
    labels = rng.integers(0, 3, size=40)
    reference = PerClassMeans(3, 6, torch.device("cpu"))
    reference.add(torch.from_numpy(rows), torch.from_numpy(labels))
    sums, counts = private_class_sums(rows, labels, 3, clip=1.0, sigma=0.0, generator=rng, noise_counts=False)
    np.testing.assert_allclose(class_sums_payload(sums, counts), reference.payload(weighted=True), rtol=1e-6)
    means, keep = means_from_sums(sums, np.array([counts[0], 0.4, counts[2]]), min_count=1.0)
    assert keep.tolist() == [True, False, True] and not means[1].any()
    np.testing.assert_allclose(means[0], rows[labels == 0].mean(axis=0), rtol=1e-12)


def test_private_mean_hand_made_and_public_denominator():
    rows = np.array([[3.0, 4.0], [0.0, 0.5]])
    got = private_mean(rows, clip=1.0, sigma=0.0, denominator=4.0, generator=np.random.default_rng(0))
    np.testing.assert_allclose(got, [0.6 / 4, 1.3 / 4], atol=1e-15)
    with pytest.raises(ValueError, match="denominator"):
        private_mean(rows, clip=1.0, sigma=1.0, denominator=0.0, generator=np.random.default_rng(0))
    # sampled at q = 1 with the noise off: the clipped mean, whatever the seed
    r = sampled_private_mean(rows, q=1.0, clip=1.0, sigma=0.0, denominator=2.0, generator=np.random.default_rng(7))
    np.testing.assert_allclose(r, [0.3, 0.65], atol=1e-15)


def test_release_deterministic_per_stream_and_different_across_streams():
    rows = np.random.default_rng(0).normal(size=(100, 8))
    key = secret.new_key()

    def release(noise, seed, client, rnd, key=key, nonce=bytes(8)):
        g = streams.stream(noise, key, nonce, seed, client, rnd, streams.RELEASE)
        return sampled_private_mean(rows, q=0.3, clip=1.0, sigma=1.0, denominator=30.0, generator=g)

    for noise in streams.NOISE:
        first = release(noise, 1, 2, 3)
        assert np.array_equal(first, release(noise, 1, 2, 3))
        for other in [(1, 3, 3), (1, 2, 4)]:
            assert not np.array_equal(first, release(noise, *other))
    assert not np.array_equal(release("seeded", 1, 2, 3), release("seeded", 2, 2, 3))
    # secret: the seed plays no part, the key does
    assert np.array_equal(release("secret", 1, 2, 3), release("secret", 2, 2, 3))
    assert not np.array_equal(release("secret", 1, 2, 3), release("secret", 1, 2, 3, key=secret.new_key()))
    # secret: another run's nonce, another stream with the same key (a key folder shared by runs);
    # seeded: the nonce plays no part (it is not private anyway)
    assert not np.array_equal(release("secret", 1, 2, 3), release("secret", 1, 2, 3, nonce=bytes(7) + b"\x01"))
    assert np.array_equal(release("seeded", 1, 2, 3), release("seeded", 1, 2, 3, nonce=bytes(7) + b"\x01"))


def test_secret_stream_is_shake256_of_tag_key_nonce_words_and_call():
    """The documented construction, redrawn with hashlib: 64-bit big-endian words of
    SHAKE-256(tag | key | nonce | words | call), top 53 bits times 2**-53."""
    import hashlib
    import struct

    key, nonce = bytes(range(32)), bytes.fromhex("00112233445566ff")
    stream = secret.SecretStream(key, nonce, 4, 7, 2)
    got = [stream.random(3), stream.random(2)]
    for call, u in enumerate(got):
        block = hashlib.shake_256(
            b"mpicd privacy stream v2\x00" + key + nonce + struct.pack(">3q", 4, 7, 2) + struct.pack(">q", call)
        ).digest(8 * len(u))
        words = [int.from_bytes(block[8 * i : 8 * i + 8], "big") for i in range(len(u))]
        assert u.tolist() == [(w >> 11) / 2**53 for w in words]
    with pytest.raises(ValueError, match="32 bytes"):
        secret.SecretStream(b"short", nonce, 0)
    with pytest.raises(ValueError, match="nonce is 8 bytes"):
        secret.SecretStream(key, b"short", 0)
    assert secret.nonce_bytes("00112233445566ff") == nonce
    with pytest.raises(ValueError, match="16 hex digits"):
        secret.nonce_bytes("0011")


def test_secret_stream_draws_have_their_distributions():
    """Uniforms on [0, 1) and N(loc, scale^2) normals (Kolmogorov-Smirnov at 1e-3, 200,000 draws)."""
    from scipy import stats

    stream = secret.SecretStream(secret.new_key(), bytes(8), 0, 0, 0)
    u = stream.random(200_000)
    assert u.min() >= 0 and u.max() < 1 and stats.kstest(u, "uniform").pvalue > 1e-3
    z = stream.normal(1.5, 2.0, size=(400, 500))
    assert z.shape == (400, 500) and stats.kstest(z.ravel(), "norm", args=(1.5, 2.0)).pvalue > 1e-3
    assert isinstance(stream.normal(0.0, 1.0), float) and isinstance(stream.random(), float)
    assert stream.normal(0.0, 0.0, size=3).tolist() == [0.0, 0.0, 0.0]


# --- accountant -------------------------------------------------------------------------------


def analytic_gaussian_epsilon(mu: float, delta: float) -> float:
    """Exact epsilon of the Gaussian mechanism with sensitivity/std ratio mu (Balle & Wang 2018,
    Theorem 8: delta(eps) = Phi(mu/2 - eps/mu) - e^eps Phi(-mu/2 - eps/mu))."""

    def gap(eps):
        return norm.cdf(mu / 2 - eps / mu) - math.exp(eps) * norm.cdf(-mu / 2 - eps / mu) - delta

    return brentq(gap, 0.0, 200.0)


@pytest.mark.parametrize(("sigma", "releases"), [(0.8, 1), (2.0, 10), (1.0, 1)])
def test_accountant_matches_analytic_gaussian(sigma, releases):
    """q = 1: T releases at sigma are one Gaussian with mu = sqrt(T) / sigma; PLD is an upper bound within 1%."""
    exact = analytic_gaussian_epsilon(math.sqrt(releases) / sigma, DELTA)
    got = accountant.epsilon(1.0, sigma, releases, DELTA)
    assert exact - 1e-9 <= got <= exact * 1.01 + 1e-3


def test_accountant_heterogeneous_ledger_matches_analytic():
    """Two Gaussians at sigma 1 and 2 compose to mu^2 = 1 + 1/4 (Dong, Roth, Su 2019, GDP composition)."""
    ledger = accountant.Accountant()
    ledger.spend(1.0, 1.0)
    ledger.spend(1.0, 2.0)
    ledger.spend(1.0, 2.0, 0)
    assert ledger.releases == 2 and ledger.history == [(1.0, 1.0, 1), (1.0, 2.0, 1)]
    exact = analytic_gaussian_epsilon(math.sqrt(1.25), DELTA)
    assert exact - 1e-9 <= ledger.epsilon(DELTA) <= exact * 1.01
    assert accountant.Accountant().epsilon(DELTA) == 0.0
    assert accountant.epsilon(0.5, 0.0, 1, DELTA) == math.inf


def naive_rdp_sampled_gaussian(q: float, sigma: float, order: int) -> float:
    """RDP of the Poisson-sampled Gaussian at an integer order (Mironov, Talwar, Zhang 2019, Thm 5):
    1/(a-1) log sum_k C(a, k) (1-q)^(a-k) q^k exp((k^2 - k) / (2 sigma^2))."""
    k = np.arange(order + 1)
    log_terms = (
        gammaln(order + 1) - gammaln(k + 1) - gammaln(order - k + 1)
        + (order - k) * math.log1p(-q) + k * math.log(q) + (k * k - k) / (2 * sigma**2)
    )  # fmt: skip
    return float(logsumexp(log_terms)) / (order - 1)


@pytest.mark.filterwarnings("ignore:Optimal order is the largest alpha")
def test_accountant_against_abadi_et_al_2016():
    """Abadi et al., "Deep learning with differential privacy", CCS 2016, section 3.1: q = 0.01,
    sigma = 4, delta = 1e-5, T = 10000 give epsilon ~ 1.26 with the moments accountant.

    A naive RDP sum with the moments accountant's conversion (orders up to 32) reproduces 1.26;
    the PLD accountant is tighter (<= it) and agrees within 2% with Opacus' PRV accountant
    (Gopi, Lee, Wutschitz 2021), an independent numerical method.
    """
    q, sigma, steps = 0.01, 4.0, 10_000
    moments = min(steps * naive_rdp_sampled_gaussian(q, sigma, a) + math.log(1 / DELTA) / (a - 1) for a in range(2, 33))
    assert moments == pytest.approx(1.26, abs=0.005)
    pld = accountant.epsilon(q, sigma, steps, DELTA)
    assert pld < moments
    from opacus.accountants import PRVAccountant

    prv = PRVAccountant()
    prv.history = [(sigma, q, steps)]
    assert pld == pytest.approx(prv.get_epsilon(DELTA), rel=0.02)


def test_noise_multiplier_inverts_epsilon():
    q, releases, target = 0.1, 20, 2.0
    sigma = accountant.noise_multiplier(target, DELTA, q, releases, tol=1e-3)
    assert accountant.epsilon(q, sigma, releases, DELTA) <= target
    assert accountant.epsilon(q, sigma - 0.01, releases, DELTA) > target  # nearly the smallest such sigma
    with pytest.raises(ValueError, match="target epsilon"):
        accountant.noise_multiplier(0.0, DELTA, q, releases)


# --- audit ------------------------------------------------------------------------------------


def test_clopper_pearson_closed_forms_and_table():
    alpha, n = 0.05, 40
    assert audit.clopper_pearson(0, n, alpha) == (0.0, pytest.approx(1 - (alpha / 2) ** (1 / n)))
    assert audit.clopper_pearson(n, n, alpha) == (pytest.approx((alpha / 2) ** (1 / n)), 1.0)
    lo, hi = audit.clopper_pearson(5, 10)  # R's binom.test(5, 10): 0.1870860 0.8129140
    assert lo == pytest.approx(0.1870860, abs=1e-6) and hi == pytest.approx(0.8129140, abs=1e-6)


def test_epsilon_from_rates_by_hand():
    assert audit.epsilon_from_rates(0.5, 0.05, 0.0) == pytest.approx(math.log(10))
    assert audit.epsilon_from_rates(0.05, 0.001, 0.0) == pytest.approx(math.log(50))
    assert audit.epsilon_from_rates(0.999, 0.5, 0.0) == pytest.approx(math.log(0.5 / 0.001))  # 2nd inequality
    assert audit.epsilon_from_rates(0.3, 0.3, 0.0) == 0.0


@pytest.fixture(scope="module")
def normal_features():
    """LeNet (seeds.INIT) features of real PneumoniaMNIST training images of class 0 (normal)."""
    from mpicd.config.sections import DataConfig
    from mpicd.data import load_dataset

    ds = load_dataset(DataConfig(name="medmnist", path=str(require_pneumonia())))
    x = np.concatenate([ds.train.x[ds.train.y == 0][:400], ds.test.x[:1]])
    return audit.lenet_features(x, seed=0, feature_dim=200, num_classes=2)


def test_canary_audit_positive_control_and_bound(normal_features):
    rows, canary = normal_features[:100], normal_features[-1]  # the canary: a held-out test image
    off = audit.canary_audit(rows, canary, q=1.0, clip=1.0, sigma=0.0, trials=200, seed=0, delta=DELTA)
    assert off.epsilon > 3.0 and off.tpr == 1.0 and off.fpr == 0.0  # noise off: the canary is seen
    empty = np.zeros((0, rows.shape[1]))  # worst case for Poisson sampling: no record hides the canary
    sampled = audit.canary_audit(
        empty, canary, q=0.5, clip=1.0, sigma=0.0, trials=200, seed=0, delta=DELTA, denominator=50
    )
    assert sampled.epsilon > 2.0
    for q, data, denominator in [(1.0, rows, None), (0.5, empty, 50.0)]:
        sigma = 2.0
        accounted = accountant.epsilon(q, sigma, 1, DELTA)
        kw = dict(q=q, clip=1.0, trials=200, seed=0, delta=DELTA, denominator=denominator)
        assert audit.canary_audit(data, canary, sigma=sigma, **kw).epsilon <= accounted
        # the audit has the power to catch a mechanism with 10x too little noise
        assert audit.canary_audit(data, canary, sigma=sigma / 10, **kw).epsilon > accounted


def test_membership_attack_off_and_on(normal_features):
    pool = normal_features[:400]
    off = audit.membership_attack(pool, members=10, reference=200, trials=20, seed=0, private=False)
    on = audit.membership_attack(pool, members=10, reference=200, trials=20, seed=0, private=True, sigma=50.0)
    assert off.candidates == on.candidates == 400
    assert off.auc > 0.55  # an exact mean of 10 real images gives its members away
    assert abs(on.auc - 0.5) < 0.1 and on.auc < off.auc
    perfect = audit.attack_success(np.array([2.0, 3.0]), np.array([0.0, 1.0]))
    assert perfect.auc == 1.0 and perfect.tpr_at_1pct_fpr == 1.0


@pytest.mark.parametrize(
    "history",
    [[(0.5, 5.511, 70)], [(1.0, 2.0, 5)], [(0.5, 5.511, 3), (1.0, 2.0, 4), (0.25, 1.3, 7)]],
)
def test_the_kept_plds_give_dp_accountings_own_epsilon(history):
    """Accountant.epsilon composes kept PLDs itself (for speed); dp-accounting's PLDAccountant, fed
    the same events, must give the same number."""
    from dp_accounting import dp_event
    from dp_accounting.pld.pld_privacy_accountant import PLDAccountant
    from dp_accounting.privacy_accountant import NeighboringRelation

    theirs = PLDAccountant(NeighboringRelation.ADD_OR_REMOVE_ONE, value_discretization_interval=1e-4)
    for q, sigma, count in history:
        gaussian = dp_event.GaussianDpEvent(sigma)
        theirs.compose(gaussian if q == 1.0 else dp_event.PoissonSampledDpEvent(q, gaussian), count)
    assert accountant.Accountant(list(history)).epsilon(1e-5) == theirs.get_epsilon(1e-5)
    assert accountant.Accountant(list(history)).epsilon(1e-5) == theirs.get_epsilon(1e-5)  # from the cache


# --- the site's keys (privacy.key_dir) --------------------------------------------------------


def test_site_key_is_made_once_0600_and_read_back(tmp_path):
    import stat

    folder = tmp_path / "keys"
    first = secret.site_key(folder, 3)
    path = folder / "client-3.key"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700 and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert bytes.fromhex(path.read_text()) == first and len(first) == 32
    assert secret.site_key(folder, 3) == first and secret.site_key(folder, 4) != first


@pytest.mark.parametrize("damage", ["readable", "link", "garbage", "short"])
def test_a_key_file_others_can_read_or_that_holds_no_key_is_refused_by_name(tmp_path, damage):
    folder = tmp_path / "keys"
    secret.site_key(folder, 0)
    path = folder / "client-0.key"
    if damage == "readable":
        path.chmod(0o644)
        message = "only its owner can access"
    elif damage == "link":
        target = tmp_path / "elsewhere.key"
        target.write_text(path.read_text())
        target.chmod(0o600)
        path.unlink()
        path.symlink_to(target)
        message = "cannot be read as a key file"
    else:
        path.write_text("not hex\n" if damage == "garbage" else "abcd\n")
        message = "does not hold a key"
    with pytest.raises(ValueError, match=message) as err:
        secret.site_key(folder, 0)
    assert str(path) in str(err.value)


def test_a_budget_keeps_its_key_in_its_state_and_refuses_a_checkpoint_of_another_key(tmp_path):
    from privacy_context import private_settings

    from mpicd.privacy.budget import Budget, KeyMismatch

    fresh = Budget(private_settings(), 0, 1)
    assert fresh.key is not None and fresh.state_dict()["key"] == fresh.key
    resumed = Budget(private_settings(), 0, 1)
    resumed.load_state_dict(fresh.state_dict())
    assert resumed.key == fresh.key  # no key_dir: the checkpoint's key is the client's
    empty = Budget(private_settings(key_dir=str(tmp_path / "empty")), 0, 1)  # a resume makes no key file
    with pytest.raises(
        KeyMismatch, match=r"client-1.key does not exist, but client 1's checkpoint was drawn with \(a fresh"
    ):
        empty.load_state_dict(fresh.state_dict())
    assert not (tmp_path / "empty").exists()
    secret.site_key(tmp_path, 1)
    at_site = Budget(private_settings(key_dir=str(tmp_path)), 0, 1)
    with pytest.raises(KeyMismatch, match="client-1.key is not the key client 1's checkpoint was drawn with"):
        at_site.load_state_dict(fresh.state_dict())
    fresh.ensure_key()
    assert fresh.key == resumed.key  # a key it has is kept
    empty.ensure_key()  # round 1: the key folder gets its key file
    assert empty.key == secret.site_key(tmp_path / "empty", 1)
    again = Budget(private_settings(key_dir=str(tmp_path / "empty")), 0, 1)
    again.load_state_dict(empty.state_dict())
    assert again.key == empty.key and "the key file" in again.key_from
    seeded = Budget(private_settings(noise="seeded"), 0, 1)
    assert seeded.key is None and seeded.state_dict()["key"] is None
    with pytest.raises(ValueError, match="holds no secret key"):
        Budget(private_settings(), 0, 1).load_state_dict(seeded.state_dict())


def test_clear_cache_forgets_every_pld_and_epsilon():
    """What tools/bench_privacy.py relies on so that no variant reuses another's accountant work."""
    from mpicd.privacy.accountant import _composed_epsilon, _release_pld, clear_cache

    eps = accountant.epsilon(0.5, 2.0, 3, 1e-5)
    assert _release_pld.cache_info().currsize + _composed_epsilon.cache_info().currsize > 0
    clear_cache()
    assert _release_pld.cache_info().currsize == 0 == _composed_epsilon.cache_info().currsize
    assert accountant.epsilon(0.5, 2.0, 3, 1e-5) == eps


# --- the release journal ----------------------------------------------------------------------


def test_a_release_is_journaled_before_it_is_returned_and_a_different_one_in_its_round_is_refused(tmp_path):
    """What a restart meets: a journal line per granted release (q, multiplier, steps, SHA-256 of the
    payload's dtype, shape and bytes, recomputed here with hashlib), durable before the payload goes;
    the same round computed again to the same bytes adds nothing, to other bytes is refused."""
    import hashlib

    from privacy_context import private_settings

    from mpicd.privacy.budget import Budget
    from mpicd.privacy.journal import Journal, read, ReleaseMismatch

    path = tmp_path / "ckpt" / "client1.0123456789abcdef.releases"
    first = Budget(private_settings(), 0, 1)
    first.begin("0123456789abcdef", Journal(path))
    payload = np.arange(6, dtype=np.float32).reshape(1, 6)
    assert first.request(2)
    first.released(2, payload)
    expected = hashlib.sha256(b"<f4(1, 6)" + payload.tobytes()).hexdigest()
    (entry,) = read(path).values()
    assert (entry.round, entry.slot, entry.q, entry.steps, entry.digest) == (2, 0, 0.5, 1, expected)
    assert entry.multiplier == private_settings().multiplier
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700

    again = Budget(private_settings(), 0, 1)  # the resumed job: the journal read back
    again.begin("0123456789abcdef", Journal(path))
    assert again.request(2)
    again.released(2, payload.copy())  # the same bytes: the same release, nothing appended
    assert path.read_text().count("\n") == 1
    assert again.request(2)  # a second release in the round (CCVR's statistics after DP-SGD): slot 1, journaled
    again.released(2, payload[:, :3])
    assert sorted(read(path)) == [(2, 0), (2, 1)]
    with pytest.raises(RuntimeError, match="without a grant"):
        again.released(3, payload)

    other = Budget(private_settings(), 0, 1)  # another resumed job, whose round 3 comes out other bytes
    other.begin("0123456789abcdef", Journal(path))
    assert other.request(2)
    moved = payload.copy()
    moved[0, 3] += 1e-6
    with pytest.raises(ReleaseMismatch, match=r"round 3.*differs.*--overwrite"):
        other.released(2, moved)
    assert path.read_text().count("\n") == 2


def test_a_journal_ignores_only_a_torn_last_line(tmp_path):
    from mpicd.privacy.journal import Entry, Journal, read

    path = tmp_path / "j.releases"
    Journal(path).record(Entry(0, 0, 0.5, 1.4, 1, "ab" * 32))
    with open(path, "a") as fh:
        fh.write('{"round": 1, "q": 0.5')  # a write cut short by a crash: nothing was sent after it
    assert list(read(path)) == [(0, 0)]
    journal = Journal(path)  # a resumed job: the torn line cut off before it appends
    assert list(journal.entries) == [(0, 0)]
    journal.record(Entry(1, 0, 0.5, 1.4, 1, "cd" * 32))
    assert list(read(path)) == [(0, 0), (1, 0)] and path.read_text().count("\n") == 2
    with open(path, "a") as fh:
        fh.write("garbage\n")  # a whole line that is no entry: refused, naming the file and line
    with pytest.raises(ValueError, match=r"j.releases: line 3 is not a release entry"):
        Journal(path)


@pytest.mark.parametrize("tamper", ["edit", "drop", "swap", "other client", "other key"])
def test_a_journal_line_proves_itself_under_the_site_key(tmp_path, tamper):
    """Each line's MAC: HMAC-SHA-256 under the site key of (tag, file name, the line before's MAC, the
    line's fields), every part length-prefixed; recomputed here with hmac. Whoever can write the file
    but lacks the key cannot edit, drop, reorder or transplant a line."""
    import hashlib
    import hmac
    import json

    from mpicd.privacy.journal import Entry, Journal, read

    key = bytes(range(32))
    path = tmp_path / "client1.0123456789abcdef.releases"
    journal = Journal(path, key)
    journal.record(Entry(0, 0, 0.5, 1.4, 1, "ab" * 32))
    journal.record(Entry(1, 0, 0.5, 1.4, 1, "cd" * 32))
    lines = path.read_text().splitlines(keepends=True)
    previous = b""
    for line in lines:
        fields = json.loads(line)
        mac = bytes.fromhex(fields.pop("mac"))
        h = hmac.new(key, digestmod=hashlib.sha256)
        for part in (
            b"mpicd release journal v1",
            path.name.encode(),
            previous,
            json.dumps(fields, sort_keys=True).encode(),
        ):
            h.update(len(part).to_bytes(8, "big") + part)
        assert mac == h.digest()
        previous = mac
    assert sorted(read(path, key)) == [(0, 0), (1, 0)]
    if tamper == "edit":  # the attacker halves a release's cost
        path.write_text(lines[0].replace('"q": 0.5', '"q": 0.25') + lines[1])
    elif tamper == "drop":
        path.write_text(lines[1])
    elif tamper == "swap":
        path.write_text(lines[1] + lines[0])
    elif tamper == "other client":
        path = path.rename(tmp_path / "client2.0123456789abcdef.releases")
    else:
        key = bytes(32)
    with pytest.raises(ValueError, match=r"line 1's MAC does not verify under the site key"):
        Journal(path, key)


def test_a_journal_cut_short_after_a_checkpoint_is_refused_on_resume(tmp_path):
    """Lines dropped from a journal's end (or the file deleted) leave every remaining MAC whole; the
    checkpoint's count of journaled releases shows it."""
    from privacy_context import private_settings

    from mpicd.privacy.budget import Budget, KeyMismatch
    from mpicd.privacy.journal import Journal

    key, path = bytes(range(32)), tmp_path / "client1.0123456789abcdef.releases"
    first = Budget(private_settings(), 0, 1)
    first.begin("0123456789abcdef", Journal(path, key))
    for r in range(3):
        assert first.request(r)
        first.released(r, np.full(4, r, dtype=np.float32))
    state = first.state_dict()
    assert state["journaled"] == 3
    whole = path.read_text()
    for kept in (whole, "".join(whole.splitlines(keepends=True)[:2]), None):
        if kept is None:
            path.unlink()
        else:
            path.write_text(kept)
        again = Budget(private_settings(), 0, 1)
        again.begin("0123456789abcdef", Journal(path, key))
        if kept == whole:
            again.load_state_dict(state)  # the whole journal: resumed
            continue
        with pytest.raises(
            KeyMismatch, match=rf"holds {2 if kept else 0} releases, but client 1's checkpoint was saved after 3"
        ):
            again.load_state_dict(state)


# --- DP-SGD's expected batch size ------------------------------------------------------------------


@pytest.mark.parametrize("n, batch_size", [(49, 1), (98, 1), (103, 1), (10, 3), (100, 32), (5, 8), (1, 1)])
def test_dpsgd_expected_batch_size_is_floor_of_n_over_the_batch_count(n, batch_size):
    """floor(n / ceil(n / b)) by integer arithmetic, never 0: at batch size 1 it is 1 for every n
    (Opacus' int(n * (1 / n)) is 0 for n = 49, 98, 103)."""
    from fractions import Fraction

    from mpicd.privacy.dpsgd import expected_batch_size

    batches = -(-n // batch_size)
    assert expected_batch_size(n, batch_size) == int(Fraction(n, batches)) >= 1
    if batch_size == 1:
        assert expected_batch_size(n, 1) == 1


def test_dpsgd_at_batch_size_one_on_49_images_trains_to_a_finite_model():
    """The reproduction: 49 images, batch size 1 gave Opacus an expected batch size of 0 and a NaN
    model; now one epoch keeps every parameter finite."""
    from mpicd.privacy import dpsgd

    torch.manual_seed(0)
    model = torch.nn.Linear(5, 2)
    x, y = torch.randn(49, 5), torch.arange(49) % 2
    private = dpsgd.make_private(
        model, torch.optim.SGD(model.parameters(), lr=0.1), x, y, batch_size=1, noise_multiplier=1.0,
        max_grad_norm=1.0, sampling=np.random.default_rng(0), noise=np.random.default_rng(1),
    )  # fmt: skip
    try:
        assert dpsgd.train_epoch(private) > 0
    finally:
        private.module.to_standard_module()
    assert all(torch.isfinite(p).all() for p in model.parameters())
