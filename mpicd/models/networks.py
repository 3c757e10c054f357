"""Models split into ``features`` (input -> D-vector) and ``head`` (D-vector -> C logits).

Every algorithm relies on that split: co-distillation and FedProto regularise the features,
FedDistill the logits, FedAvg/FedAMP move all parameters.
"""

from __future__ import annotations

import torch
from torch import nn

from mpicd.core.schema import ConfigError

# Smallest image side each convolutional stack accepts (below it a pooling output is empty).
MIN_IMAGE_SIDE = {"lenet": 4, "fedavgcnn": 16, "resnet18": 1}


class FeatureHeadModel(nn.Module):
    """``forward`` returns logits; ``features`` and ``head`` are usable on their own."""

    def __init__(self, features: nn.Module, head: nn.Module, feature_dim: int, num_classes: int):
        super().__init__()
        self.features = features
        self.head = head
        self.feature_dim = feature_dim
        self.num_classes = num_classes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def lenet(in_channels: int, feature_dim: int, num_classes: int) -> FeatureHeadModel:
    """The authors' LeNet-5-like CNN, layer for layer.

    Source: github.com/humairafirdowse/codistillation (the paper's code; Firdowse is a co-author),
    ``models.py``, class ``LeNet5`` (commit 8115ec2): conv 5x5 pad 2 -> 6, ReLU, max-pool 2;
    conv 5x5 pad 2 -> 16, ReLU, max-pool 2; conv 3x3 pad 1 -> 120, ReLU; global average pool;
    Linear(120, D), tanh = the features; head = Linear(D, C) (their ``classifier``).
    Omitted: their Dropout2d/Dropout layers, whose rate is 0 as ``get_model`` builds them (identities).
    Input size: they resize to 200x200; the same stack runs unchanged on 28x28 MedMNIST
    (28 -> 14 -> 7 -> 7 -> pool), as on any side >= 4, because the global pool fixes the width.
    """
    features = nn.Sequential(
        nn.Conv2d(in_channels, 6, 5, padding=2),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5, padding=2),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 120, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(120, feature_dim),
        nn.Tanh(),
    )
    return FeatureHeadModel(features, nn.Linear(feature_dim, num_classes), feature_dim, num_classes)


def fedavgcnn(in_channels: int, height: int, width: int, num_classes: int) -> FeatureHeadModel:
    """The two-conv CNN of McMahan et al. (2017) as FL libraries define it, so baselines compare.

    Source: github.com/TsingZ0/PFLlib, ``system/flcore/trainmodel/models.py``, class ``FedAvgCNN``:
    conv 5x5 -> 32, ReLU, max-pool 2; conv 5x5 -> 64, ReLU, max-pool 2; flatten; Linear to 512,
    ReLU = the features (D = 512, ``model.feature_dim`` unused); head = Linear(512, C).
    Padding 0 as in PFLlib (McMahan's TensorFlow original used "same"), so the flatten width is
    64 * s(H) * s(W) with s(n) = ((n - 4) // 2 - 4) // 2: 1024 at 28x28, 10816 at 64x64, as
    PFLlib's hard-coded ``dim``; images need a side of at least 16.
    """

    def side(n: int) -> int:
        return ((n - 4) // 2 - 4) // 2

    features = nn.Sequential(
        nn.Conv2d(in_channels, 32, 5),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 5),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(64 * side(height) * side(width), 512),
        nn.ReLU(),
    )
    return FeatureHeadModel(features, nn.Linear(512, num_classes), 512, num_classes)


def mlp(in_features: int, hidden: int, feature_dim: int, num_classes: int) -> FeatureHeadModel:
    """The same features/head split for tabular data: one hidden ReLU layer, then D with tanh."""
    features = nn.Sequential(
        nn.Flatten(),
        nn.Linear(in_features, hidden),
        nn.ReLU(),
        nn.Linear(hidden, feature_dim),
        nn.Tanh(),
    )
    return FeatureHeadModel(features, nn.Linear(feature_dim, num_classes), feature_dim, num_classes)


def resnet18(in_channels: int, num_classes: int) -> FeatureHeadModel:
    """torchvision's ResNet-18 (random init): features = the pooled 512-vector (D = 512,
    ``model.feature_dim`` unused), head = fc; grey images get a 1-channel conv1."""
    from torchvision.models import resnet18 as tv_resnet18

    net = tv_resnet18(weights=None, num_classes=num_classes)
    if in_channels != 3:
        net.conv1 = nn.Conv2d(in_channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
    head, net.fc = net.fc, nn.Identity()
    return FeatureHeadModel(net, head, 512, num_classes)


def build_model(
    name: str, input_shape: tuple[int, ...], num_classes: int, feature_dim: int, hidden: int
) -> FeatureHeadModel:
    """``name`` from the config; ``auto`` picks lenet for images and mlp for feature vectors.

    ``feature_dim`` sets D for lenet and mlp only; resnet18 and fedavgcnn have D = 512
    (``model.feature_dim`` of the result is the real D).
    """
    is_image = len(input_shape) == 3
    if name == "auto":
        name = "lenet" if is_image else "mlp"
    if name in MIN_IMAGE_SIDE:
        if not is_image:
            raise ConfigError(
                "model.name", f"{name} needs images; the dataset has feature vectors of shape {input_shape}"
            )
        if min(input_shape[1:]) < MIN_IMAGE_SIDE[name]:
            raise ConfigError(
                "model.name",
                f"{name} needs images of at least {MIN_IMAGE_SIDE[name]}x"
                f"{MIN_IMAGE_SIDE[name]}; the dataset's are {input_shape[1]}x"
                f"{input_shape[2]} (raise data.image_size or pick another model)",
            )
    if name == "lenet":
        return lenet(input_shape[0], feature_dim, num_classes)
    if name == "fedavgcnn":
        return fedavgcnn(*input_shape, num_classes)
    if name == "resnet18":
        return resnet18(input_shape[0], num_classes)
    in_features = 1
    for n in input_shape:
        in_features *= n
    return mlp(in_features, hidden, feature_dim, num_classes)


def describe(model: FeatureHeadModel) -> str:
    """One line for ``mpicd check``: the real D (which may differ from ``model.feature_dim``) and P."""
    return f"model: D = {model.feature_dim} features, {num_parameters(model):,} parameters"


def num_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
