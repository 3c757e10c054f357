"""The audit that tells epsilon from 2 epsilon (mpicd.privacy.tradeoff, mpicd.bench.release_audit).

Expected values are derived by hand, not from the code under test: the Gaussian trade-off curve
Phi(Phi^-1(FPR) + sqrt(T) / sigma) for the accountant's region; the means and spreads of each
release's score from the mechanism's definition (the canary adds C along v, D adds nothing, the
noise std is sigma C); the claim from what the accountant must charge (sigma / sqrt 2 with noised
counts, Opacus' q = 1/4 and 4 steps). The reduced audit runs every release through the run's code
with the noise as claimed (passes) and at a quarter of it (flagged).
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from scipy.stats import norm

from conftest import require_pneumonia
from mpicd.bench import release_audit
from mpicd.privacy import accountant, tradeoff
from mpicd.privacy.budget import Settings

DELTA = 1e-5


def gaussian_tradeoff(fpr, mu):
    return norm.cdf(norm.ppf(fpr) + mu)


@pytest.mark.parametrize("sigma, count", [(2.0, 1), (1.0, 1), (3.0, 10)])
def test_region_of_a_gaussian_claim_is_the_gaussian_trade_off_curve(sigma, count):
    """One release at multiplier sigma is mu-GDP with mu = 1 / sigma, T of them sqrt(T) / sigma
    (Dong, Roth, Su 2019): the region read from the accountant's profile is that curve (the
    epsilon grid's step 0.01 makes it at most slightly larger, never smaller)."""
    region = tradeoff.Region([(1.0, sigma, count)])
    fpr = np.array([1e-4, 0.01, 0.1, 0.3, 0.5, 0.8])
    exact = gaussian_tradeoff(fpr, math.sqrt(count) / sigma)
    got = region.max_tpr(fpr)
    assert np.all(got >= exact - 1e-6)
    np.testing.assert_allclose(got, exact, atol=2e-4)


def test_region_of_a_subsampled_claim_lies_between_no_release_and_the_full_one():
    """Poisson sampling at q = 1/4 can only shrink what a release allows (amplification): between
    no test (TPR = FPR) and the full release's Gaussian curve, and well inside it in the middle,
    where the canary is absent from three releases in four."""
    sub = tradeoff.Region([(0.25, 1.5, 1)])
    fpr = np.linspace(0.01, 0.99, 50)
    assert np.all(sub.max_tpr(fpr) <= gaussian_tradeoff(fpr, 1 / 1.5) + 1e-6)
    assert np.all(sub.max_tpr(fpr) >= fpr - 1e-9)
    assert float(sub.max_tpr(0.3)) < float(gaussian_tradeoff(0.3, 1 / 1.5)) - 0.05


def gaussian_scores(mu, trials, seed):
    rng = np.random.default_rng(seed)
    return rng.normal(0.0, 1.0, trials), rng.normal(mu, 1.0, trials)


@pytest.mark.parametrize("seed", range(3))
def test_a_claim_kept_is_not_flagged_and_twice_the_epsilon_is(seed):
    """Scores N(0, 1) against N(mu, 1) are exactly the Gaussian mechanism at sigma = 1 / mu.
    Claimed sigma 2 (epsilon 2.0 at 1e-5): true sigma 2 passes; true sigma 1 (epsilon 4.4, issue
    41's example, which the old tail audit passed) is flagged with 5000 trials per neighbour."""
    region = tradeoff.Region([(1.0, 2.0, 1)])
    kept = tradeoff.audit_claim(*gaussian_scores(0.5, 5000, seed), region)
    broken = tradeoff.audit_claim(*gaussian_scores(1.0, 5000, seed), region)
    assert not kept.flagged and broken.flagged
    assert broken.tpr_lower > broken.allowed_tpr and broken.trials == 2500


def test_family_epsilon_brackets_the_true_epsilon():
    """The epsilon of the least refuted noise is a lower bound: below the true mechanism's epsilon
    (sigma 1: 4.4 at 1e-5), above the epsilon of 1.5 times its noise with 20000 trials."""
    out, inside = gaussian_scores(1.0, 20000, 0)
    found = tradeoff.family_epsilon(out, inside, [(1.0, 2.0, 1)], DELTA)
    assert accountant.epsilon(1.0, 1.5, 1, DELTA) < found < accountant.epsilon(1.0, 1.0, 1, DELTA)
    assert tradeoff.family_epsilon(*gaussian_scores(0.0, 2000, 0), [(1.0, 2.0, 1)], DELTA) == 0.0


