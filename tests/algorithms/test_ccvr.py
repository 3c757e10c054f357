"""CCVR (Luo et al., NeurIPS 2021): the class Gaussians and the recalibration worked by hand on a
two-class, two-client case, against FL-bench's ccvr.py on the same inputs (numbers in
tests/algorithms/data/label_skew_reference_part2.json, from tools/label_skew_reference_part2.py), the
payload's layout, the private release's noise and accounting, and the last round's bytes.

By hand (one-dimensional features):
* client A holds class 0 features {0, 2} and class 1 {1}; client B class 0 {4} and class 1 {3, 5}.
  Their sums: A (S, Q, n) = (2, 4, 2) and (1, 1, 1); B (4, 16, 1) and (8, 34, 2). The Allreduce
  gives class 0 (6, 20, 3): mean 2, covariance (20 - 3 * 4) / 2 = 4 (the unbiased variance of {0, 2, 4});
  class 1 (9, 35, 3): mean 3, covariance (35 - 27) / 2 = 4 (of {1, 3, 5}).
* recalibration of a zero head Linear(1, 2) on the virtual features x = 2 (class 0) and x = 3 (class 1),
  one batch, lr 1: both softmaxes are (1/2, 1/2), so the weight's gradient is the batch mean of
  (p - onehot) x = ((-1/2, 1/2) 2 + (1/2, -1/2) 3) / 2 = (1/4, -1/4) and the bias's 0: weight (-1/4, 1/4).
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from mpicd.algorithms import REGISTRY, Sizes, resolve
from mpicd.algorithms.fedavg import FedAvg
from mpicd.algorithms.ccvr import (
    CCVR,
    class_gaussians,
    class_moments,
    moments_multiplier,
    pack,
    recalibrate,
    unpack,
    virtual_features,
)
from mpicd.config.loading import load_config
from mpicd.results.reader import Results
from mpicd.results.verify import verify
from mpicd.run.client import Client
from mpicd.run.plan import prepare

from reference_layers import linear

from conftest import QUICKSTART, mpiexec

REF = json.loads((Path(__file__).parent / "data" / "label_skew_reference_part2.json").read_text())["references"][
    "flbench_ccvr"
]
IN_ORDER = SimpleNamespace(permutation=np.arange)  # the references' fixed order instead of a shuffle


def settings(lr: float, batch: int, epochs: int = 1):
    return SimpleNamespace(calibration_lr=lr, calibration_batch=batch, calibration_epochs=epochs)


def test_two_clients_two_classes_by_hand():
    a = class_moments(np.array([[0.0], [2.0], [1.0]]), np.array([0, 0, 1]), 2)
    b = class_moments(np.array([[4.0], [3.0], [5.0]]), np.array([0, 1, 1]), 2)
    np.testing.assert_array_equal(pack(*a), [2, 1, 4, 1, 2, 1])  # [S ; upper(Q) ; n], class by class
    np.testing.assert_array_equal(pack(*b), [4, 8, 16, 34, 1, 2])
    total = pack(*a) + pack(*b)  # what the Allreduce(SUM) gives
    (c0, mu0, cov0), (c1, mu1, cov1) = class_gaussians(*unpack(total, 2, 1))
    assert (c0, c1) == (0, 1)
    assert mu0.tolist() == [2.0] and cov0.tolist() == [[4.0]]
    assert mu1.tolist() == [3.0] and cov1.tolist() == [[4.0]]
    layer = linear([[0.0], [0.0]], [0.0, 0.0])
    recalibrate(layer, np.array([[2.0], [3.0]]), np.array([0, 1]), settings(1.0, 2), IN_ORDER)
    np.testing.assert_allclose(layer.weight.detach(), [[-0.25], [0.25]], rtol=1e-12)
    np.testing.assert_allclose(layer.bias.detach(), [0.0, 0.0], atol=1e-15)


@pytest.mark.parametrize("case", REF["cases"][:4], ids=lambda c: f"{c['case']}-batch{c['batch_size']}")
def test_means_recalibration_and_the_pooled_covariance_against_flbench(case):
    """Means and the recalibrated classifier equal FL-bench's; the covariance is the pooled unbiased one
    (np.cov of every client's features of the class together, computed by the reference script), which
    FL-bench's own formula is not: it weights biased client covariances as unbiased ones."""
    clients = case["inputs"]["clients"]
    k = len(case["global_means"])
    d = len(clients[0]["features"][0])
    total = sum(pack(*class_moments(np.array(c["features"]), np.array(c["labels"]), k)) for c in clients)
    gaussians = {c: (mu, cov) for c, mu, cov in class_gaussians(*unpack(total, k, d))}
    counts = np.sum([c["counts"] for c in clients], axis=0)
    assert sorted(gaussians) == [c for c in range(k) if counts[c] >= 2]
    for c, (mu, cov) in gaussians.items():
        np.testing.assert_allclose(mu, case["global_means"][c], rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(cov, case["pooled_unbiased_cov_not_their_code"][c], rtol=1e-10, atol=1e-13)
        if case["global_covs"][c] is not None:
            assert not np.allclose(cov, case["global_covs"][c], rtol=1e-3)  # FL-bench's differs
    # the recalibration on their fixed virtual features, in their order
    layer = linear(case["inputs"]["classifier_W0"], case["inputs"]["classifier_b0"])
    fixed = case["fixed_virtual"]
    recalibrate(layer, np.array(fixed["x"]), np.array(fixed["y"]), settings(case["lr"], case["batch_size"]), IN_ORDER)
    after = case["classifier_after"]
    np.testing.assert_allclose(layer.weight.detach(), after["classifier.weight"], rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(layer.bias.detach(), after["classifier.bias"], rtol=1e-10, atol=1e-13)


def test_saturated_features_keep_their_covariance_in_the_float64_payload():
    """tanh features near 1 (the LeNet's): variance 1e-8 against second moments of 1. The float64 payload
    gives the pooled covariance to 1e-6 of its largest entry; the same sums in float32 err by more than
    that entry."""
    rng = np.random.default_rng(0)
    clients = [np.tanh(4.5 + 0.3 * rng.standard_normal((50, 20))) for _ in range(8)]
    truth = np.cov(np.concatenate(clients).T)
    scale = np.abs(truth).max()
    assert scale < 1e-6
    payloads = [pack(*class_moments(x, np.zeros(len(x), dtype=np.int64), 1)) for x in clients]
    ((_, _, cov),) = class_gaussians(*unpack(sum(payloads), 1, 20))
    assert np.abs(cov - truth).max() < 1e-6 * scale
    single = sum(p.astype(np.float32) for p in payloads)
    ((_, _, rounded),) = class_gaussians(*unpack(single, 1, 20))
    assert np.abs(rounded - truth).max() > scale


def test_virtual_features_follow_their_gaussian():
    cov = np.array([[4.0, 1.0], [1.0, 1.0]])
    ((c, mu, got),) = class_gaussians(
        np.array([[2.0, -2.0]]) * 5, np.array([cov * 4 + 5 * np.outer([2, -2], [2, -2])]), np.array([5.0])
    )
    np.testing.assert_allclose(got, cov, rtol=1e-12)
    x, y = virtual_features([(c, mu, got)], 20000, np.random.default_rng(0))
    assert x.shape == (20000, 2) and (y == 0).all()
    np.testing.assert_allclose(x.mean(axis=0), [2.0, -2.0], atol=0.05)
    np.testing.assert_allclose(np.cov(x.T), cov, atol=0.1)
    # a covariance with a negative eigenvalue (noise) draws from its nearest PSD matrix, no NaN
    x, _ = virtual_features([(0, np.zeros(2), np.array([[1.0, 0.0], [0.0, -1.0]]))], 100, np.random.default_rng(0))
    assert np.isfinite(x).all() and np.allclose(x[:, 1], 0.0)


def test_the_release_multiplier_counts_three_blocks():
    assert moments_multiplier(2.0, True) == pytest.approx(2.0 / math.sqrt(3))
    assert moments_multiplier(2.0, False) == pytest.approx(2.0 / math.sqrt(2))


def test_bytes_every_round_and_in_the_last():
    lenet = Sizes(N=4, C=2, D=200, P=44_574)
    fedavg = 4 * (44_574 + 1)
    stats = 8 * (2 * 200 + 2 * 200 * 201 // 2 + 2)  # [S ; upper(Q) ; n], float64
    params = resolve({"name": "ccvr"})[1]
    assert CCVR.bytes_per_round(lenet, params)["allreduce"] == (fedavg, fedavg)
    assert CCVR.bytes_per_round(lenet, params, last=True)["allreduce"] == (fedavg + stats, fedavg + stats)
    assert stats == 324_816
    exact = resolve({"name": "ccvr", "reduction": "exact"})[1]
    assert CCVR.bytes_per_round(lenet, exact, last=True)["allreduce"][0] == 8 + 8 * (44_574 + 1) + 8 + stats
    assert REGISTRY["ccvr"].payload_for(params) == REGISTRY["fedavg"].payload_for(resolve({"name": "fedavg"})[1])


def private_client(*privacy: str) -> Client:
    plan = prepare(load_config(QUICKSTART, ["clients=4", "device=cpu", "algorithm=ccvr", "rounds=3", *privacy]))
    client = Client(plan, SimpleNamespace(rank=1, size=4), "cpu")
    client.algorithm.ctx.privacy.begin("0" * 16, None)  # a run's nonce (run_rounds gives the run id); no journal
    return client


def exact_moments(c: Client, clip: float) -> np.ndarray:
    """The client's statistics recomputed here: every training image (q = 1), eval mode, clipped to ``clip``."""
    c.model.eval()
    with torch.no_grad():
        rows = c.model.features(c.train_x).double().numpy()
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    rows = rows * np.minimum(1.0, clip / np.maximum(norms, 1e-300))
    return pack(*class_moments(rows, c.train_y.numpy(), 2))


def test_the_private_release_is_clipped_noised_and_charged_once():
    """sigma 2, C 0.5: N(0, 1) on every feature sum, N(0, 0.5^2) on every entry of upper(Q), N(0, 2^2) on
    each count (stds measured over 40 releases); a record at the clip moves the blocks by C, C^2 and 1,
    so at the measured stds the release's sensitivity over std is sqrt 3 / sigma: the multiplier
    charged, once per release (q 1); sigma 0 releases the exact clipped sums."""
    c = private_client("privacy={noise_multiplier: 2.0, clip: 0.5}")
    exact = exact_moments(c, 0.5)
    d, t = 200, 200 * 201 // 2
    noise = np.array([c.algorithm.moments(r) - exact for r in range(40)])
    stds = np.std(noise[:, : 2 * d]), np.std(noise[:, 2 * d : 2 * (d + t)]), np.std(noise[:, -2:])
    assert stds[0] == pytest.approx(1.0, rel=0.03) and stds[1] == pytest.approx(0.5, rel=0.01)
    assert stds[2] == pytest.approx(2.0, rel=0.2)
    worst = math.sqrt((0.5 / stds[0]) ** 2 + (0.5**2 / stds[1]) ** 2 + (1 / stds[2]) ** 2)
    assert 1 / worst == pytest.approx(moments_multiplier(2.0, True), rel=0.1)
    history = c.algorithm.ctx.privacy.accountant.history
    assert history == [(1.0, pytest.approx(2.0 / math.sqrt(3)), 40)]
    plain = private_client("privacy={noise_multiplier: 0.0, clip: 0.5, counts: public}")
    np.testing.assert_allclose(plain.algorithm.moments(2), exact_moments(plain, 0.5), rtol=1e-5, atol=1e-5)


def epsilon_direct(events: list[tuple[float, float, int]], delta: float) -> float:
    """dp-accounting's PLD accountant called directly (not through mpicd.privacy.accountant)."""
    import dp_accounting
    from dp_accounting.pld import pld_privacy_accountant

    ledger = pld_privacy_accountant.PLDAccountant(
        neighboring_relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
    )
    for q, multiplier, count in events:
        gaussian = dp_accounting.GaussianDpEvent(multiplier)
        ledger.compose(gaussian if q == 1 else dp_accounting.PoissonSampledDpEvent(q, gaussian), count)
    return float(ledger.get_epsilon(delta))


def test_ccvr_with_privacy_under_mpiexec(tmp_path):
    """DP-SGD rounds (as FedAvg's) and, in the last round, the statistics' release: /metrics/epsilon is
    the steps' and then one Gaussian at sigma / sqrt 3, accounted by dp-accounting directly; the file
    verifies (its last round's bytes are FedAvg's plus the statistics')."""
    out = tmp_path / "ccvr.h5"
    result = mpiexec(
        2, "-m", "mpicd", "run", str(QUICKSTART), "clients=2", "rounds=2", "algorithm=ccvr",
        "privacy={noise_multiplier: 2.0}", "--out", str(out), timeout=400,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    res = Results(out)
    verdict = verify(out)
    assert verdict.ok, verdict.text()
    assert float(res.attrs["privacy_moments_multiplier"]) == pytest.approx(2.0 / math.sqrt(3))
    n = res.partition["train_counts"].sum(axis=1)
    for c in range(2):
        q = 1 / math.ceil(n[c] / 32)
        steps = int(1 / q)  # Opacus' steps per epoch, one local epoch
        eps = res.metrics["epsilon"][:, c]
        assert eps[0] == pytest.approx(epsilon_direct([(q, 2.0, steps)], 1e-5), rel=1e-9)
        last = epsilon_direct([(q, 2.0, 2 * steps), (1.0, 2.0 / math.sqrt(3), 1)], 1e-5)
        assert eps[1] == pytest.approx(last, rel=1e-9)
        assert eps[1] > epsilon_direct([(q, 2.0, 2 * steps)], 1e-5)  # the release is charged


def test_the_last_round_recalibrates_from_the_pooled_gaussians():
    """One client alone (a comm whose Allreduce returns its input): no statistics before the last
    round; in it, the Gaussians of its own eval-mode features (np.mean, np.cov here) and a new head."""
    plan = prepare(load_config(QUICKSTART, ["clients=4", "device=cpu", "algorithm=ccvr", "rounds=3"]))
    comm = SimpleNamespace(rank=1, size=4, allreduce_sum=lambda array, channel: array.copy())
    c = Client(plan, comm, "cpu")
    c.local_epochs(0)
    c.algorithm.after_epoch(1)
    assert c.algorithm.gaussians is None
    state = copy.deepcopy(c.model.state_dict())
    FedAvg.after_round([c.algorithm], 2)  # the last round's average alone
    head = [p.detach().clone() for p in c.model.head.parameters()]
    c.model.load_state_dict(state)
    c.algorithm.after_epoch(2)
    c.model.eval()
    with torch.no_grad():
        rows = c.model.features(c.train_x).double().numpy()
    labels = c.train_y.numpy()
    assert [g[0] for g in c.algorithm.gaussians] == [0, 1]
    for cls, mu, cov in c.algorithm.gaussians:
        np.testing.assert_allclose(mu, rows[labels == cls].mean(axis=0), rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(cov, np.cov(rows[labels == cls].T), rtol=1e-6, atol=1e-10)
    assert not any(torch.equal(a, b) for a, b in zip(head, c.model.head.parameters()))  # recalibrated
