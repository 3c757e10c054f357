"""tools/steps_to_learn.py, the measurement behind mpicd check's few-steps warning, on a curve worked by hand."""

import importlib.util
from types import SimpleNamespace

import numpy as np

from conftest import ROOT


def tool():
    spec = importlib.util.spec_from_file_location("steps_to_learn", ROOT / "tools" / "steps_to_learn.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_steps_to_reach_a_fraction_of_the_final_gain():
    # two classes (chance 0.5), final 0.9 (the last 10 rounds): 80% of the gain is 0.5 + 0.32 = 0.82,
    # first reached in round 6; the larger client has 40 + 41 = 81 images, batches of 32: 32, 32, 17,
    # 3 steps an epoch, x 2 local epochs: 6 x 3 x 2 = 36 steps. Half the gain (0.7) is round 4: 24.
    curve = np.array([0.5, 0.5, 0.6, 0.7, 0.8] + [0.9] * 10)
    fake = SimpleNamespace(
        config={"train": {"batch_size": 32, "local_epochs": 2}},
        metrics={"val_balanced_acc": np.stack([curve - 0.01, curve + 0.01], axis=1)},
        class_names=("a", "b"),
        partition={"train_counts": np.array([[40, 41], [41, 30]])},
    )
    steps_to = tool().steps_to
    assert steps_to(fake, 0.8) == 36
    assert steps_to(fake, 0.5) == 24
