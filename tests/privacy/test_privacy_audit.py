"""mpicd.privacy.audit per method: what a peer receives from each algorithm, and the attacks on it.

Expected values come from the construction (a member that is the mean itself, noise that drowns
every member, losses chosen by hand) or from the algorithms' own release code, never from the
attack's code path.
"""

from __future__ import annotations

import math

import h5py
import numpy as np
import pytest
import torch

from privacy_context import context, private_settings
from conftest import QUICKSTART, ROOT, mpiexec, require_pneumonia
from mpicd.algorithms import resolve
from mpicd.algorithms.aggregate import PerClassMeans, private_class_payload
from mpicd.algorithms.codistill import CoDistillation
from mpicd.config.loading import load_config
from mpicd.core import seeds
from mpicd.models.networks import build_model
from mpicd.privacy import audit
from mpicd.privacy.streams import ATTACK


def null_sd(members: int, non_members: int) -> float:
    """The standard deviation of the Mann-Whitney AUC when members and non-members are exchangeable."""
    return math.sqrt((members + non_members + 1) / (12 * members * non_members))


@pytest.fixture(scope="module")
def vectors():
    """(features, logits, labels) of the project's LeNet (seeds.INIT) on 500 real PneumoniaMNIST
    training images of each class."""
    from mpicd.config.sections import DataConfig
    from mpicd.data import load_dataset

    ds = load_dataset(DataConfig(name="medmnist", path=str(require_pneumonia())))
    index = np.concatenate([np.flatnonzero(ds.train.y == c)[:500] for c in range(2)])
    features, logits = audit.lenet_outputs(ds.train.x[index], seed=0, feature_dim=200, num_classes=2)
    return features, logits, ds.train.y[index]


# --- the loss-threshold attack ----------------------------------------------------------------


def test_loss_attack_by_hand():
    """Logits (x, 0): label 0 has loss softplus(-x), label 1 softplus(x); x chosen for given losses."""
    model = torch.nn.Linear(1, 2)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0], [0.0]]))
        model.bias.zero_()
    model.train()

    def inputs(losses, labels):
        # softplus(-x) = L  <=>  x = -log(e^L - 1); label 1: x = log(e^L - 1)
        x = [(-1 if y == 0 else 1) * math.log(math.expm1(loss)) for loss, y in zip(losses, labels)]
        return np.array(x, dtype=np.float32)[:, None], np.array(labels)

    members = inputs([0.1, 0.5, 2.0], [0, 1, 0])
    non_members = inputs([0.3, 1.0, 3.0], [1, 0, 0])
    np.testing.assert_allclose(audit.loss_scores(model, *members), [-0.1, -0.5, -2.0], rtol=1e-5)
    assert model.training  # its mode is restored
    result = audit.loss_attack(model, members, non_members)
    # pairs won by the member (lower loss): 0.1 beats 3, 0.5 beats 1.0 and 3.0, 2.0 beats 3.0 -> 6 of 9
    assert result.auc == pytest.approx(6 / 9)
    # FPR <= 1% admits no non-member: only losses below 0.3 -> 1 of 3 members
    assert result.tpr_at_1pct_fpr == pytest.approx(1 / 3) and result.candidates == 6


# --- the views are what the algorithms send ----------------------------------------------------


def rows_of(outputs, model, x) -> np.ndarray:
    model.eval()
    with torch.no_grad():
        return outputs(x).double().numpy()


