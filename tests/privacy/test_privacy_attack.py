"""The attack a peer can make on the release it receives: a student holding the config,
the seed, the results file and its teacher's R redraws the teacher's Poisson sample and noise from
the seed and subtracts them. On a private run (privacy.noise: secret) its estimate of the clipped
sum is off by the noise's own scale; on a seeded run the same attack recovers it, so the test
cannot pass for want of a working attack.

The oracle (the clipped sum the teacher's release summed) is recorded on the teacher's rank by
tests/drivers/noise_attack.py; the attack below uses only what the student holds.
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
