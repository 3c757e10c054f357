"""Models: layer stacks, parameter counts worked out by hand, the features/head split, and one
short real training check (FedAvgCNN with plain SGD on PneumoniaMNIST)."""

import numpy as np
import pytest
import torch
from torch import nn

from conftest import require_pneumonia
from mpicd.config.sections import ConfigError
from mpicd.models.networks import build_model, describe, num_parameters


def conv_params(c_in, c_out, k):
    return c_out * c_in * k * k + c_out


def linear_params(n_in, n_out):
    return n_in * n_out + n_out


@pytest.mark.parametrize("shape", [(1, 28, 28), (3, 28, 28), (1, 200, 200), (3, 64, 48), (1, 8, 8), (1, 4, 4)])
def test_lenet_any_size_and_channels(shape):
    model = build_model("auto", shape, 2, 200, 64)
    x = torch.randn(3, *shape)
    features = model.features(x)
    assert features.shape == (3, 200)
    assert features.abs().max() <= 1.0  # tanh
    assert model.head(features).shape == (3, 2)
    assert torch.equal(model(x), model.head(features))


def test_lenet_is_the_authors_layer_stack():
    """humairafirdowse/codistillation models.py LeNet5, transcribed by hand (dropout p=0 omitted)."""
    model = build_model("lenet", (1, 28, 28), 2, 200, 64)
    convs = [
        (m.in_channels, m.out_channels, m.kernel_size, m.padding, m.stride)
        for m in model.features
        if isinstance(m, nn.Conv2d)
    ]
    assert convs == [(1, 6, (5, 5), (2, 2), (1, 1)), (6, 16, (5, 5), (2, 2), (1, 1)), (16, 120, (3, 3), (1, 1), (1, 1))]
    kinds = [type(m).__name__ for m in model.features]
    assert kinds == [
        "Conv2d",
        "ReLU",
        "MaxPool2d",
        "Conv2d",
        "ReLU",
        "MaxPool2d",
        "Conv2d",
        "ReLU",
        "AdaptiveAvgPool2d",
        "Flatten",
        "Linear",
        "Tanh",
    ]
    pools = [m for m in model.features if isinstance(m, nn.MaxPool2d)]
    assert all(p.kernel_size == 2 and p.stride == 2 and not p.ceil_mode for p in pools)
    assert isinstance(model.head, nn.Linear) and (model.head.in_features, model.head.out_features) == (200, 2)


def test_lenet_parameter_count_by_hand():
    # conv1 6*1*5*5+6 = 156; conv2 16*6*5*5+16 = 2416; conv3 120*16*3*3+120 = 17400;
    # Linear(120, 200) 24000+200 = 24200; head Linear(200, 2) 400+2 = 402  -> 44574, any image size
    for shape in [(1, 28, 28), (1, 64, 64)]:
        assert num_parameters(build_model("lenet", shape, 2, 200, 64)) == 156 + 2416 + 17400 + 24200 + 402 == 44574
    # 3 channels, D = 100, 5 classes: conv1 6*3*25+6 = 456; Linear(120, 100) = 12100; head 100*5+5 = 505
    assert num_parameters(build_model("lenet", (3, 28, 28), 5, 100, 64)) == 456 + 2416 + 17400 + 12100 + 505


def test_fedavgcnn_layer_stack_has_pfllib_padding_zero():
    model = build_model("fedavgcnn", (1, 28, 28), 2, 200, 64)
    convs = [
        (m.in_channels, m.out_channels, m.kernel_size, m.padding) for m in model.features if isinstance(m, nn.Conv2d)
    ]
    assert convs == [(1, 32, (5, 5), (0, 0)), (32, 64, (5, 5), (0, 0))]
    assert [type(m).__name__ for m in model.features] == [
        "Conv2d",
        "ReLU",
        "MaxPool2d",
        "Conv2d",
        "ReLU",
        "MaxPool2d",
        "Flatten",
        "Linear",
        "ReLU",
    ]


@pytest.mark.parametrize(
    "shape, flat",
    [
        ((1, 28, 28), 1024),  # PFLlib main.py: MNIST, dim=1024    (28 -> 24 -> 12 -> 8 -> 4)
        ((3, 32, 32), 1600),  # PFLlib main.py: Cifar10, dim=1600  (32 -> 28 -> 14 -> 10 -> 5)
        ((3, 64, 64), 10816),  # PFLlib main.py: default, dim=10816 (64 -> 60 -> 30 -> 26 -> 13)
        ((1, 105, 105), 33856),  # PFLlib main.py: Omniglot, dim=33856 (105 -> 101 -> 50 -> 46 -> 23)
        ((1, 16, 17), 64),  # smallest: 16 -> 12 -> 6 -> 2 -> 1 and 17 -> 13 -> 6 -> 2 -> 1
        ((1, 64, 28), 64 * 13 * 4),
    ],
)
def test_fedavgcnn_flatten_width_matches_pfllib_dims(shape, flat):
    model = build_model("fedavgcnn", shape, 10, 200, 64)
    fc1 = [m for m in model.features if isinstance(m, nn.Linear)]
    assert len(fc1) == 1 and (fc1[0].in_features, fc1[0].out_features) == (flat, 512)
    assert model.features(torch.randn(2, *shape)).shape == (2, 512)


