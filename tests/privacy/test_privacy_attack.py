"""The attacks a peer can make on what it receives. A student holding the config,
the seed, the results file and its teacher's R redraws the teacher's Poisson sample and noise from
the seed and subtracts them. On a private run (privacy.noise: secret) its estimate of the clipped
sum is off by the noise's own scale; on a seeded run the same attack recovers it, so the test
cannot pass for want of a working attack.

A peer that received the releases of two runs of one site sharing a key folder subtracts them; the
writing rank searches what it gathered for another client's exact training loss.

The oracles (the clipped sum the teacher's release summed, the training losses) are recorded on each
rank by tests/drivers/noise_attack.py; the attacks use only what the peer holds.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from conftest import DRIVERS, mpiexec
from mpicd.core import seeds
from mpicd.results.reader import Results


@pytest.fixture(scope="module")
def attacked(tmp_path_factory):
    out = tmp_path_factory.mktemp("attack")
    result = mpiexec(2, str(DRIVERS / "noise_attack.py"), str(out), timeout=400)
    assert result.returncode == 0, f"driver failed:\n{result.stdout}\n{result.stderr}"
    return out


def attack(res: Results, received: np.ndarray, teacher: int) -> np.ndarray:
    """The student's estimate of its teacher's clipped sum: R times the redrawn noised count, minus
    the redrawn noise, all from (seed, PRIVACY, teacher, round 0, RELEASE) as mpicd.privacy.streams
    documents the seeded stream; the teacher's expertise-class size from the file's partition."""
    config = res.config
    p, seed = config["privacy"], int(config["seed"])
    n = int(res.partition["train_counts"][teacher][int(res.partition["expertise"][teacher])])
    rng = seeds.rng(seed, seeds.PRIVACY, teacher, 0, 0)
    taken = int(np.sum(rng.random(n) < float(p["sample_rate"])))
    noise = rng.normal(0.0, float(p["noise_multiplier"]) * float(p["clip"]), size=len(received))
    count = max(taken + rng.normal(0.0, float(p["noise_multiplier"])), 1.0)
    return received.astype(np.float64) * count - noise


@pytest.mark.parametrize("noise", ["secret", "seeded"])
def test_a_student_subtracts_its_teachers_noise_only_when_it_is_seeded(attacked, noise):
    res = Results(attacked / f"{noise}.h5")
    assert res.config["privacy"]["noise"] == noise
    scale = float(res.config["privacy"]["noise_multiplier"]) * float(res.config["privacy"]["clip"])
    for student in range(2):
        teacher = int(res.teacher[0, student])
        mine = json.loads((attacked / f"{noise}_rank{teacher}.json").read_text())
        received, truth = np.asarray(mine["sent"]), np.asarray(mine["clipped_sum"])
        error = np.linalg.norm(attack(res, received, teacher) - truth)
        noise_norm = scale * math.sqrt(len(truth))  # the noise vector's expected norm
        if noise == "seeded":
            assert error < 1e-4 * noise_norm, (student, error, noise_norm)
        else:
            assert error > 0.5 * noise_norm, (student, error, noise_norm)


def test_verify_and_the_report_mark_a_seeded_run_not_private(attacked):
    from mpicd import report
    from mpicd.results.verify import verify

    seeded, private = verify(attacked / "seeded.h5"), verify(attacked / "secret.h5")
    assert seeded.ok and private.ok, (seeded.text(), private.text())
    assert any(n.startswith("NOT PRIVATE") for n in seeded.notes)
    assert not any("NOT PRIVATE" in n for n in private.notes)
    assert Results(attacked / "seeded.h5").attrs["privacy_noise"].startswith("seeded: NOT PRIVATE")
    _, notes = report.collect([attacked / "seeded.h5", attacked / "secret.h5"])
    marked = [n for n in notes if n.startswith("NOT PRIVATE")]
    assert len(marked) == 1 and "seeded.h5" in marked[0]


def test_key_dir_with_seeded_noise_is_refused():
    from conftest import QUICKSTART
    from mpicd.config.loading import load_config
    from mpicd.config.sections import ConfigError

    with pytest.raises(ConfigError) as err:
        load_config(QUICKSTART, ["privacy={noise_multiplier: 1, noise: seeded, key_dir: keys}"])
    assert err.value.key == "privacy.key_dir"


def difference_residual(out, a: str, b: str, teacher: int) -> float:
    """How far the difference of two runs' releases of ``teacher`` is from a multiple of the
    difference of their clipped sums (the oracle): ||dR - s dS|| / ||dR||, s fitted by least squares.
    With equal noise (and sample, and noised count) dR = dS / count exactly: 0 up to float32."""
    ra, rb = (json.loads((out / f"{run}_rank{teacher}.json").read_text()) for run in (a, b))
    d_released = np.asarray(ra["sent"], dtype=np.float64) - np.asarray(rb["sent"], dtype=np.float64)
    d_sum = np.asarray(ra["clipped_sum"]) - np.asarray(rb["clipped_sum"])
    scale = (d_released @ d_sum) / (d_sum @ d_sum)
    return float(np.linalg.norm(d_released - scale * d_sum) / np.linalg.norm(d_released))


def test_two_runs_sharing_a_key_folder_cannot_subtract_each_others_noise(attacked):
    """A peer that received both runs' R (seeds 0 and 1, one privacy.key_dir) subtracts them: with
    the run's nonce in every stream the residual is the noise's (near 1), not float32's. The control:
    a run naming shared0's nonce (privacy.nonce) repeats its noise, and the same attack succeeds."""
    one, two, again = (Results(attacked / f"{run}.h5").attrs for run in ("shared0", "shared1", "repeat"))
    assert one["privacy_nonce"] == one["run_id"] and two["privacy_nonce"] == two["run_id"]
    assert one["privacy_nonce"] != two["privacy_nonce"] and again["privacy_nonce"] == one["privacy_nonce"]
    assert again["privacy_nonce_from"].startswith("privacy.nonce: REPEATS")
    for teacher in range(2):
        assert difference_residual(attacked, "shared0", "shared1", teacher) > 0.5, teacher
        assert difference_residual(attacked, "shared0", "repeat", teacher) < 1e-4, teacher


