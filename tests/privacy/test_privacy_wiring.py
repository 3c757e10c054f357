"""Privacy wired into runs: the ``privacy:`` section, the private releases of
co-distillation, FedProto and FedDistill, epsilon per round and client in the results file, the
budget, resume, and what crosses MPI.

Expected values are derived independently: epsilon by calling dp-accounting directly on the
releases counted from the file's own teacher assignment; the noise of a release by redrawing it
from the documented stream with numpy (std sigma * C by the formula); clipping from the norms.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from privacy_context import context, NONCE, private_settings
from conftest import DRIVERS, QUICKSTART, mpicd_run, mpiexec
from mpicd.algorithms import resolve
from mpicd.algorithms.aggregate import private_class_payload
from mpicd.algorithms.codistill import CoDistillation
from mpicd.config.loading import load_config
from mpicd.config.sections import ConfigError, to_mapping
from mpicd.core import seeds
from mpicd.privacy.budget import Budget, settings
from mpicd.privacy.secret import SecretStream
from mpicd.results.reader import Results
from mpicd.run.plan import prepare

PRIVATE = "privacy={epsilon: 4, noise_multiplier: 2.0, sample_rate: 0.5}"
RUN = ("clients=3", "rounds=6", PRIVATE, "eval.train_split=true")


def epsilon_direct(q: float, multiplier: float, releases: int, delta: float) -> float:
    """dp-accounting's PLD accountant called directly (not through mpicd.privacy.accountant)."""
    import dp_accounting
    from dp_accounting.pld import pld_privacy_accountant

    if releases == 0:
        return 0.0
    ledger = pld_privacy_accountant.PLDAccountant(
        neighboring_relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
    )
    ledger.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(multiplier)), releases)
    return float(ledger.get_epsilon(delta))


# --- config ---------------------------------------------------------------------------------


def test_privacy_is_off_by_default_and_absent_from_the_resolved_config():
    cfg = load_config(QUICKSTART)
    assert cfg.privacy is None and "privacy" not in to_mapping(cfg)
    assert "privacy" not in prepare(cfg).resolved_config


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["privacy={}"], "privacy.noise_multiplier"),
        (["privacy={noise_multiplier: 0, epsilon: 1}"], "privacy.noise_multiplier"),
        (["privacy={noise_multiplier: 1, clip: 0}"], "privacy.clip"),
        (["privacy={noise_multiplier: 1, sample_rate: 1.5}"], "privacy.sample_rate"),
        (["privacy={noise_multiplier: 1, counts: maybe}"], "privacy.counts"),
        (["privacy={epsilon: 4}", "algorithm={name: fedavg}"], "privacy.noise_multiplier"),
        (["privacy={noise_multiplier: 1, sample_rate: 0.5}", "algorithm={name: fedavg}"], "privacy.sample_rate"),
        (["privacy={noise_multiplier: 1}", "algorithm={name: fedavg}", "train.loss=balanced"], "train.loss"),
        (
            ["privacy={noise_multiplier: 1}", "algorithm={name: fedavg}", "train.optimizer_state=reset"],
            "train.optimizer_state",
        ),
        (["privacy={noise_multiplier: 1}", "algorithm={name: fedamp}", "model.name=resnet18"], "model.name"),
        (["privacy={noise_multiplier: 1}", "algorithm={name: centralized}"], "privacy"),
        (["privacy={noise_multiplier: 1}", "algorithm={name: codistill, k: 5}"], "algorithm.k"),
        (["privacy={noise_multiplier: 1}", "algorithm={name: codistill, classes: all}"], "algorithm.classes"),
        (["privacy={noise_multiplier: 1}", "algorithm={name: codistill, teacher_per: batch}"], "algorithm.teacher_per"),
        (["privacy={noise_multiplier: 1}", "algorithm={name: fedproto, weighting: equal}"], "algorithm.weighting"),
        (["privacy={epsilon: 1000, delta: 0.5}"], "privacy.epsilon"),  # sigma below the accountant's floor
    ],
)
def test_bad_combinations_are_one_config_error_naming_the_key(overrides, key):
    with pytest.raises(ConfigError) as err:
        prepare(load_config(QUICKSTART, overrides))
    assert err.value.key == key, str(err.value)