# --- the releases, through the run's code ------------------------------------------------------


@pytest.fixture(scope="module")
def vectors():
    """LeNet (seeds.INIT) features and logits of 100 real PneumoniaMNIST training images per class,
    and of one test image (the canary's direction); the images of 127 others (DP-SGD's D)."""
    from mpicd.config.sections import DataConfig
    from mpicd.data import load_dataset
    from mpicd.privacy import audit

    ds = load_dataset(DataConfig(name="medmnist", path=str(require_pneumonia())))
    index = np.concatenate([np.flatnonzero(ds.train.y == c)[:100] for c in range(2)])
    features, logits = audit.lenet_outputs(
        np.concatenate([ds.train.x[index], ds.test.x[:1]]), seed=0, feature_dim=200, num_classes=2
    )
    return dict(
        features=features[:-1], logits=logits[:-1], labels=ds.train.y[index], toward_features=features[-1],
        toward_logits=logits[-1], images=ds.train.x[1000:1127], image_labels=ds.train.y[1000:1127],
    )  # fmt: skip


def settings(sigma, clip=1.0, noised=True):
    return Settings(clip=clip, sigma=sigma, q=1.0, delta=DELTA, budget=None, noised_counts=noised)


def scores(vectors, kind, s, trials, rounds=1, scale=1.0, seed=0):
    if kind == "dpsgd":
        return release_audit.dpsgd_scores(
            vectors["images"], vectors["image_labels"], settings=s, batch_size=32, trials=trials, seed=seed,
            noise_scale=scale,
        )  # fmt: skip
    read = "logits" if kind in ("codistill-logits", "feddistill") else "features"
    return release_audit.representation_scores(
        kind, vectors[read], vectors["labels"], canary_class=0, towards=vectors[f"toward_{read}"], settings=s,
        trials=trials, rounds=rounds, seed=seed, noise_scale=scale,
    )  # fmt: skip


def test_the_canary_direction_is_orthogonal_to_d_s_clipped_sum(vectors):
    rows = vectors["features"][vectors["labels"] == 0]
    v = release_audit.canary_direction(rows, 0.5, vectors["toward_features"])
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    clipped = rows * np.minimum(1.0, 0.5 / norms)
    assert abs(clipped.sum(axis=0) @ v) < 1e-9 * np.linalg.norm(clipped.sum(axis=0))
    assert np.linalg.norm(v) == pytest.approx(1.0)


@pytest.mark.parametrize("kind", ["codistill", "codistill-logits"])
def test_codistill_scores_are_the_canary_over_the_noised_count(vectors, kind):
    """R . v = (b C + N(0, (sigma C)^2)) / (n + b + N(0, sigma^2)), n = 100 images of class 0: mean
    about b C / (n + b), spread sigma C / n (the count's noise moves it by a factor 1 +- sigma / n);
    claimed: one release at sigma / sqrt 2."""
    sigma, clip, n = 3.0, 0.5, 100
    got = scores(vectors, kind, settings(sigma, clip), 2000)
    assert got.claim == ((1.0, sigma / math.sqrt(2), 1),)
    se = sigma * clip / n / math.sqrt(2000)
    assert abs(got.out.mean()) < 5 * se
    assert abs(got.inside.mean() - clip / (n + 1)) < 5 * se
    for sample in (got.out, got.inside):
        assert sample.std() == pytest.approx(sigma * clip / n, rel=0.08)


@pytest.mark.parametrize("kind", ["fedproto", "feddistill"])
def test_per_class_scores_move_by_two_with_the_canary(vectors, kind):
    """(sums_0 . v) / C + count_0: D gives 0 + 100 (its 100 images of class 0), the canary adds 1 to
    each term; each term has noise std sigma, the sum sqrt 2 sigma. Claimed: sigma / sqrt 2."""
    sigma = 2.0
    got = scores(vectors, kind, settings(sigma), 2000)
    assert got.claim == ((1.0, sigma / math.sqrt(2), 1),)
    se = math.sqrt(2) * sigma / math.sqrt(2000)
    assert abs(got.out.mean() - 100) < 5 * se and abs(got.inside.mean() - 102) < 5 * se
    for sample in (got.out, got.inside):
        assert sample.std() == pytest.approx(math.sqrt(2) * sigma, rel=0.08)