def test_fedavgcnn_parameter_count_by_hand():
    # conv1 32*1*5*5+32 = 832; conv2 64*32*5*5+64 = 51264; fc1 1024*512+512 = 524800; head 512*2+2 = 1026
    assert num_parameters(build_model("fedavgcnn", (1, 28, 28), 2, 200, 64)) == 832 + 51264 + 524800 + 1026 == 577922
    # 10 classes: head 512*10+10 = 5130 -> 582026, PFLlib's FedAvgCNN on MNIST
    assert num_parameters(build_model("fedavgcnn", (1, 28, 28), 10, 200, 64)) == 582026
    # 64x64 grey, 2 classes: fc1 10816*512+512 = 5538304
    assert num_parameters(build_model("fedavgcnn", (1, 64, 64), 2, 200, 64)) == 832 + 51264 + 5538304 + 1026


def test_resnet18_parameter_count_by_hand():
    # torchvision's resnet18 (3 channels, 1000 classes) has 11,689,512 parameters (its documented size);
    # grey conv1: 64*3*7*7 = 9408 -> 64*1*7*7 = 3136; fc: 512*1000+1000 = 513000 -> 512*2+2 = 1026
    assert num_parameters(build_model("resnet18", (1, 28, 28), 2, 200, 64)) == 11689512 - 9408 + 3136 - 513000 + 1026
    assert num_parameters(build_model("resnet18", (3, 28, 28), 2, 200, 64)) == 11689512 - 513000 + 1026


@pytest.mark.parametrize("name, dim", [("lenet", 200), ("fedavgcnn", 512), ("resnet18", 512)])
@pytest.mark.parametrize("side", [28, 64])
def test_features_head_split_and_shapes(name, dim, side):
    torch.manual_seed(0)
    model = build_model(name, (1, side, side), 3, 200, 64).eval()
    x = torch.rand(4, 1, side, side)
    features = model.features(x)
    assert model.feature_dim == dim and features.shape == (4, dim)
    assert isinstance(model.head, nn.Linear) and (model.head.in_features, model.head.out_features) == (dim, 3)
    assert model(x).shape == (4, 3)
    assert torch.equal(model(x), model.head(features))
    # the head is exactly the last layer: nothing of it is inside features
    assert not any(p is q for p in model.features.parameters() for q in model.head.parameters())
    assert num_parameters(model) == num_parameters(model.features) + dim * 3 + 3
    assert describe(model).startswith(f"model: D = {dim} features, {num_parameters(model):,} parameters")


def test_mlp_split_for_tabular_data():
    model = build_model("auto", (30,), 2, 200, 64)
    assert model.features(torch.randn(5, 30)).shape == (5, 200)
    assert model.feature_dim == 200 and num_parameters(model) == 30 * 64 + 64 + 64 * 200 + 200 + 200 * 2 + 2


@pytest.mark.parametrize("name", ["lenet", "fedavgcnn", "resnet18"])
def test_image_model_on_tabular_data_is_a_config_error(name):
    with pytest.raises(ConfigError) as err:
        build_model(name, (30,), 2, 200, 64)
    assert err.value.key == "model.name" and "needs images" in str(err.value)


def test_images_too_small_for_fedavgcnn_are_a_config_error():
    with pytest.raises(ConfigError) as err:
        build_model("fedavgcnn", (1, 15, 28), 2, 200, 64)
    assert err.value.key == "model.name" and "16x16" in str(err.value)
    with pytest.raises(ConfigError):
        build_model("lenet", (1, 3, 3), 2, 200, 64)


def pneumonia_subset(n_per_class: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A balanced real subset of PneumoniaMNIST's training split, standardised with its own mean
    and std as mpicd's loaders standardise with the training split's (raw [0, 1] pixels make
    plain SGD at lr 0.05 crawl: about 0.69 -> 0.57 in 8 epochs)."""
    with np.load(require_pneumonia()) as npz:
        x, y = npz["train_images"], npz["train_labels"].reshape(-1)
    idx = np.concatenate([np.flatnonzero(y == c)[:n_per_class] for c in (0, 1)])
    x = x[idx, None].astype(np.float32) / 255.0
    return torch.from_numpy((x - x.mean()) / x.std()), torch.from_numpy(y[idx].astype(np.int64))


def test_fedavgcnn_trains_with_plain_sgd_on_real_pneumoniamnist():
    x, y = pneumonia_subset(200)
    torch.manual_seed(0)
    model = build_model("fedavgcnn", (1, 28, 28), 2, 200, 64)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loss_fn = nn.CrossEntropyLoss()

    def full_loss():
        with torch.no_grad():
            return loss_fn(model(x), y).item()

    before = full_loss()
    gen = torch.Generator().manual_seed(0)
    for _ in range(8):
        for batch in torch.randperm(len(y), generator=gen).split(32):
            opt.zero_grad()
            loss_fn(model(x[batch]), y[batch]).backward()
            opt.step()
    after = full_loss()
    # balanced classes, untrained: about ln 2 = 0.693; seeds 0-4 all end at 0.20-0.28 after 8 epochs
    assert before > 0.6
    assert after < 0.5 * before, (before, after)