def test_derived_sigma_keeps_every_planned_release_within_the_budget():
    cfg = load_config(QUICKSTART, ["rounds=20", "privacy={epsilon: 4, sample_rate: 0.1}"])
    s = settings(cfg.privacy, cfg.rounds)
    assert s.noised_counts and math.isclose(s.multiplier, s.sigma / math.sqrt(2))
    assert epsilon_direct(0.1, s.multiplier, 20, 1e-5) <= 4.0
    assert epsilon_direct(0.1, s.multiplier - 0.01, 20, 1e-5) > 4.0  # and it is the smallest (within 1e-2)


def test_a_codistill_budget_that_can_run_out_is_refused_with_several_clients_per_rank():
    from mpicd.run.loop import refuse_with_several_per_rank

    plan = prepare(load_config(QUICKSTART, ["clients=4", "clients_per_rank=balanced", PRIVATE]))
    with pytest.raises(ConfigError) as err:
        refuse_with_several_per_rank(plan, 2)
    assert err.value.key == "privacy.epsilon"
    refuse_with_several_per_rank(plan, 4)  # one client per rank: a spent teacher sends an empty message
    derived = prepare(load_config(QUICKSTART, ["clients=4", "clients_per_rank=balanced", "privacy={epsilon: 4}"]))
    refuse_with_several_per_rank(derived, 2)  # sigma derived for every round: the budget never runs out


# --- one release, redrawn by hand ------------------------------------------------------------


def redrawn(noise: str, ctx, round_index: int):
    """The release stream of client 1 by hand: seeded, numpy's (seed 3, PRIVACY, client, round,
    RELEASE); secret, SHAKE-256 of the client's key and the run's nonce (mpicd.privacy.secret)."""
    if noise == "seeded":
        return seeds.rng(3, seeds.PRIVACY, 1, round_index, 0)
    return SecretStream(ctx.privacy.key, bytes.fromhex(NONCE), 1, round_index, 0)


# counts: public with secret noise is refused (exact class sizes under zero-out: tests/mpi/test_channels.py)
@pytest.mark.parametrize("noise, counts", [("secret", "noised"), ("seeded", "noised"), ("seeded", "public")])
def test_class_release_is_the_clipped_sum_plus_noise_of_std_sigma_c(counts, noise):
    s = private_settings(clip=0.5, counts=counts, noise=noise)
    ctx, model, x, y = context(s)
    payload = private_class_payload(ctx, model.features, 8, round_index=4)
    # by hand: the release stream of (client, round), n uniforms then the normals
    rng = redrawn(noise, ctx, 4)
    taken = np.flatnonzero(rng.random(len(y)) < 0.5)
    with torch.no_grad():
        model.eval()
        rows = model.features(x[taken]).double().numpy()
    norms = np.linalg.norm(rows, axis=1)
    assert (norms > 0.5).any()  # the bound binds
    clipped = rows * np.minimum(1.0, 0.5 / norms)[:, None]
    assert np.all(np.linalg.norm(clipped, axis=1) <= 0.5 + 1e-12)
    sums = np.zeros((2, 8))
    np.add.at(sums, y.numpy()[taken], clipped)
    noise = rng.normal(0.0, 3.0 * 0.5, size=(2, 8))  # sigma * C
    expected_counts = np.bincount(y.numpy()[taken], minlength=2) + rng.normal(0.0, 3.0, size=2)
    if counts == "public":
        expected_counts = 0.5 * np.bincount(y.numpy(), minlength=2)
    expected = np.concatenate([(sums + noise).ravel(), expected_counts]).astype(np.float32)
    np.testing.assert_allclose(payload, expected, rtol=1e-6, atol=1e-6)
    assert ctx.privacy.accountant.history == [(0.5, s.multiplier, 1)]


