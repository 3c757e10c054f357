"""mpicd.privacy.dpsgd (Opacus DP-SGD on the project's LeNet, real PneumoniaMNIST images) and the
promise that the default path (privacy off) never imports opacus or dp_accounting."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import QUICKSTART, mpiexec, require_pneumonia
from mpicd.core import seeds
from mpicd.models.networks import lenet, resnet18
from mpicd.privacy import accountant, dpsgd
from mpicd.privacy.secret import new_key, SecretStream
from mpicd.privacy.streams import DPSGD_NOISE, DPSGD_SAMPLING

pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing")  # images need no gradient

DELTA = 1e-5
NONCE = bytes(8)  # a run's nonce
N, BATCH = 64, 16  # q = 1/4, Opacus' expected batch size 16


@pytest.fixture(scope="module")
def real_batch():
    from mpicd.config.sections import DataConfig
    from mpicd.data import load_dataset

    ds = load_dataset(DataConfig(name="medmnist", path=str(require_pneumonia())))
    return torch.from_numpy(ds.train.x[:N]), torch.from_numpy(ds.train.y[:N])


def fresh_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return lenet(1, 200, 2)


def seeded(seed: int, use: int):
    """The stream privacy.noise: seeded gives client 0 in round 0 (mpicd.privacy.streams)."""
    return seeds.rng(seed, seeds.PRIVACY, 0, 0, use)


def private(model, lr, noise, clip, seed=0, sampling=None, noise_stream=None, batch_size=BATCH, data=None):
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    x, y = REAL if data is None else data
    return dpsgd.make_private(
        model, opt, x, y, batch_size=batch_size, noise_multiplier=noise, max_grad_norm=clip,
        sampling=seeded(seed, DPSGD_SAMPLING) if sampling is None else sampling,
        noise=seeded(seed, DPSGD_NOISE) if noise_stream is None else noise_stream,
    )  # fmt: skip


@pytest.fixture
def _real(real_batch):
    global REAL
    REAL = real_batch


def one_step(model, xb, yb, lr, noise, clip, seed=0):
    p = private(model, lr, noise, clip, seed)
    p.optimizer.zero_grad()
    F.cross_entropy(p.module(xb), yb).backward()
    p.optimizer.step()
    return [t.detach().clone() for t in model.parameters()]


@pytest.mark.usefixtures("_real")  # real PneumoniaMNIST images
def test_dpsgd_step_is_the_naive_clipped_per_sample_sum():
    """Noise off: one step = lr * sum_i clip(g_i, C) / (q n), g_i each sample's gradient (a naive loop)."""
    xb, yb = REAL[0][:12], REAL[1][:12]
    lr, clip = 0.5, 0.05  # C small enough that every sample's gradient is clipped
    model = fresh_model()
    start = copy.deepcopy(model)
    got = one_step(model, xb, yb, lr, 0.0, clip)
    total = [torch.zeros_like(p) for p in start.parameters()]
    norms = []
    for i in range(len(yb)):
        start.zero_grad()
        F.cross_entropy(start(xb[i : i + 1]), yb[i : i + 1]).backward()
        grads = [p.grad.detach().clone() for p in start.parameters()]
        norm = math.sqrt(sum(float((g**2).sum()) for g in grads))
        norms.append(norm)
        for t, g in zip(total, grads):
            t += g * min(1.0, clip / norm)
    assert min(norms) > clip
    expected_batch = N * (1 / math.ceil(N / BATCH))
    for p0, t, p1 in zip(start.parameters(), total, got):
        torch.testing.assert_close(p1, p0.detach() - lr * t / expected_batch, rtol=1e-4, atol=1e-7)


@pytest.mark.usefixtures("_real")  # real PneumoniaMNIST images
def test_dpsgd_noise_std_is_sigma_c_over_expected_batch():
    xb, yb = REAL[0][:8], REAL[1][:8]
    lr, clip, sigma = 1.0, 0.5, 2.0
    quiet = one_step(fresh_model(), xb, yb, lr, 0.0, clip)
    noisy = one_step(fresh_model(), xb, yb, lr, sigma, clip)
    noise = torch.cat([(a - b).reshape(-1) for a, b in zip(quiet, noisy)]).double()
    assert len(noise) > 20_000  # LeNet's parameters: the sample std is within ~1% of the truth
    assert noise.std().item() / (sigma * clip / BATCH) == pytest.approx(1.0, abs=0.03)


@pytest.mark.usefixtures("_real")  # real PneumoniaMNIST images
def test_dpsgd_epoch_deterministic_per_stream_and_accounted():
    def run(seed=None, key=None):
        model = fresh_model()
        if key is None:
            p = private(model, 0.1, 1.0, 1.0, seed)
        else:
            p = private(
                model,
                0.1,
                1.0,
                1.0,
                sampling=SecretStream(key, NONCE, 0, 0, 1),
                noise_stream=SecretStream(key, NONCE, 0, 0, 2),
            )
        steps = dpsgd.train_epoch(p)
        return [t.detach().clone() for t in model.parameters()], steps, p

    a, steps, p = run(3)
    b, _, _ = run(3)
    c, _, _ = run(4)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not all(torch.equal(x, y) for x, y in zip(a, c))
    key = new_key()
    d, _, _ = run(key=key)
    e, _, _ = run(key=key)
    f, _, _ = run(key=new_key())
    assert all(torch.equal(x, y) for x, y in zip(d, e)) and not all(torch.equal(x, y) for x, y in zip(d, f))
    assert steps == math.ceil(N / BATCH) and p.sample_rate == 0.25 and p.accountant.releases == steps
    eps = p.epsilon(DELTA)
    assert eps == pytest.approx(accountant.epsilon(0.25, 1.0, steps, DELTA))
    from opacus.accountants import RDPAccountant  # Opacus' own (looser) RDP bound, an independent method

    rdp = RDPAccountant()
    rdp.history = [(1.0, 0.25, steps)]
    assert 0.7 * rdp.get_epsilon(DELTA) < eps <= rdp.get_epsilon(DELTA)


