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

Membership inference per method, from what a peer receives (:func:`class_mean_attack`), on each
method's release as the peer gets it -- co-distillation's R (:func:`peer_mean`), FedProto's
prototypes and FedDistill's mean logits (:func:`peer_class_means`, one client's payload
``[sums ; counts]`` turned into sums / counts: what a peer of a 2-client run recovers by taking
its own payload off the Allreduce's sum; with more clients it sees only the others' sum, less),
each computed by :mod:`.release`'s functions with the same generator stream; a candidate of
class c is scored against class c's mean by the log likelihood ratio of "one of the count
images" (:func:`membership_scores`), calibrated on the peer's own images of the class (so that
classes and trials share one scale). And FedAvg's averaged model: the loss-threshold attack
(Yeom et al. 2018, "Privacy risk in machine learning"; :func:`loss_scores`): training images
tend to have a lower loss than unseen ones.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from mpicd.core import seeds
from mpicd.privacy.clip import clip_rows
from mpicd.privacy.release import class_sums_payload, means_from_sums, private_class_sums, sampled_private_mean
from mpicd.privacy.sampling import poisson_subset
from mpicd.privacy.streams import ATTACK, AUDIT


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


# --- per method: what a peer receives, and the attacks on it ------------------------------------


@dataclass(frozen=True)
class Release:
    """How a method's statistics reach a peer: exact (``sigma`` None: privacy off, the algorithms
    as they are without a ``privacy:`` section) or through :mod:`.release` at (q, clip, sigma), the
    per-class counts noised (std sigma, the default) or public (q n_c)."""

    sigma: float | None = None
    q: float = 1.0
    clip: float = 1.0
    noised_counts: bool = True

    @property
    def private(self) -> bool:
        return self.sigma is not None


def peer_mean(rows, release: Release, generator: np.random.Generator) -> np.ndarray:
    """Co-distillation's R as its students receive it, (W,) float32, from the vectors (features or
    logits) of the n images of the teacher's expertise class. Off: their exact mean (``k: all``);
    on: :func:`.release.sampled_private_mean` over them at the public denominator max(q n, 1), the
    mechanism of ``privacy.counts: public`` (the release with a noised count is codistill's own code)."""
    rows = np.asarray(rows, dtype=np.float64)
    if not release.private:
        return rows.mean(axis=0).astype(np.float32)
    if release.noised_counts:
        raise ValueError("privacy: the audited R divides by the public q n: pass Release(noised_counts=False)")
    denominator = max(release.q * len(rows), 1.0)
    shared = sampled_private_mean(
        rows, q=release.q, clip=release.clip, sigma=release.sigma, denominator=denominator, generator=generator
    )
    return shared.astype(np.float32)


