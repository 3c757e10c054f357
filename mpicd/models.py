"""Models split into ``features`` (input -> D-vector) and ``head`` (D-vector -> C logits).

Every algorithm relies on that split: co-distillation and FedProto regularise the features,
FedDistill the logits, FedAvg/FedAMP move all parameters.
"""

from __future__ import annotations

import torch
from torch import nn

from .config import ConfigError


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
    """The authors' LeNet-5-like CNN: conv 6, 16, 120; global average pool; Linear to D; tanh.

    Padding 2 and ceil-mode pooling keep it valid for any image size from 8x8 up (MedMNIST's
    28x28 included); the global pool makes D independent of the size.
    """
    features = nn.Sequential(
        nn.Conv2d(in_channels, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2, ceil_mode=True),
        nn.Conv2d(6, 16, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2, ceil_mode=True),
        nn.Conv2d(16, 120, 5, padding=2), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(120, feature_dim), nn.Tanh(),
    )
    return FeatureHeadModel(features, nn.Linear(feature_dim, num_classes), feature_dim, num_classes)


def mlp(in_features: int, hidden: int, feature_dim: int, num_classes: int) -> FeatureHeadModel:
    """The same features/head split for tabular data: one hidden ReLU layer, then D with tanh."""
    features = nn.Sequential(
        nn.Flatten(), nn.Linear(in_features, hidden), nn.ReLU(), nn.Linear(hidden, feature_dim), nn.Tanh(),
    )
    return FeatureHeadModel(features, nn.Linear(feature_dim, num_classes), feature_dim, num_classes)


def resnet18(in_channels: int, num_classes: int) -> FeatureHeadModel:
    """torchvision's ResNet-18 (random init): features = the pooled 512-vector, head = fc."""
    from torchvision.models import resnet18 as tv_resnet18

    net = tv_resnet18(weights=None, num_classes=num_classes)
    if in_channels != 3:
        net.conv1 = nn.Conv2d(in_channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
    head, net.fc = net.fc, nn.Identity()
    return FeatureHeadModel(net, head, 512, num_classes)


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int, feature_dim: int,
                hidden: int) -> FeatureHeadModel:
    """``name`` from the config; ``auto`` picks lenet for images and mlp for feature vectors."""
    is_image = len(input_shape) == 3
    if name == "auto":
        name = "lenet" if is_image else "mlp"
    if name in ("lenet", "resnet18") and not is_image:
        raise ConfigError("model.name", f"{name} needs images; the dataset has feature vectors of shape {input_shape}")
    if name == "lenet":
        return lenet(input_shape[0], feature_dim, num_classes)
    if name == "resnet18":
        return resnet18(input_shape[0], num_classes)
    in_features = 1
    for n in input_shape:
        in_features *= n
    return mlp(in_features, hidden, feature_dim, num_classes)


def num_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