# counts: public with secret noise is refused (exact class sizes under zero-out: tests/mpi/test_channels.py)
@pytest.mark.parametrize("noise, counts", [("secret", "noised"), ("seeded", "noised"), ("seeded", "public")])
def test_codistill_r_is_the_noised_clipped_sum_over_its_count(counts, noise):
    """R = (clipped sum + N(0, (sigma C)^2)) / count: public, q n; noised, max(sample size + N(0,
    sigma^2), 1), the count's normal drawn after the sum's."""
    s = private_settings(clip=0.25, counts=counts, noise=noise)
    ctx, model, x, y = context(s)
    algorithm = CoDistillation(resolve({"name": "codistill"})[1], ctx)
    released = algorithm.class_means(round_index=2)
    rng = redrawn(noise, ctx, 2)
    index = np.flatnonzero(y.numpy() == 1)  # client 1's expertise class
    taken = index[rng.random(len(index)) < 0.5]
    with torch.no_grad():
        rows = model.features(x[taken]).double().numpy()
    clipped = rows * np.minimum(1.0, 0.25 / np.linalg.norm(rows, axis=1))[:, None]
    total = clipped.sum(axis=0) + rng.normal(0.0, 0.75, size=8)
    count = 0.5 * len(index) if counts == "public" else max(len(taken) + rng.normal(0.0, 3.0), 1.0)
    assert counts == "public" or count != len(taken)
    np.testing.assert_allclose(released[0], (total / count).astype(np.float32), rtol=1e-6, atol=1e-7)


def test_a_spent_budget_refuses_and_stays_refused():
    s = private_settings(epsilon=3.0)
    budget = Budget(s, 0, 0)
    granted = [budget.request(r) for r in range(8)]
    first = granted.index(False)
    assert all(granted[:first]) and not any(granted[first:]) and budget.stopped_at == first
    assert budget.epsilon <= 3.0 < epsilon_direct(0.5, s.multiplier, first + 1, 1e-5)
    assert math.isclose(budget.epsilon, epsilon_direct(0.5, s.multiplier, first, 1e-5), rel_tol=1e-9)


# --- runs -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    """A privacy.key_dir: the uninterrupted and the resumed runs draw from the same secret keys."""
    return tmp_path_factory.mktemp("keys") / "site"


@pytest.fixture(scope="module")
def private_run(tmp_path_factory, keys):
    out = tmp_path_factory.mktemp("private") / "run.h5"
    mpicd_run(3, QUICKSTART, out, *RUN, f"privacy.key_dir={keys}", timeout=400)
    return out


def test_keys_stay_at_the_site_and_two_private_runs_differ(private_run, keys, tmp_path):
    """The key files are 0600 and their keys are nowhere in the results file; a run with fresh keys
    (no key_dir), same config and seed, trains on other noise."""
    import stat

    files = sorted(keys.iterdir())
    assert [f.name for f in files] == [f"client-{c}.key" for c in range(3)]
    assert stat.S_IMODE(keys.stat().st_mode) == 0o700
    data = private_run.read_bytes()
    for f in files:
        assert stat.S_IMODE(f.stat().st_mode) == 0o600
        key = bytes.fromhex(f.read_text())
        assert len(key) == 32 and key not in data and key.hex().encode() not in data
    assert Results(private_run).attrs["privacy_noise"].startswith("secret")
    other = tmp_path / "fresh.h5"
    mpicd_run(3, QUICKSTART, other, *RUN, timeout=400)
    a, b = Results(private_run).metrics, Results(other).metrics
    assert any(not np.array_equal(a[name], b[name]) for name in ("test_acc", "recall", "balanced_acc"))


def test_epsilon_per_round_equals_dp_accounting_and_stops_at_the_budget(private_run):
    res = Results(private_run)
    eps, stopped = res.metrics["epsilon"], res.metrics["privacy_stopped"]
    multiplier = float(res.attrs["privacy_release_multiplier"])
    assert math.isclose(multiplier, 2.0 / math.sqrt(2))
    assert (np.diff(eps, axis=0) >= 0).all() and (eps <= 4.0).all()
    assert stopped[-1].any(), "the budget of 4 is spent within 6 rounds at sigma 2, q 0.5"
    for c in range(3):
        releases = 0
        for r in range(res.completed_rounds):
            teaches = bool((res.teacher[r] == c).any())
            if teaches and not stopped[r, c]:
                releases += 1
            assert math.isclose(eps[r, c], epsilon_direct(0.5, multiplier, releases, 1e-5), rel_tol=1e-9), (r, c)
            if stopped[r, c]:  # from then on nothing leaves it
                assert res.metrics["bytes_sent"][r, c] == 0
        first = np.flatnonzero(stopped[:, c])
        if len(first):  # the refused release would have exceeded 4
            assert (stopped[first[0] :, c] == 1).all()
            assert epsilon_direct(0.5, multiplier, releases + 1, 1e-5) > 4.0


def test_the_private_file_verifies(private_run):
    from mpicd.results.verify import verify

    verdict = verify(private_run)
    assert verdict.ok, verdict.text()