def test_verify_notes_a_run_that_repeats_another_runs_noise(attacked):
    from mpicd.results.verify import verify

    repeat, shared = verify(attacked / "repeat.h5"), verify(attacked / "shared1.h5")
    assert repeat.ok and shared.ok, (repeat.text(), shared.text())
    assert any(n.startswith("REPEATS NOISE") for n in repeat.notes)
    assert not any("REPEATS" in n for n in shared.notes)


@pytest.mark.parametrize("run", ["secret", "shared0", "plain"])
def test_the_writing_rank_receives_no_other_clients_exact_training_loss_with_privacy(attacked, run):
    """Rank 0 writes the file: every float64 value its results gather brought it, searched for client
    1's exact training losses (total, ce, extra; recorded on rank 1). With privacy none is there, and
    the file holds NaN; without it (the control) the search finds them."""
    theirs = json.loads((attacked / f"{run}_rank1.json").read_text())["losses"]
    received = set(json.loads((attacked / f"{run}_rank0.json").read_text())["gathered"])
    values = [v for loss in theirs for v in loss if v != 0.0]  # ce and extra: extra is 0 without the term
    assert values, theirs
    found = [v for v in values if v in received]
    stored = Results(attacked / f"{run}.h5").metrics["train_loss"]
    if run == "plain":
        assert found and np.isfinite(stored).all()
        assert "train_metrics" not in Results(attacked / f"{run}.h5").attrs
    else:
        assert not found, found
        assert np.isnan(stored).all()
        assert Results(attacked / f"{run}.h5").attrs["train_metrics"].startswith("withheld")


def test_sharing_training_metrics_is_refused_with_privacy_naming_the_key():
    from conftest import QUICKSTART
    from mpicd.config.loading import load_config
    from mpicd.config.sections import ConfigError

    with pytest.raises(ConfigError) as err:
        load_config(QUICKSTART, ["eval.share_train_metrics=true", "privacy={noise_multiplier: 1}"])
    assert err.value.key == "eval.share_train_metrics" and "privacy" in str(err.value)
    load_config(QUICKSTART, ["eval.share_train_metrics=true"])  # without privacy: nothing to protect
    for nonce, why in (("xyz", "16 hex digits"), ("0123456789ABCDEF", "16 hex digits")):
        with pytest.raises(ConfigError, match=why) as err:
            load_config(QUICKSTART, [f"privacy={{noise_multiplier: 1, nonce: '{nonce}'}}"])
        assert err.value.key == "privacy.nonce"
    with pytest.raises(ConfigError) as err:
        load_config(QUICKSTART, ["privacy={noise_multiplier: 1, noise: seeded, nonce: '0123456789abcdef'}"])
    assert err.value.key == "privacy.nonce"
    with pytest.raises(ConfigError, match="key_dir is null") as err:  # fresh keys repeat nothing
        load_config(QUICKSTART, ["privacy={noise_multiplier: 1, nonce: '0123456789abcdef'}"])
    assert err.value.key == "privacy.nonce"
