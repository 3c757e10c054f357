"""Config validation: every bad value is one ConfigError naming the key."""

import pytest

from mpicd.algorithms import resolve
from mpicd.config import Config, ConfigError, apply_override, from_mapping, load_config, to_mapping

from conftest import QUICKSTART


def test_defaults_are_the_authors_training_setup():
    cfg = Config()
    assert (cfg.train.optimizer, cfg.train.lr, cfg.train.batch_size, cfg.train.local_epochs) == ("adam", 1e-3, 32, 1)
    assert cfg.model.feature_dim == 200
    _, params = resolve({"name": "codistill"})
    assert params.lambda_ == 1.0 and params.k == "all"


def test_quickstart_loads_and_round_trips():
    cfg = load_config(QUICKSTART)
    assert cfg.clients == 4 and cfg.data.name == "breast_cancer"
    assert from_mapping(Config, to_mapping(cfg)) == cfg


@pytest.mark.parametrize("override, key", [
    ("data.skew=1.0", "data.skew"),
    ("data.skew=-0.1", "data.skew"),
    ("clients=0", "clients"),
    ("rounds=0", "rounds"),
    ("train.lr=0", "train.lr"),
    ("train.batch_size=2.5", "train.batch_size"),
    ("train.optimizer=rmsprop", "train.optimizer"),
    ("data.name=cifar", "data.name"),
    ("rounds=true", "rounds"),
    ("data.skeww=0.2", "data.skeww"),
    ("colour=red", "colour"),
    ("data=3", "data"),
])
def test_bad_values_name_the_key(override, key):
    with pytest.raises(ConfigError) as err:
        load_config(QUICKSTART, [override])
    assert err.value.key == key
    assert key in str(err.value)


@pytest.mark.parametrize("override, key", [
    ("algorithm.lambda=-1", "algorithm.lambda"),
    ("algorithm.k=0", "algorithm.k"),
    ("algorithm.k=some", "algorithm.k"),
    ("algorithm.temperature=2", "algorithm.temperature"),
    ("algorithm.name=fedsomething", "algorithm.name"),
])
def test_bad_algorithm_values_name_the_key(override, key):
    with pytest.raises(ConfigError) as err:
        resolve(load_config(QUICKSTART, [override]).algorithm)
    assert err.value.key == key


def test_overrides_parse_yaml_scalars_and_create_sections():
    tree = {}
    apply_override(tree, "algorithm.lambda=0.5")
    apply_override(tree, "data.images_per_class=null")
    apply_override(tree, "algorithm.k=all")
    assert tree == {"algorithm": {"lambda": 0.5, "k": "all"}, "data": {"images_per_class": None}}
    with pytest.raises(ConfigError):
        apply_override(tree, "no_equals_sign")
    with pytest.raises(ConfigError) as err:
        apply_override({"rounds": 3}, "rounds.x=1")
    assert err.value.key == "rounds"


def test_missing_or_broken_config_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match="nope.yaml"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("rounds: [1,\n")
    with pytest.raises(ConfigError, match="bad.yaml"):
        load_config(bad)
    listy = tmp_path / "list.yaml"
    listy.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(listy)


def test_integer_accepted_where_float_expected_but_not_bool():
    assert load_config(QUICKSTART, ["train.lr=1"]).train.lr == 1.0
    with pytest.raises(ConfigError):
        load_config(QUICKSTART, ["train.lr=true"])