def repeating(path) -> tuple[str, ...]:
    """RUN naming the nonce of the run in ``path`` (privacy.nonce): a new run at the same key folder
    that repeats its noise, so that its file can equal the other's (a run's own nonce is its id)."""
    return (*RUN, f"privacy.nonce='{Results(path).attrs['privacy_nonce']}'")


def test_a_lost_checkpoint_never_starts_a_private_run_again_and_every_release_is_counted(private_run, keys, tmp_path):
    """Killed in round 4 and resumed, the attacker's way: the new run repeats the uninterrupted run's
    nonce (privacy.nonce) so the two can be compared. A fresh key folder for the resume is refused
    in one line naming both keys' files, and nothing is made there. Client 1's checkpoints zero-filled, every one of them: exit 2
    naming the newest, nothing sent again (the rows and journals as they were). The older one back:
    the run resumes from it (not from round 1), computes round 3 again to
    the bytes its journals say left, and ends equal to the uninterrupted run, epsilon included."""
    from mpicd.privacy.journal import read
    from mpicd.results.verify import verify

    out = tmp_path / "run.h5"
    again = repeating(private_run)
    failed = mpiexec(
        3, "-m", "mpicd", "run", str(QUICKSTART), *again, f"privacy.key_dir={keys}", "debug.fail_rank=1",
        "debug.fail_round=3", "--out", str(out), timeout=400,
    )  # fmt: skip
    assert failed.returncode != 0
    other = mpiexec(
        3, "-m", "mpicd", "run", str(QUICKSTART), *again, f"privacy.key_dir={tmp_path / 'other'}", "--resume",
        "--out", str(out), timeout=400,
    )  # fmt: skip
    assert other.returncode == 2 and "Traceback" not in other.stderr, other.stderr[-2000:]
    (line,) = [line for line in other.stderr.splitlines() if line.startswith("mpicd:")]
    assert f"{tmp_path / 'other'}/client-0.key does not exist, but client 0's checkpoint" in line, line
    assert f"was drawn with (the key file {keys}/client-0.key)" in line, line
    assert not (tmp_path / "other").exists(), "a refused resume makes no key file"
    crashed = Results(out)
    run_id, folder = crashed.attrs["run_id"], Path(f"{out}.ckpt")
    journals = {c: read(folder / f"client{c}.{run_id}.releases") for c in range(3)}
    multiplier = float(crashed.attrs["privacy_release_multiplier"])
    for c in range(3):  # a journal line for every release the file's rounds record, and the same accounting
        for r in range(crashed.completed_rounds):
            steps = crashed.metrics["privacy_steps"][r, c]
            teaching = int(bool((crashed.teacher[r] == c).any()) and not crashed.metrics["privacy_stopped"][r, c])
            assert steps.tolist() == [teaching, 0]
            if teaching:
                entry = journals[c][r, 0]
                assert (entry.q, entry.multiplier, entry.steps) == (0.5, multiplier, 1) and len(entry.digest) == 64
                assert crashed.metrics["privacy_q"][r, c, 0] == 0.5
                assert crashed.metrics["privacy_multiplier"][r, c, 0] == multiplier
            else:
                assert (r, 0) not in journals[c]
            assert (r, 1) not in journals[c]
    files = sorted(folder.glob("rank1.round*.pt"))
    assert [f.name.split(".")[1] for f in files] == ["round2", "round3"], files
    saved = {f: f.read_bytes() for f in files}
    for f in files:
        f.write_bytes(bytes(len(saved[f])))
    rows = crashed.metrics["epsilon"].copy()
    refused = mpiexec(
        3, "-m", "mpicd", "run", str(QUICKSTART), *again, f"privacy.key_dir={keys}", "--resume", "--out", str(out),
        timeout=400,
    )  # fmt: skip
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert str(files[1]) in refused.stderr and "would send those rounds again" in refused.stderr, refused.stderr[-3000:]
    assert "Traceback" not in refused.stderr
    after = Results(out)
    assert after.completed_rounds == crashed.completed_rounds
    np.testing.assert_array_equal(after.metrics["epsilon"], rows)
    assert {c: read(folder / f"client{c}.{run_id}.releases") for c in range(3)} == journals
    files[0].write_bytes(saved[files[0]])  # the older checkpoint back; the newest stays zero-filled
    journal = folder / f"client2.{run_id}.releases"
    kept = journal.read_bytes()
    journal.write_bytes(kept + b"not a release\n")  # a journal that does not read: exit 2, one line naming it
    broken = mpiexec(
        3, "-m", "mpicd", "run", str(QUICKSTART), *again, f"privacy.key_dir={keys}", "--resume", "--out", str(out),
        timeout=400,
    )  # fmt: skip
    assert broken.returncode == 2 and "Traceback" not in broken.stderr, broken.stderr
    (line,) = [line for line in broken.stderr.splitlines() if line.startswith("mpicd:")]
    number = len(kept.splitlines()) + 1
    assert f"{journal}: line {number} is not a release entry" in line, line
    assert "cannot be known" in line, line
    journal.write_bytes(kept)
    mpicd_run(3, QUICKSTART, out, *again, f"privacy.key_dir={keys}", "--resume", timeout=400)  # the same keys
    a, b = Results(out), Results(private_run)
    assert list(a.attrs["resumed_at"]) == [2]
    for name in a.metrics:
        if not name.endswith("_seconds"):
            np.testing.assert_array_equal(a.metrics[name], b.metrics[name], err_msg=name)
    np.testing.assert_array_equal(a.bytes_sent_by_kind, b.bytes_sent_by_kind)
    assert verify(out).ok, verify(out).text()
    assert not folder.exists()  # complete: checkpoints and journals gone, the file holds every release


