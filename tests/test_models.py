import pytest
import torch

from mpicd.config import ConfigError
from mpicd.models import build_model, num_parameters


@pytest.mark.parametrize("shape", [(1, 28, 28), (3, 28, 28), (1, 200, 200), (3, 64, 48), (1, 8, 8)])
def test_lenet_any_size_and_channels(shape):
    model = build_model("auto", shape, 2, 200, 64)
    x = torch.randn(3, *shape)
    features = model.features(x)
    assert features.shape == (3, 200)
    assert features.abs().max() <= 1.0  # tanh
    assert model.head(features).shape == (3, 2)
    assert torch.equal(model(x), model.head(features))


def test_lenet_channel_widths_are_the_authors():
    model = build_model("lenet", (1, 28, 28), 2, 200, 64)
    convs = [m for m in model.features if isinstance(m, torch.nn.Conv2d)]
    assert [c.out_channels for c in convs] == [6, 16, 120]


def test_mlp_split_for_tabular_data():
    model = build_model("auto", (30,), 2, 200, 64)
    assert model.features(torch.randn(5, 30)).shape == (5, 200)
    assert model.feature_dim == 200 and num_parameters(model) == 30 * 64 + 64 + 64 * 200 + 200 + 200 * 2 + 2


def test_resnet18_features_are_the_pooled_512_vector():
    model = build_model("resnet18", (1, 32, 32), 2, 200, 64)
    assert model.feature_dim == 512
    assert model.features(torch.randn(2, 1, 32, 32)).shape == (2, 512)
    assert isinstance(model.head, torch.nn.Linear) and model.head.in_features == 512


def test_image_model_on_tabular_data_is_a_config_error():
    with pytest.raises(ConfigError) as err:
        build_model("lenet", (30,), 2, 200, 64)
    assert err.value.key == "model.name"
