"""Layers holding a reference implementation's fixed weights (tests/algorithms/data/*.json), in float64."""

import torch
from torch import nn


def linear(weight, bias) -> nn.Linear:
    """nn.Linear(in, out) in float64 with ``weight`` (out, in) and ``bias`` (out,) as given."""
    layer = nn.Linear(len(weight[0]), len(weight), dtype=torch.float64)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor(weight, dtype=torch.float64))
        layer.bias.copy_(torch.tensor(bias, dtype=torch.float64))
    return layer