def test_verify_fails_a_file_whose_epsilon_is_below_its_recorded_releases(private_run, tmp_path):
    """The file's epsilon lowered in one cell (as an undercounting restart would leave it): verify
    recomputes it from /metrics/privacy_q, privacy_multiplier and privacy_steps and names the cell."""
    import shutil

    import h5py

    from mpicd.results.verify import verify

    res = Results(private_run)
    r, c, _ = map(int, np.argwhere(res.metrics["privacy_steps"] > 0)[-1])
    copy = tmp_path / "lowered.h5"
    shutil.copy(private_run, copy)
    with h5py.File(copy, "r+") as f:
        f["metrics/epsilon"][r, c] = f["metrics/epsilon"][r, c] * 0.9
    verdict = verify(copy)
    assert not verdict.ok and any(
        "below what its recorded releases compose to" in p and f"round {r + 1}, client {c}" in p
        for p in verdict.problems
    ), verdict.text()
    with h5py.File(copy, "r+") as f:
        f["metrics/epsilon"][r, c] = res.metrics["epsilon"][r, c] * 1.1  # above: conservative, not a problem
    assert verify(copy).ok, verify(copy).text()


def test_a_private_runs_training_metrics_stay_on_their_ranks(private_run):
    """With eval.train_split on, the file (what the writing rank gathered) holds NaN for every
    client's training loss and training-split scores, and says why; verify holds it to that."""
    res = Results(private_run)
    for name in ("train_loss", "train_ce", "train_extra", "train_acc", "train_minority_acc", "train_recall"):
        assert np.isnan(res.metrics[name]).all(), name
    assert res.attrs["train_metrics"].startswith("withheld: privacy is on")


@pytest.fixture(scope="module", params=["fedavg", "fedamp"])
def dpsgd_run(request, tmp_path_factory):
    out = tmp_path_factory.mktemp("dpsgd") / "run.h5"
    keys = tmp_path_factory.mktemp("dpsgd_keys")
    mpicd_run(2, QUICKSTART, out, "clients=2", "rounds=5", f"algorithm={request.param}", *DPSGD, f"privacy.key_dir={keys}",
              timeout=400)  # fmt: skip
    return request.param, out, keys


DPSGD = ("privacy={epsilon: 2.5, noise_multiplier: 2.0}", "train.local_epochs=2")