def test_dpsgd_batches_are_poisson_samples_drawn_from_the_sampling_stream():
    """Batch t of an epoch holds image i iff the t-th block of n uniforms of the stream has u_i < q:
    redrawn here from (seed, PRIVACY, 0, 0, DPSGD_SAMPLING) with numpy; sizes vary, as Poisson's do."""
    x = torch.arange(N, dtype=torch.float32)[:, None].repeat(1, 4)  # each row names its index
    p = private(torch.nn.Linear(4, 2), 0.1, 1.0, 1.0, seed=7, data=(x, torch.zeros(N, dtype=torch.long)))
    rng = seeded(7, DPSGD_SAMPLING)
    got = [xb[:, 0].long().tolist() for xb, _ in p.batches()]
    expected = [np.flatnonzero(rng.random(N) < 0.25).tolist() for _ in range(4)]
    assert got == expected and len({len(b) for b in got}) > 1


class _Nothing:
    """A sampling stream whose uniforms are all 0.999...: no image is ever taken (an empty batch)."""

    def random(self, n):
        return np.full(n, 1 - 2**-53)


def test_an_empty_poisson_batch_is_a_noise_only_step_and_charged():
    """No image sampled: the step is lr * N(0, (sigma C)^2) / (q n) on every parameter, the noise
    redrawn by hand from the noise stream (parameter order, normal(0, sigma C, shape)); it is counted."""
    lr, clip, sigma = 0.5, 1.0, 2.0
    model = fresh_model()
    start = [t.detach().clone() for t in model.parameters()]
    images = (torch.zeros(N, 1, 28, 28), torch.zeros(N, dtype=torch.long))  # none is ever sampled
    p = private(model, lr, sigma, clip, seed=5, sampling=_Nothing(), data=images)
    steps = dpsgd.train_epoch(p)
    assert steps == 4 and p.noised_steps == 4 and p.accountant.history == [(0.25, 2.0, 4)]
    rng = seeded(5, DPSGD_NOISE)
    expected = [t.double() for t in start]
    for _ in range(4):
        for i, t in enumerate(start):
            expected[i] = (
                expected[i] - lr * torch.from_numpy(rng.normal(0.0, sigma * clip, size=tuple(t.shape))) / BATCH
            )
    for got, want in zip(model.parameters(), expected):
        torch.testing.assert_close(got.detach().double(), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("n, batch", [(93, 1), (117, 1), (64, 16)])
def test_dpsgd_takes_and_charges_opacus_steps(n, batch):
    """Opacus takes int(1 / q) steps at q = 1 / ceil(n / batch), one fewer than ceil(n / batch) where
    floating point rounds 1 / (1 / k) down (n = 93, 117): the charge is the steps taken."""
    k = math.ceil(n / batch)
    assert dpsgd.schedule(n, batch) == (1 / k, int(1 / (1 / k)))
    x, y = torch.randn(n, 4), torch.arange(n) % 2
    p = private(torch.nn.Linear(4, 2), 0.1, 1.0, 1.0, data=(x, y), batch_size=batch)
    steps = dpsgd.train_epoch(p)
    assert steps == p.noised_steps == int(1 / (1 / k)) == (k - 1 if n in (93, 117) else k)
    assert p.accountant.history == [(1 / k, 1.0, steps)]
    p.check_charged(steps)
    with pytest.raises(RuntimeError, match="noised steps"):
        p.check_charged(k if steps != k else k + 1)


@pytest.mark.usefixtures("_real")  # real PneumoniaMNIST images
def test_dpsgd_refuses_batchnorm_with_a_clear_error():
    model = resnet18(1, 2)
    with pytest.raises(ValueError, match="DP-SGD cannot train this model"):
        dpsgd.make_private(
            model, torch.optim.SGD(model.parameters(), lr=0.1), *REAL,
            batch_size=BATCH, noise_multiplier=1.0, max_grad_norm=1.0,
            sampling=seeded(0, DPSGD_SAMPLING), noise=seeded(0, DPSGD_NOISE),
        )  # fmt: skip


CLEAN_RUN = """
import sys
from pathlib import Path
from mpi4py import MPI
from mpicd import cli
from mpicd.privacy import accountant, audit, clip, dpsgd, gaussian, release, sampling, streams
code = cli.main(["run", sys.argv[1], "rounds=1", "clients=2", "--out", sys.argv[2]])
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("opacus", "dp_accounting"))
Path(sys.argv[3], f"rank{MPI.COMM_WORLD.Get_rank()}.txt").write_text(f"CODE {code} HEAVY {heavy}")
"""


def test_default_path_never_imports_opacus_or_dp_accounting(tmp_path):
    result = mpiexec(2, "-c", CLEAN_RUN, str(QUICKSTART), str(tmp_path / "run.h5"), str(tmp_path), timeout=180)
    assert result.returncode == 0, result.stderr
    lines = [(tmp_path / f"rank{r}.txt").read_text() for r in range(2)]  # one file a rank: stdout interleaves
    assert lines == ["CODE 0 HEAVY []"] * 2, result.stdout
    assert (tmp_path / "run.h5").is_file()
