"""Measuring leakage, not only bounding it: a canary audit of a release and a membership attack on R.

Canary audit (Jagielski et al. 2020, "Auditing differentially private machine learning"; Nasr et
al. 2021): many releases of the implemented mechanism (:func:`.release.sampled_private_mean`) on
two neighbouring datasets, D and D plus one canary record, each release from its own stream.
The distinguisher scores a release by its projection on the canary's clipped direction (the
likelihood-ratio test for the Gaussian mechanism) and says "canary in" above a threshold. Any
(epsilon, delta)-DP mechanism has TPR <= e^eps FPR + delta and 1 - FPR <= e^eps (1 - TPR) + delta
for every test, so Clopper-Pearson bounds on TPR and FPR give a lower bound on epsilon that holds
with the stated confidence. The threshold is chosen on the first half of the trials, the bound
computed on the second half (no selection bias). The bound must stay below the accountant's
epsilon; with the noise off it must be large (the positive control: the audit can see a canary).

Membership attack on R (Dwork, Smith, Steinke, Ullman, "Exposed!", 2017; Homer et al. 2008): a
peer receives the teacher's R, the mean feature vector of m images of a class, and holds its own
images of that class (a reference set). For a candidate image x it scores
``sum_j (x_j - mu_j) (R_j - mu_j) / s_j^2`` (mu, s^2 the reference set's per-coordinate mean and
variance): members of the teacher's set pull R toward themselves. Per trial the
teacher's set, the non-members (same class, not in the set) and the reference set are drawn
disjointly from a pool of real images; AUC and TPR at 1% FPR over all trials' candidates.
With privacy on the attacker knows the mechanism (it clips x and mu_ref with the same C).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .. import seeds
from .clip import clip_rows
from .release import sampled_private_mean
from .streams import ATTACK, AUDIT


def clopper_pearson(successes: int, trials: int, alpha: float = 0.05) -> tuple[float, float]:
    """The exact two-sided (1 - alpha) binomial confidence interval for a success probability."""
    from scipy.stats import beta

    k, n = int(successes), int(trials)
    if not 0 <= k <= n or n == 0:
        raise ValueError(f"privacy: Clopper-Pearson needs 0 <= successes <= trials, trials > 0, got {k}, {n}")
    lo = 0.0 if k == 0 else float(beta.ppf(alpha / 2, k, n - k + 1))
    hi = 1.0 if k == n else float(beta.ppf(1 - alpha / 2, k + 1, n - k))
    return lo, hi


def epsilon_from_rates(tpr: float, fpr: float, delta: float) -> float:
    """The smallest epsilon that (tpr, fpr) allow under (epsilon, delta)-DP, both inequalities."""
    bounds = [0.0]
    for hit, false_alarm in ((tpr, fpr), (1.0 - fpr, 1.0 - tpr)):
        if hit - delta > 0:
            bounds.append(math.inf if false_alarm == 0 else math.log((hit - delta) / false_alarm))
    return max(bounds)


def bound_at(out_scores: np.ndarray, in_scores: np.ndarray, threshold: float, delta: float, alpha: float) -> float:
    """The (1 - alpha)-confidence epsilon lower bound of the test 'score > threshold': both DP
    inequalities at TPR's lower and FPR's upper Clopper-Pearson bound (each two-sided at alpha)."""
    tpr_lo, _ = clopper_pearson(int((in_scores > threshold).sum()), len(in_scores), alpha)
    _, fpr_hi = clopper_pearson(int((out_scores > threshold).sum()), len(out_scores), alpha)
    return epsilon_from_rates(tpr_lo, fpr_hi, delta)


@dataclass(frozen=True)
class AuditBound:
    """An empirical epsilon lower bound: the threshold chosen on the calibration half, the bound,
    TPR and FPR measured on the other half (``trials`` releases per neighbour there)."""

    epsilon: float
    threshold: float
    tpr: float
    fpr: float
    trials: int


CANDIDATE_THRESHOLDS = 256  # quantiles of the calibration scores tried as thresholds


def epsilon_lower_bound(out_scores, in_scores, delta: float, alpha: float = 0.05) -> AuditBound:
    """Split each neighbour's scores in halves (trial order): pick the threshold that maximises
    :func:`bound_at` on the first halves, report the bound on the second halves."""
    out_scores, in_scores = np.asarray(out_scores, dtype=np.float64), np.asarray(in_scores, dtype=np.float64)
    half = min(len(out_scores), len(in_scores)) // 2
    if half < 1:
        raise ValueError("privacy: the audit needs at least 2 releases per neighbouring dataset")
    cal_out, cal_in = out_scores[:half], in_scores[:half]
    test_out, test_in = out_scores[half : 2 * half], in_scores[half : 2 * half]
    candidates = np.unique(np.quantile(np.concatenate([cal_out, cal_in]), np.linspace(0, 1, CANDIDATE_THRESHOLDS)))
    best = max(candidates, key=lambda t: bound_at(cal_out, cal_in, t, delta, alpha))
    return AuditBound(
        epsilon=bound_at(test_out, test_in, best, delta, alpha),
        threshold=float(best),
        tpr=float((test_in > best).mean()),
        fpr=float((test_out > best).mean()),
        trials=half,
    )


def canary_scores(
    rows, canary, *, q: float, clip: float, sigma: float, trials: int, seed: int, denominator: float | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(scores without, scores with the canary): ``trials`` releases of R on D and on D + canary.

    D is ``rows`` (n, W), n >= 0, the canary one more row; the public denominator is the same for
    both (the declared size, fixed before the data: the mechanism's assumption), q n by default.
    D empty is the worst case for a Poisson-sampled release (no other record's sampling hides
    the canary): the audit of the accountant's tightness. Release t of neighbour b
    uses the stream (seed, PRIVACY, t, b, AUDIT); its score is R's projection on the canary's
    clipped unit direction.
    """
    rows = np.asarray(rows, dtype=np.float64)
    canary = np.asarray(canary, dtype=np.float64).reshape(1, -1)
    direction = clip_rows(canary, clip)[0]
    direction /= np.linalg.norm(direction)
    neighbours = (rows, np.vstack([rows, canary]))
    denominator = q * max(len(rows), 1) if denominator is None else denominator
    scores = np.empty((2, int(trials)))
    for t in range(int(trials)):
        for b, data in enumerate(neighbours):
            generator = seeds.rng(seed, seeds.PRIVACY, t, b, AUDIT)
            release = sampled_private_mean(
                data, q=q, clip=clip, sigma=sigma, denominator=denominator, generator=generator
            )
            scores[b, t] = release @ direction
    return scores[0], scores[1]