def test_dpsgd_epsilon_is_its_steps_and_the_budget_stops_its_share(dpsgd_run, tmp_path):
    """FedAvg and FedAMP with DP-SGD, 2 local epochs: each round 2 x int(1 / q) Poisson-sampled steps
    (Opacus' count) at q = 1 / ceil(n / 32), multiplier sigma = 2 (no counts), accounted by
    dp-accounting directly; bytes as declared."""
    from mpicd.results.verify import verify

    algorithm, path, keys = dpsgd_run
    res = Results(path)
    eps, stopped = res.metrics["epsilon"], res.metrics["privacy_stopped"]
    n = res.partition["train_counts"].sum(axis=1)
    for c in range(2):
        q = 1 / math.ceil(n[c] / 32)
        steps = 2 * int(1 / q)
        spent = 0
        for r in range(5):
            if not stopped[r, c]:
                spent += 1
            assert math.isclose(eps[r, c], epsilon_direct(q, 2.0, spent * steps, 1e-5), rel_tol=1e-9)
        assert (eps[:, c] <= 2.5).all() and stopped[-1, c] == 1  # 2.5 is spent within 5 rounds
    assert verify(path).ok, verify(path).text()
    if algorithm == "fedamp":  # the proximal term: test_fedamp_dpsgd_adds_the_proximal_term_after_the_noise
        assert np.isnan(res.metrics["train_extra"]).all()  # a training metric: it stays on the client's rank
        return
    out = tmp_path / "run.h5"  # resume equals the uninterrupted run (whose nonce it repeats)
    nonce = f"privacy.nonce='{res.attrs['privacy_nonce']}'"
    failed = mpiexec(
        2, "-m", "mpicd", "run", str(QUICKSTART), "clients=2", "rounds=5", "algorithm=fedavg", *DPSGD, nonce,
        f"privacy.key_dir={keys}", "debug.fail_rank=0", "debug.fail_round=2", "--out", str(out), timeout=400,
    )  # fmt: skip
    assert failed.returncode != 0
    mpicd_run(2, QUICKSTART, out, "clients=2", "rounds=5", "algorithm=fedavg", *DPSGD, nonce, f"privacy.key_dir={keys}",
              "--resume", timeout=400)  # fmt: skip
    a = Results(out)
    assert list(a.attrs["resumed_at"]) == [2]
    for name in a.metrics:
        if not name.endswith("_seconds"):
            np.testing.assert_array_equal(a.metrics[name], res.metrics[name], err_msg=name)


def test_fedamp_dpsgd_adds_the_proximal_term_after_the_noise():
    """In process (the training loss stays on its rank with privacy, so the file cannot show it): a
    FedAMP client under DP-SGD with a cloud model away from its own trains with the proximal term, its
    round's extra loss (lambda / 2 alpha) ||w - u||^2 > 0, and journals nothing without a journal."""
    from types import SimpleNamespace

    from mpicd.run.client import Client

    plan = prepare(load_config(QUICKSTART, ["clients=2", "device=cpu", "algorithm=fedamp", *DPSGD]))
    client = Client(plan, SimpleNamespace(rank=0, size=2), "cpu")
    client.algorithm.ctx.privacy.begin(NONCE, None)
    client.algorithm.cloud = [p.detach().clone() + 0.5 for p in client.model.parameters()]
    loss = client.local_epochs(1)
    assert loss.extra > 0 and math.isclose(loss.total, loss.ce + loss.extra, rel_tol=1e-12)
    client.algorithm.cloud = None
    assert client.local_epochs(2).extra == 0.0


def test_no_unclipped_or_unnoised_value_crosses_mpi(tmp_path):
    """tests/drivers/privacy_payloads.py: round 0's buffers of the private run against the same
    round's buffers of the exact releases (sigma 0, unclipped and clipped): no coordinate equal;
    the exact run's buffers hold what the comparison would catch (co-distillation: the default
    path's R; FedProto, FedDistill: the exact class counts)."""
    result = mpiexec(2, str(DRIVERS / "privacy_payloads.py"), str(tmp_path), timeout=400)
    assert result.returncode == 0, f"driver failed:\n{result.stdout}\n{result.stderr}"
    for rank in range(2):
        report = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert set(report) == {
            "codistill",
            "codistill_logits",
            "fedproto",
            "feddistill",
            "fedavg_dpsgd",
            "fedamp_dpsgd",
        }
        for label, found in report.items():
            assert found["buffers"] > 0, label
            # zero-out adjacency: no exact class size (n_c; at q = 1 also the exact sample size) in a
            # private payload, whatever the method
            assert found["exact_sizes"] == 0, (label, found)
            if label.endswith("_dpsgd"):
                continue
            assert found["equal_to_exact"] == 0 and found["equal_to_clipped"] == 0, (label, found)
            assert found["control"], (label, found)
            if label.startswith("fed"):  # the exact release's counts are the sizes: the search finds them
                assert found["exact_sizes_control"] >= 2, (label, found)
