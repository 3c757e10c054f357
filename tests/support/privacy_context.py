"""What the privacy tests build by hand: one client's algorithm context on a small MLP, and the
privacy settings of a config section (tests/privacy/test_privacy_wiring.py, tests/privacy/test_privacy_audit.py)."""

from __future__ import annotations

import json

import numpy as np
import torch

from conftest import QUICKSTART
from mpicd.algorithms.base import Context
from mpicd.config.loading import load_config
from mpicd.models.networks import build_model
from mpicd.privacy.budget import Budget, settings

NONCE = "0123456789abcdef"  # the nonce of the hand-built contexts' run (a run id's 16 hex digits)


def context(privacy, seed=3, n=64, width=8):
    """(ctx, model, x, y): client 1 of 2 with n random 30-feature rows; privacy None: no budget."""
    torch.manual_seed(0)
    model = build_model("mlp", (30,), 2, width, 16)
    x = torch.randn(n, 30) * 5
    y = torch.arange(n) % 2
    budget = None if privacy is None else Budget(privacy, seed, 1)
    if budget is not None:
        budget.begin(NONCE, None)  # a run's nonce; no journal: nothing here is sent
    ctx = Context(
        None, model, torch.device("cpu"), seed, 2, np.array([0, 1]), x, y, client=1, owner=np.zeros(2), privacy=budget
    )
    return ctx, model, x, y


def private_settings(**section):
    """The privacy settings of QUICKSTART with a privacy section (sigma 3, q 0.5 unless given), 10 rounds."""
    cfg = load_config(QUICKSTART, ["privacy=" + json.dumps({"noise_multiplier": 3.0, "sample_rate": 0.5, **section})])
    return settings(cfg.privacy, 10)
