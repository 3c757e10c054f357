"""mpicd.privacy.dpsgd (Opacus DP-SGD on the project's LeNet, real PneumoniaMNIST images) and the
promise that the default path (privacy off) never imports opacus or dp_accounting."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F

from conftest import QUICKSTART, mpiexec, require_pneumonia
from mpicd.models import lenet, resnet18
from mpicd.privacy import accountant, dpsgd

pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing")  # images need no gradient

DELTA = 1e-5
N, BATCH = 64, 16  # q = 1/4, Opacus' expected batch size 16


@pytest.fixture(scope="module")
def real_batch():
    from mpicd.config import DataConfig
    from mpicd.data import load_dataset

    ds = load_dataset(DataConfig(name="medmnist", path=str(require_pneumonia())))
    return torch.from_numpy(ds.train.x[:N]), torch.from_numpy(ds.train.y[:N])


def fresh_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return lenet(1, 200, 2)


def private(model, lr, noise, clip, seed=0):
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    x, y = REAL
    return dpsgd.make_private(model, opt, x, y, batch_size=BATCH, noise_multiplier=noise, max_grad_norm=clip, seed=seed)


@pytest.fixture(autouse=True)
def _real(real_batch):
    global REAL
    REAL = real_batch


def one_step(model, xb, yb, lr, noise, clip, seed=0):
    p = private(model, lr, noise, clip, seed)
    p.optimizer.zero_grad()
    F.cross_entropy(p.module(xb), yb).backward()
    p.optimizer.step()
    return [t.detach().clone() for t in model.parameters()]


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


def test_dpsgd_noise_std_is_sigma_c_over_expected_batch():
    xb, yb = REAL[0][:8], REAL[1][:8]
    lr, clip, sigma = 1.0, 0.5, 2.0
    quiet = one_step(fresh_model(), xb, yb, lr, 0.0, clip)
    noisy = one_step(fresh_model(), xb, yb, lr, sigma, clip)
    noise = torch.cat([(a - b).reshape(-1) for a, b in zip(quiet, noisy)]).double()
    assert len(noise) > 20_000  # LeNet's parameters: the sample std is within ~1% of the truth
    assert noise.std().item() / (sigma * clip / BATCH) == pytest.approx(1.0, abs=0.03)


def test_dpsgd_epoch_deterministic_per_seed_and_accounted():
    def run(seed):
        model = fresh_model()
        p = private(model, 0.1, 1.0, 1.0, seed)
        steps = dpsgd.train_epoch(p)
        return [t.detach().clone() for t in model.parameters()], steps, p

    a, steps, p = run(3)
    b, _, _ = run(3)
    c, _, _ = run(4)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not all(torch.equal(x, y) for x, y in zip(a, c))
    assert steps == math.ceil(N / BATCH) and p.sample_rate == 0.25 and p.accountant.releases == steps
    eps = p.epsilon(DELTA)
    assert eps == pytest.approx(accountant.epsilon(0.25, 1.0, steps, DELTA))
    from opacus.accountants import RDPAccountant  # Opacus' own (looser) RDP bound, an independent method

    rdp = RDPAccountant()
    rdp.history = [(1.0, 0.25, steps)]
    assert 0.7 * rdp.get_epsilon(DELTA) < eps <= rdp.get_epsilon(DELTA)


def test_dpsgd_refuses_batchnorm_with_a_clear_error():
    model = resnet18(1, 2)
    with pytest.raises(ValueError, match="DP-SGD cannot train this model"):
        dpsgd.make_private(
            model, torch.optim.SGD(model.parameters(), lr=0.1), *REAL,
            batch_size=BATCH, noise_multiplier=1.0, max_grad_norm=1.0, seed=0,
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