def canary_audit(
    rows,
    canary,
    *,
    q: float,
    clip: float,
    sigma: float,
    trials: int,
    seed: int,
    delta: float,
    alpha: float = 0.05,
    denominator: float | None = None,
) -> AuditBound:
    """:func:`canary_scores` then :func:`epsilon_lower_bound`: the empirical epsilon of one release."""
    out_scores, in_scores = canary_scores(
        rows, canary, q=q, clip=clip, sigma=sigma, trials=trials, seed=seed, denominator=denominator
    )
    return epsilon_lower_bound(out_scores, in_scores, delta, alpha)


@dataclass(frozen=True)
class AttackResult:
    """A membership attack's success over all trials' candidates (members and as many non-members)."""

    auc: float
    tpr_at_1pct_fpr: float
    candidates: int


def attack_success(member_scores, non_member_scores) -> AttackResult:
    """AUC and the largest TPR whose FPR is <= 1% (members are the positives)."""
    from sklearn.metrics import roc_auc_score, roc_curve

    scores = np.concatenate([member_scores, non_member_scores])
    truth = np.concatenate([np.ones(len(member_scores)), np.zeros(len(non_member_scores))])
    fpr, tpr, _ = roc_curve(truth, scores)
    return AttackResult(
        auc=float(roc_auc_score(truth, scores)), tpr_at_1pct_fpr=float(tpr[fpr <= 0.01].max()), candidates=len(scores)
    )


def membership_attack(
    pool,
    *,
    members: int,
    reference: int,
    trials: int,
    seed: int,
    private: bool,
    q: float = 1.0,
    clip: float = 1.0,
    sigma: float = 0.0,
) -> AttackResult:
    """The peer's attack on R (see the module docstring) over ``trials`` draws from ``pool`` (N, W).

    Per trial (stream (seed, PRIVACY, t, 0, ATTACK)): a permutation of the pool gives the
    teacher's ``members`` images, as many non-members and the peer's ``reference`` images. R is
    the exact mean of the members' vectors when ``private`` is false (today's algorithm, k = all),
    else :func:`.release.sampled_private_mean` at (q, clip, sigma) with denominator q m.
    """
    pool = np.asarray(pool, dtype=np.float64)
    if 2 * members + reference > len(pool):
        raise ValueError(f"privacy: the attack needs 2 x {members} + {reference} images, the pool has {len(pool)}")
    candidates = clip_rows(pool, clip) if private else pool
    inside, outside = [], []
    for t in range(int(trials)):
        generator = seeds.rng(seed, seeds.PRIVACY, t, 0, ATTACK)
        order = generator.permutation(len(pool))
        team, others, own = order[:members], order[members : 2 * members], order[2 * members : 2 * members + reference]
        if private:
            shared = sampled_private_mean(
                pool[team], q=q, clip=clip, sigma=sigma, denominator=q * members, generator=generator
            )
        else:
            shared = pool[team].mean(axis=0)
        centre = candidates[own].mean(axis=0)
        direction = (shared - centre) / np.maximum(candidates[own].var(axis=0), 1e-12)  # whitened per coordinate
        inside.append((candidates[team] - centre) @ direction)
        outside.append((candidates[others] - centre) @ direction)
    return attack_success(np.concatenate(inside), np.concatenate(outside))


def lenet_features(
    x: np.ndarray, *, seed: int, feature_dim: int, num_classes: int, fit: tuple | None = None, train_epochs: int = 0
) -> np.ndarray:
    """(n, D) float64 eval-mode features of the project's LeNet (mpicd.models.lenet) on images ``x``,
    initialised as a run initialises its model (seeds.INIT); with ``train_epochs`` > 0 it is first
    trained on ``fit`` = (images, labels) with plain SGD (lr 0.05, batches of 64, order from
    seeds.SHUFFLE), so the features are those of a fitted teacher rather than a random network."""
    import torch
    import torch.nn.functional as F

    from ..models import lenet

    torch.manual_seed(seeds.torch_seed(seed, seeds.INIT))
    model = lenet(x.shape[1], feature_dim, num_classes)
    if train_epochs > 0:
        images = torch.from_numpy(np.ascontiguousarray(fit[0], dtype=np.float32))
        labels = torch.from_numpy(np.asarray(fit[1], dtype=np.int64))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        model.train()
        for epoch in range(train_epochs):
            order = torch.from_numpy(seeds.rng(seed, seeds.SHUFFLE, 0, 0, epoch).permutation(len(images)))
            for i in range(0, len(order), 64):
                batch = order[i : i + 64]
                optimizer.zero_grad()
                F.cross_entropy(model(images[batch]), labels[batch]).backward()
                optimizer.step()
    model.eval()
    images = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
    with torch.no_grad():
        return torch.cat([model.features(images[i : i + 512]) for i in range(0, len(images), 512)]).double().numpy()