@pytest.mark.parametrize("counts", ["noised", "public"])
def test_class_means_view_is_fedproto_s_payload_divided(counts):
    """The audited release of FedProto/FedDistill is the one mpicd.algorithms.aggregate sends (the
    audit's draws are seeded: compared on a seeded release)."""
    s = private_settings(clip=0.5, counts=counts, noise="seeded")
    ctx, model, x, y = context(s)
    payload = private_class_payload(ctx, model.features, 8, round_index=4)
    sums, sent = payload[:16].reshape(2, 8).astype(np.float64), payload[16:].astype(np.float64)
    release = audit.Release(sigma=s.sigma, q=s.q, clip=s.clip, noised_counts=s.noised_counts)
    view = audit.class_means_view(release, 2)
    means, received = view(rows_of(model.features, model, x), y.numpy(), seeds.rng(3, seeds.PRIVACY, 1, 4, 0))
    assert (sent >= 1).all()
    np.testing.assert_allclose(received, sent, rtol=1e-6)
    np.testing.assert_allclose(means, sums / sent[:, None], rtol=1e-5, atol=1e-7)


def test_class_means_view_without_privacy_is_perclassmeans():
    ctx, model, x, y = context(None)
    rows = rows_of(model.features, model, x)
    exact = PerClassMeans(2, 8, torch.device("cpu"))
    exact.add(torch.from_numpy(rows), y)
    sums, counts = exact.split(exact.payload(weighted=True))
    means, received = audit.class_means_view(audit.Release(), 2)(rows, y.numpy(), None)
    np.testing.assert_array_equal(received, counts)
    np.testing.assert_allclose(means, sums / counts[:, None], rtol=1e-6)


@pytest.mark.parametrize("share", ["features", "logits"])
@pytest.mark.parametrize("private", [False, True])
def test_codistill_view_is_the_r_codistill_sends(share, private):
    s = private_settings(clip=0.25, counts="public", noise="seeded") if private else None
    ctx, model, x, y = context(s)
    algorithm = CoDistillation(resolve({"name": "codistill", "share": share})[1], ctx)
    released = algorithm.class_means(round_index=2)  # client 1: its expertise class 1
    outputs = model if share == "logits" else model.features
    release = audit.Release(sigma=s.sigma, q=s.q, clip=s.clip, noised_counts=False) if private else audit.Release()
    view = audit.codistill_view(release, 2, expertise=1)
    means, counts = view(rows_of(outputs, model, x), y.numpy(), seeds.rng(3, seeds.PRIVACY, 1, 2, 0))
    np.testing.assert_allclose(means[1], released[0], rtol=1e-5, atol=1e-7)
    assert means[0].tolist() == [0.0] * means.shape[1]  # the other class is not shared
    n = int((y == 1).sum())
    assert counts.tolist() == [0.0, 0.5 * n if private else n]  # the denominator the peer knows


def test_peer_mean_refuses_a_noised_count():
    with pytest.raises(ValueError, match="public"):
        audit.peer_mean(np.ones((3, 2)), audit.Release(sigma=1.0), np.random.default_rng(0))


def test_attack_releases_the_trial_s_members_from_the_trial_s_stream(vectors):
    """Trial t's release is the view of exactly its members, drawn from (seed, PRIVACY, t, 0, ATTACK)
    after the per-class permutations: redrawn here, it gives the same vectors."""
    features, _, labels = vectors
    release = audit.Release(sigma=2.0, q=0.5, clip=1.0)
    seen = []

    def recording(rows, member_labels, generator):
        out = audit.class_means_view(release, 2)(rows, member_labels, generator)
        seen.append((rows, member_labels, out))
        return out

    audit.class_mean_attack(features, labels, members=[7, 3], reference=50, trials=2, seed=5, view=recording, clip=1.0)
    assert len(seen) == 2
    for t, (rows, member_labels, (means, counts)) in enumerate(seen):
        generator = seeds.rng(5, seeds.PRIVACY, t, 0, ATTACK)
        team = []
        for c, m in enumerate([7, 3]):
            pool = np.flatnonzero(labels == c)
            team.append(pool[generator.permutation(len(pool))][:m])
        team = np.concatenate(team)
        np.testing.assert_array_equal(rows, features[team])
        np.testing.assert_array_equal(member_labels, labels[team])
        again = audit.peer_class_means(features[team], labels[team], 2, release, generator, counts=True)
        np.testing.assert_array_equal(means, again[0])
        np.testing.assert_array_equal(counts, again[1])