def peer_class_means(
    rows, labels, num_classes: int, release: Release, generator: np.random.Generator, counts: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """FedProto's prototypes (FedDistill's mean logits, from logit rows) as a peer forms them from
    one client's payload ``[sums (C W) ; counts (C)]`` (float32, :func:`.release.class_sums_payload`):
    ((C, W) sums / counts, (C,) mask of the classes whose count is >= 1), by
    :func:`.release.means_from_sums`. Off: the exact sums and counts of all the rows (the payload of
    ``PerClassMeans.payload(weighted=True)``); on: the release of
    mpicd.algorithms.aggregate.private_class_payload: a Poisson sample at q
    (:func:`.sampling.poisson_subset`), then :func:`.release.private_class_sums` from the same
    generator; public counts are q n_c of all the rows. ``counts``: the payload's (C,) counts
    instead of the mask (zero where the mask is False)."""
    rows, labels = np.asarray(rows, dtype=np.float64), np.asarray(labels, dtype=np.int64)
    width = rows.shape[1]
    if not release.private:
        sums = np.zeros((num_classes, width))
        np.add.at(sums, labels, rows)
        totals = np.bincount(labels, minlength=num_classes).astype(np.float64)
    else:
        taken = poisson_subset(len(rows), release.q, generator)
        sums, totals = private_class_sums(
            rows[taken], labels[taken], num_classes, clip=release.clip, sigma=release.sigma,
            generator=generator, noise_counts=release.noised_counts,
        )  # fmt: skip
        if not release.noised_counts:
            totals = release.q * np.bincount(labels, minlength=num_classes)
    payload = class_sums_payload(sums, totals)
    received = payload[num_classes * width :].astype(np.float64)
    means, keep = means_from_sums(payload[: num_classes * width].reshape(num_classes, width), received)
    return (means, np.where(keep, received, 0.0)) if counts else (means, keep)


def codistill_view(release: Release, num_classes: int, expertise: int):
    """``view(rows, labels, generator)`` for :func:`class_mean_attack`: co-distillation's R of the
    ``expertise`` class (:func:`peer_mean` of the rows of that class), the only class it shares;
    the count the peer knows is the class's n (off) or the public denominator max(q n, 1)."""

    def view(rows, labels, generator):
        rows, labels = np.asarray(rows), np.asarray(labels)
        n = int((labels == expertise).sum())
        means, counts = np.zeros((num_classes, rows.shape[1])), np.zeros(num_classes)
        means[expertise] = peer_mean(rows[labels == expertise], release, generator)
        counts[expertise] = max(release.q * n, 1.0) if release.private else n
        return means, counts

    return view


def class_means_view(release: Release, num_classes: int):
    """``view(rows, labels, generator)`` for :func:`class_mean_attack`: :func:`peer_class_means`,
    with the counts of the payload (the peer knows them; 0 for a class it cannot divide by)."""

    def view(rows, labels, generator):
        return peer_class_means(rows, labels, num_classes, release, generator, counts=True)

    return view


def membership_scores(candidates, reference, shared, count: float) -> np.ndarray:
    """The peer's membership score of each candidate row x against a received mean ``shared`` of
    ``count`` rows, from its own ``reference`` rows of the class (mean mu, per-coordinate variance
    s^2): ``(x - mu) . (shared - mu) / s^2 - |x - mu|^2_s / (2 count)``, the log likelihood ratio
    of "x is one of the count rows" for independent Gaussian coordinates (for a large count the
    projection of :func:`membership_attack`; for count 1 largest at x = shared), calibrated on the
    peer's own images: the empirical distribution function of the reference rows' scores at x's
    (linear between them, 0 below the lowest, 1 above the highest), so that scores of different
    classes and trials are on one scale."""
    candidates, reference = np.asarray(candidates, dtype=np.float64), np.asarray(reference, dtype=np.float64)
    centre, var = reference.mean(axis=0), np.maximum(reference.var(axis=0), 1e-12)
    direction, weight = (np.asarray(shared, dtype=np.float64) - centre) / var, 1.0 / (2.0 * max(float(count), 1.0))

    def raw(vectors):
        offset = vectors - centre
        return offset @ direction - weight * (offset * offset / var).sum(axis=1)

    own = np.sort(raw(reference))
    return np.interp(raw(candidates), own, (np.arange(len(own)) + 0.5) / len(own), left=0.0, right=1.0)


def class_mean_attack(
    rows, labels, *, members, reference: int, trials: int, seed: int, view, clip: float | None = None
) -> AttackResult:
    """Membership inference by a peer on a release of per-class means, over ``trials`` draws.

    ``rows`` (N, W) and ``labels`` (N,) are the pool of real images' vectors; ``members[c]`` the
    client's images of class c (its class mix), with as many non-members of each class and
    ``reference`` images of each class the peer holds. Per trial (stream
    (seed, PRIVACY, t, 0, ATTACK)): for each class, in order, a permutation of the pool's images of
    that class gives the members, the non-members and the reference; then
    ``view(member rows, member labels, generator)`` -- what the peer receives, ((C, W) means, (C,)
    counts it knows) -- draws its sample and noise from the same generator. A candidate of class c
    gets :func:`membership_scores` against class c's mean (0 if the class's count is below 1: the
    peer cannot divide, :func:`.release.means_from_sums`); with ``clip`` the peer first clips
    candidates and reference (it knows the mechanism).
    """
    rows, labels = np.asarray(rows, dtype=np.float64), np.asarray(labels, dtype=np.int64)
    members = [int(m) for m in members]
    pools = [np.flatnonzero(labels == c) for c in range(len(members))]
    for c, (m, pool) in enumerate(zip(members, pools)):
        if m and 2 * m + reference > len(pool):
            raise ValueError(
                f"privacy: the attack needs 2 x {m} + {reference} images of class {c}, the pool has {len(pool)}"
            )
    candidates = rows if clip is None else clip_rows(rows, clip)
    inside, outside = [], []
    for t in range(int(trials)):
        generator = seeds.rng(seed, seeds.PRIVACY, t, 0, ATTACK)
        split = []
        for m, pool in zip(members, pools):
            order = pool[generator.permutation(len(pool))] if m else pool[:0]
            split.append((order[:m], order[m : 2 * m], order[2 * m : 2 * m + reference]))
        team = np.concatenate([s[0] for s in split])
        means, counts = view(rows[team], labels[team], generator)
        for c, (mine, others, own) in enumerate(split):
            if not len(mine):
                continue
            if not counts[c] >= 1.0:
                inside.append(np.zeros(len(mine)))
                outside.append(np.zeros(len(others)))
                continue
            scores = membership_scores(candidates[np.concatenate([mine, others])], candidates[own], means[c], counts[c])
            inside.append(scores[: len(mine)])
            outside.append(scores[len(mine) :])
    return attack_success(np.concatenate(inside), np.concatenate(outside))


def loss_scores(model, x, y, chunk: int = 512) -> np.ndarray:
    """The loss-threshold attack's score (Yeom et al. 2018): minus each image's cross-entropy under
    ``model`` (a torch module giving logits; eval mode, no gradient), float64: a model tends to fit
    its training images better than unseen ones. The model's mode is restored."""
    import torch
    import torch.nn.functional as F

    images = torch.as_tensor(np.ascontiguousarray(x, dtype=np.float32))
    targets = torch.as_tensor(np.asarray(y, dtype=np.int64))
    was_training = model.training
    model.eval()
    with torch.no_grad():
        losses = [
            F.cross_entropy(model(images[i : i + chunk]), targets[i : i + chunk], reduction="none")
            for i in range(0, len(images), chunk)
        ]
    model.train(was_training)
    return -torch.cat(losses).double().numpy()


def loss_attack(model, members: tuple, non_members: tuple) -> AttackResult:
    """:func:`loss_scores` of ``members`` = (images, labels) against ``non_members``: AUC, TPR at 1% FPR."""
    return attack_success(loss_scores(model, *members), loss_scores(model, *non_members))


def lenet_features(
    x: np.ndarray, *, seed: int, feature_dim: int, num_classes: int, fit: tuple | None = None, train_epochs: int = 0
) -> np.ndarray:
    """(n, D) float64 eval-mode features of the project's LeNet (mpicd.models.networks.lenet) on images ``x``,
    initialised as a run initialises its model (seeds.INIT); with ``train_epochs`` > 0 it is first
    trained on ``fit`` = (images, labels) with plain SGD (lr 0.05, batches of 64, order from
    seeds.SHUFFLE), so the features are those of a fitted teacher rather than a random network."""
    return lenet_outputs(
        x, seed=seed, feature_dim=feature_dim, num_classes=num_classes, fit=fit, train_epochs=train_epochs
    )[0]


def lenet_outputs(
    x: np.ndarray, *, seed: int, feature_dim: int, num_classes: int, fit: tuple | None = None, train_epochs: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """((n, D) features, (n, C) logits), float64, of the LeNet of :func:`lenet_features` (the
    logits are its head on the float32 features, as the model's forward computes them)."""
    import torch
    import torch.nn.functional as F

    from mpicd.models.networks import lenet  # torch, as above: only this attack trains a model

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
        features = torch.cat([model.features(images[i : i + 512]) for i in range(0, len(images), 512)])
        logits = model.head(features)
    return features.double().numpy(), logits.double().numpy()
