"""FedAMP's ring exchange: the same xi rows and cloud models as the Allgather without
holding all N models, (N - 1) 4P bytes p2p per round, and checkpoint/resume through it."""

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from mpicd.algorithms.fedamp import FedAMPParams, streaming_cloud
from mpicd.mpi.accounting import KINDS
from mpicd.results.reader import Results

from conftest import DRIVERS, ROOT, mpicd_run, mpiexec, require_pneumonia
from drivers.driver_settings import FEDAMP_RING_ROUNDS
from resume_steps import assert_same_run, start, stop_on_request, wait_for_checkpoint

ROUNDS = FEDAMP_RING_ROUNDS
KIND = {kind: i for i, kind in enumerate(KINDS)}  # the file's kind axis


def naive(models: np.ndarray, i: int, similarity: str, alpha=0.0, sigma=1.0, self_weight=0.5, scale=10.0):
    """Two passes over all N models, straight from the formulas: first every d_ij or cos_ij, then
    xi_i and u_i = sum_j xi_ij w_j (float64 Python sums, no fedamp code)."""
    w = models.astype(np.float64)
    n = len(w)
    others = [j for j in range(n) if j != i]
    xi = [0.0] * n
    if n == 1:
        xi = [1.0]
    elif similarity == "gaussian":  # xi_ij = alpha exp(-||w_i - w_j||^2 / sigma) / sigma, xi_ii = 1 - the rest
        for j in others:
            xi[j] = alpha * math.exp(-sum((a - b) ** 2 for a, b in zip(w[i], w[j])) / sigma) / sigma
        xi[i] = 1.0 - sum(xi[j] for j in others)
    else:  # xi_ii = self_weight, the others (1 - self_weight) softmax(scale cos(w_i, w_j))
        norm = [math.sqrt(sum(a * a for a in v)) for v in w]
        logits = {j: scale * sum(a * b for a, b in zip(w[i], w[j])) / (norm[i] * norm[j]) for j in others}
        top = max(logits.values())
        z = sum(math.exp(v - top) for v in logits.values())
        for j in others:
            xi[j] = (1.0 - self_weight) * math.exp(logits[j] - top) / z
        xi[i] = self_weight
    u = [sum(xi[j] * w[j][k] for j in range(n)) for k in range(w.shape[1])]
    return np.array(xi), np.array(u)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(1, 7),
    similarity=st.sampled_from(["gaussian", "cosine"]),
    order=st.sampled_from(["ring", "random", "ascending", "descending"]),
    scale=st.sampled_from([10.0, 2000.0]),
)
def test_streaming_accumulation_equals_the_two_pass_formulas(seed, n, similarity, order, scale):
    rng = np.random.default_rng(seed)
    p = 40
    models = (rng.normal(size=(n, p)) * rng.uniform(0.01, 0.1) + rng.normal(size=p)).astype(np.float32)
    i = int(rng.integers(n))
    sigma = 2 * p * float(np.var(models[:, 0])) + 1e-3 if n > 1 else 1.0  # on the scale of the distances
    alpha = sigma / n
    others = [(i - s) % n for s in range(1, n)]  # the ring's arrival order
    key = {j: float(models[j] @ models[i]) / float(np.linalg.norm(models[j])) for j in others}
    if order == "random":
        others = list(rng.permutation(others))
    elif order in ("ascending", "descending"):  # ascending: the running max grows at every arrival
        others = sorted(others, key=key.get, reverse=order == "descending")
    xi, u = streaming_cloud(models[i], i, n, [(j, models[j]) for j in others], similarity, alpha, sigma, 0.3, scale)
    want_xi, want_u = naive(models, i, similarity, alpha, sigma, 0.3, scale)
    assert u.dtype == np.float32 and np.isfinite(u).all()  # scale 2000: exp(2000) would overflow without the max
    np.testing.assert_allclose(xi, want_xi, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(u, want_u, rtol=1e-6, atol=1e-6)
    assert abs(xi.sum() - 1) < 1e-12


def test_streaming_accumulation_by_hand():
    """Three 2-vectors, worked out on paper: gaussian with d = 1 and 4, cosine with cos = 0 and 1."""
    own, a, b = np.array([1, 0], np.float32), np.array([0, 0], np.float32), np.array([1, 2], np.float32)
    xi, u = streaming_cloud(own, 0, 3, [(2, b), (1, a)], "gaussian", alpha=0.5, sigma=2.0, self_weight=0, scale=0)
    x1, x2 = 0.25 * math.exp(-0.5), 0.25 * math.exp(-2.0)  # alpha / sigma exp(-d / sigma)
    np.testing.assert_allclose(xi, [1 - x1 - x2, x1, x2])
    np.testing.assert_allclose(u, [1 - x1 - x2 + x2, 2 * x2], rtol=1e-6)
    own, a, b = np.array([1, 0], np.float32), np.array([0, 3], np.float32), np.array([2, 0], np.float32)
    xi, u = streaming_cloud(own, 0, 3, [(1, a), (2, b)], "cosine", 0, 1, self_weight=0.5, scale=math.log(3))
    np.testing.assert_allclose(xi, [0.5, 0.125, 0.375])  # softmax(log3 * [0, 1]) = [1/4, 3/4], times 1/2
    np.testing.assert_allclose(u, [0.5 + 0.375 * 2, 0.125 * 3], rtol=1e-6)


@pytest.fixture(scope="module", params=[2, 3, 5])
def ring_job(request, tmp_path_factory):
    """(ranks, folder) of one tests/drivers/fedamp_ring.py job under mpiexec -n ranks."""
    ranks = request.param
    out = tmp_path_factory.mktemp(f"fedamp_ring{ranks}")
    result = mpiexec(ranks, str(DRIVERS / "fedamp_ring.py"), str(out), timeout=120 + 60 * ranks)
    assert result.returncode == 0, f"fedamp ring driver failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
    return ranks, out


def dumps(out, similarity, exchange, ranks):
    return [dict(np.load(out / f"{similarity}_{exchange}_rank{r}.npz")) for r in range(ranks)]


@pytest.mark.parametrize("similarity", ["gaussian", "cosine"])
def test_ring_ends_every_round_like_the_allgather(ring_job, similarity):
    ranks, out = ring_job
    gathered, ringed = dumps(out, similarity, "allgather", ranks), dumps(out, similarity, "ring", ranks)
    for r in range(ROUNDS):
        for a, b in zip(gathered, ringed):
            for name in ("pre", "xi", "cloud"):
                np.testing.assert_allclose(
                    b[f"{name}_{r}"], a[f"{name}_{r}"], rtol=1e-5, atol=1e-8, err_msg=f"{name} round {r}"
                )


@pytest.mark.parametrize("similarity", ["gaussian", "cosine"])
def test_ring_rows_follow_the_formulas_from_every_rank_model(ring_job, similarity):
    """The ring got every w_j to the right place: xi_i and u_i from the N models each rank held."""
    ranks, out = ring_job
    ringed = dumps(out, similarity, "ring", ranks)
    defaults = FedAMPParams()
    for r in range(ROUNDS):
        models = np.stack([x[f"pre_{r}"] for x in ringed])
        p = models.shape[1]
        sigma = defaults.sigma * p  # per parameter in the config; alpha auto = sigma / N
        for i, x in enumerate(ringed):
            xi, u = naive(models, i, similarity, sigma / ranks, sigma, defaults.self_weight, defaults.cosine_scale)
            np.testing.assert_allclose(x[f"xi_{r}"], xi, rtol=1e-9, atol=1e-12)
            np.testing.assert_allclose(x[f"cloud_{r}"], u, rtol=1e-6, atol=1e-7)
            if similarity == "gaussian":
                assert 0 < x[f"xi_{r}"][i] < 1


def test_bytes_per_round(ring_job):
    """ring: (N - 1) 4P sent and received, kind p2p, nothing else; allgather keeps its 4P / 4NP."""
    ranks, out = ring_job
    p = len(np.load(out / "gaussian_ring_rank0.npz")["pre_0"])
    expect = {"ring": {"p2p": ((ranks - 1) * 4 * p,) * 2}, "allgather": {"allgather": (4 * p, 4 * ranks * p)}}
    for similarity in ("gaussian", "cosine"):
        for exchange, kinds in expect.items():
            for x in dumps(out, similarity, exchange, ranks):
                for r in range(ROUNDS):
                    for kind in KIND:
                        got = (int(x[f"sent_{kind}_{r}"]), int(x[f"recv_{kind}_{r}"]))
                        assert got == kinds.get(kind, (0, 0)), (similarity, exchange, kind, r)
    run = Results(out / "ring_run.h5")  # the CLI run records the same in the results file
    p = int(run.attrs["num_parameters"])
    assert run.kinds == tuple(KIND)
    for counts in (run.bytes_sent_by_kind, run.bytes_recv_by_kind):
        assert (counts[:, :, KIND["p2p"]] == (ranks - 1) * 4 * p).all()
        assert (np.delete(counts, KIND["p2p"], axis=2) == 0).all()


def test_ring_on_pneumonia_from_the_cli_stops_and_resumes_like_an_uninterrupted_run(tmp_path):
    """``mpicd run`` with exchange: ring on real X-rays; SIGUSR1 after round 1, --resume: the same
    metrics and bytes as an uninterrupted run (xi and the cloud model are carried state)."""
    data = require_pneumonia()
    config = ROOT / "configs" / "pneumoniamnist.yaml"
    overrides = [
        "rounds=5",
        "data.images_per_class=30",
        f"data.path={data}",
        "algorithm={name: fedamp, exchange: ring}",
    ]
    reference = tmp_path / "reference.h5"
    mpicd_run(4, config, reference, *overrides, timeout=400)
    whole = Results(reference)
    p = int(whole.attrs["num_parameters"])
    assert (whole.bytes_sent_by_kind[:, :, KIND["p2p"]] == 3 * 4 * p).all()
    assert (whole.bytes_recv_by_kind[:, :, KIND["allgather"]] == 0).all()
    out = tmp_path / "run.h5"
    proc = start(out, config, overrides)
    wait_for_checkpoint(proc, out, 1)
    stop_on_request(proc)
    assert Results(out).completed_rounds < 5
    resumed = mpicd_run(4, config, out, *overrides, "--resume", timeout=400)
    assert "resuming at round" in resumed.stdout
    assert_same_run(Results(out), whole)