# --- controls -----------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["codistill", "fedproto"])
def test_positive_control_one_member_is_the_mean(vectors, method):
    """m = 1 without noise: the release IS the member. The score of x is -|x - R|^2_s / 2 plus a
    constant, largest at x = R, so every member is above all the peer's reference images
    (calibrated score 1) and a non-member ties with it only if it is closer to R than all R_ref = 200
    reference images: probability 1 / (R_ref + 1) each, so AUC = 1 - k / (2 n) with k ~ Bin(n, 1/201);
    k <= 6 except with probability < 1e-4 (n = 200 per class)."""
    features, _, labels = vectors
    if method == "codistill":
        members, view = [1, 0], audit.codistill_view(audit.Release(), 2, expertise=0)
    else:
        members, view = [1, 1], audit.class_means_view(audit.Release(), 2)
    result = audit.class_mean_attack(features, labels, members=members, reference=200, trials=200, seed=0, view=view)
    n = result.candidates // 2
    assert n == 200 * sum(members)
    assert result.auc >= 1 - 6 * sum(members) / (2 * n)


@pytest.mark.parametrize("method", ["codistill", "fedproto"])
def test_negative_control_noise_drowns_the_members(vectors, method):
    """sigma = 10^4 (noise std 1000 per coordinate on a mean of 10 clipped rows, |row| <= 1): R does
    not depend on who is in the set, so members and non-members are exchangeable: the AUC is within
    4 standard deviations of 0.5. The same attack without noise is outside that band (power)."""
    features, _, labels = vectors
    if method == "codistill":
        members = [10, 0]

        def make(release):
            return audit.codistill_view(release, 2, expertise=0)

        noisy = audit.Release(sigma=1e4, noised_counts=False)
    else:
        members, noisy = [10, 10], audit.Release(sigma=1e4)

        def make(release):
            return audit.class_means_view(release, 2)

    kw = dict(members=members, reference=200, trials=40 if method == "codistill" else 20, seed=0)
    drowned = audit.class_mean_attack(features, labels, view=make(noisy), clip=1.0, **kw)
    band = 4 * null_sd(drowned.candidates // 2, drowned.candidates // 2)
    assert abs(drowned.auc - 0.5) <= band
    exact = audit.class_mean_attack(features, labels, view=make(audit.Release()), **kw)
    assert exact.auc > 0.5 + band


# --- FedAvg: the final model of a real run -------------------------------------------------------


def test_final_models_are_the_models_the_last_round_evaluated(tmp_path):
    """tools/final_models.py saves, per client, the model the run ended with: FedAvg's averaged one,
    the same on both clients, whose accuracy on the test split is the last round's test_acc."""
    result = mpiexec(
        2, str(ROOT / "tools" / "final_models.py"), str(tmp_path), str(QUICKSTART),
        "clients=2", "rounds=2", "algorithm=fedavg", timeout=240,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    plan_cfg = load_config(QUICKSTART, ["clients=2", "rounds=2", "algorithm=fedavg"])
    from mpicd.run.plan import prepare

    plan = prepare(plan_cfg)
    ds, cfg = plan.dataset, plan.config
    states = [torch.load(tmp_path / f"model_client{i}.pt") for i in range(2)]
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])
    model = build_model(cfg.model.name, ds.input_shape, ds.num_classes, cfg.model.feature_dim, cfg.model.hidden)
    model.load_state_dict(states[0])
    model.eval()
    with torch.no_grad():
        predicted = model(torch.from_numpy(ds.test.x)).argmax(dim=1).numpy()
    with h5py.File(tmp_path / "run.h5", "r") as f:
        recorded = f["metrics/test_acc"][-1]
    assert recorded.tolist() == [pytest.approx(float((predicted == ds.test.y).mean()), abs=1e-12)] * 2