def test_dpsgd_scores_are_the_sampled_canary_plus_noise(vectors):
    """128 records in batches of 32: q = 1/4, 4 steps (Opacus' schedule), expected batch 32. Per step
    the gradient along the canary's direction is (C [canary sampled] + N(0, (sigma C)^2)) / 32; over 4
    steps: mean 4 q C / 32 = C / 32 with the canary, 0 without; spread 2 sigma C / 32 (plus the
    sampling's C^2 4 q (1 - q) / 32^2 with it)."""
    sigma, clip, trials = 1.5, 1.0, 600
    got = scores(vectors, "dpsgd", settings(sigma, clip, noised=False), trials)
    assert got.claim == ((0.25, sigma, 4),)
    spread = 2 * sigma * clip / 32
    assert abs(got.out.mean()) < 5 * spread / math.sqrt(trials)
    assert abs(got.inside.mean() - clip / 32) < 5 * spread / math.sqrt(trials)
    assert got.out.std() == pytest.approx(spread, rel=0.1)
    assert got.inside.std() == pytest.approx(math.sqrt(spread**2 + clip**2 * 4 * 0.25 * 0.75 / 32**2), rel=0.1)


def test_a_composition_is_charged_as_its_releases(vectors):
    got = scores(vectors, "codistill", settings(4.0), 50, rounds=3)
    assert got.claim == ((1.0, 4.0 / math.sqrt(2), 3),)
    control = scores(vectors, "codistill", settings(4.0), 50, rounds=3, scale=0.5)
    assert control.claim == got.claim  # the control claims the noise it does not add


# --- the reduced audit: every release, as claimed and at a quarter ----------

REDUCED_TRIALS = {"dpsgd": 600}  # trials per neighbour; the representation releases: 1000


@pytest.mark.parametrize("kind", release_audit.KINDS)
def test_reduced_audit_passes_the_release_and_flags_a_quarter_of_its_noise(vectors, kind):
    """The claim of one release at epsilon 2 (delta 1e-5) is kept by the run's code and refuted when
    the noise is a quarter of the claimed sigma (epsilon about 4 times: a quarter-sigma mutant)."""
    if kind == "dpsgd":
        from mpicd.privacy import dpsgd

        q, steps = dpsgd.schedule(128, 32)
        s = settings(accountant.noise_multiplier(2.0, DELTA, q, steps), noised=False)
    else:
        s = settings(accountant.noise_multiplier(2.0, DELTA, 1.0, 1) * math.sqrt(2))
    trials = REDUCED_TRIALS.get(kind, 1000)
    kept = release_audit.audit(scores(vectors, kind, s, trials), DELTA, family=False)
    quarter = release_audit.audit(scores(vectors, kind, s, trials, scale=0.25), DELTA, family=False)
    assert kept.accounted == pytest.approx(2.0, abs=0.01) and quarter.accounted == kept.accounted
    assert not kept.verdict.flagged, kept.verdict
    assert quarter.verdict.flagged, quarter.verdict


def test_reduced_audit_of_a_composition_flags_a_quarter_of_its_noise(vectors):
    s = settings(accountant.noise_multiplier(4.0, DELTA, 1.0, 5) * math.sqrt(2))
    region = tradeoff.Region(((1.0, s.sigma / math.sqrt(2), 5),))
    kept = release_audit.audit(scores(vectors, "codistill", s, 600, rounds=5), DELTA, family=False, region=region)
    quarter = release_audit.audit(
        scores(vectors, "codistill", s, 600, rounds=5, scale=0.25), DELTA, family=False, region=region
    )
    assert kept.accounted == pytest.approx(4.0, abs=0.01)
    assert not kept.verdict.flagged and quarter.verdict.flagged


def test_a_region_that_is_not_the_claim_is_refused(vectors):
    got = scores(vectors, "codistill", settings(4.0), 20)
    with pytest.raises(ValueError, match="not the claim"):
        release_audit.audit(got, DELTA, family=False, region=tradeoff.Region([(1.0, 9.0, 1)]))


def test_settings_with_a_budget_are_audited_without_it(vectors):
    """The audit charges without refusing: a budget the control's halved noise would exceed does
    not stop it (its claim stays the charge at the claimed sigma)."""
    s = replace(settings(accountant.noise_multiplier(2.0, DELTA, 1.0, 1) * math.sqrt(2)), budget=2.0)
    got = scores(vectors, "codistill", s, 20, scale=0.5)
    assert got.claim == ((1.0, s.sigma / math.sqrt(2), 1),)
