"""The client's minibatches: a trailing batch of one image is merged (ResNet-18's BatchNorm cannot
train on it), the layout is what `mpicd check` prints, and the loss is recorded in its two parts."""

import numpy as np
import pytest

from mpicd.results.reader import Results
from mpicd.run.client import batch_bounds

from conftest import QUICKSTART, ROOT, mpicd_cli, mpicd_run, require_pneumonia


@pytest.mark.parametrize(
    "n, size, expected",
    [
        (64, 32, [(0, 32), (32, 64)]),
        (65, 32, [(0, 32), (32, 65)]),  # 1 left over: merged, the last batch holds 33
        (66, 32, [(0, 32), (32, 64), (64, 66)]),  # 2 left over: a batch of its own
        (1, 32, [(0, 1)]),  # a single image has nothing to merge into
        (33, 32, [(0, 33)]),
        (5, 1, [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)]),  # batch_size 1 is what the user asked for
        (0, 32, []),
    ],
)
def test_batch_bounds(n, size, expected):
    assert batch_bounds(n, size) == expected


def test_check_prints_the_batch_layout():
    pneumonia = require_pneumonia()
    # 20 expertise + floor(0.65 * 20) = 13 others = 33 images: one batch of 33, not 32 + 1
    result = mpicd_cli(
        "check",
        str(ROOT / "configs" / "pneumoniamnist.yaml"),
        f"data.path={pneumonia}",
        "data.images_per_class=20",
        "data.skew=0.35",
        "clients=2",
        "model.name=resnet18",
    )
    assert result.returncode == 0, result.stderr
    assert "1x33" in result.stdout and "D = 512 features" in result.stdout


def test_resnet18_trains_a_client_whose_last_batch_would_hold_one_image(tmp_path):
    pneumonia = require_pneumonia()
    out = tmp_path / "resnet.h5"
    mpicd_run(
        2,
        ROOT / "configs" / "pneumoniamnist.yaml",
        out,
        f"data.path={pneumonia}",
        "clients=2",
        "rounds=1",
        "data.images_per_class=20",
        "data.skew=0.35",
        "model.name=resnet18",
        "algorithm={name: local}",
        timeout=400,
    )
    res = Results(out)
    assert res.completed_rounds == 1 and np.isfinite(res.metrics["train_loss"]).all()


def test_train_loss_is_the_sum_of_its_recorded_parts(tmp_path):
    out = tmp_path / "parts.h5"
    mpicd_run(2, QUICKSTART, out, "clients=2", "rounds=3", "algorithm.lambda=5")
    m = Results(out).metrics
    np.testing.assert_allclose(m["train_loss"], m["train_ce"] + m["train_extra"], rtol=1e-12)
    assert (m["train_extra"] > 0).all() and (m["train_ce"] > 0).all()
    local = tmp_path / "local.h5"
    mpicd_run(2, QUICKSTART, local, "clients=2", "rounds=2", "algorithm={name: local}")
    assert (Results(local).metrics["train_extra"] == 0).all()
