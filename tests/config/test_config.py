"""Config validation: every bad value is one ConfigError naming the key."""

from dataclasses import dataclass

import pytest

from mpicd.algorithms import resolve
from mpicd.config.loading import apply_override, load_config
from mpicd.config.sections import Config, ConfigError, to_mapping
from mpicd.core.schema import from_mapping
from mpicd.sweep.grid import load_sweep

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


@pytest.mark.parametrize(
    "override, key",
    [
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
    ],
)
def test_bad_values_name_the_key(override, key):
    with pytest.raises(ConfigError) as err:
        load_config(QUICKSTART, [override])
    assert err.value.key == key
    assert key in str(err.value)


@pytest.mark.parametrize(
    "override, key",
    [
        ("algorithm.lambda=-1", "algorithm.lambda"),
        ("algorithm.k=0", "algorithm.k"),
        ("algorithm.k=some", "algorithm.k"),
        ("algorithm.temperature=2", "algorithm.temperature"),
        ("algorithm.name=fedsomething", "algorithm.name"),
    ],
)
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


# --------------------------------------------------------------------------- config groups


def test_a_group_name_selects_that_entry_with_its_defaults():
    cfg = load_config(QUICKSTART, ["algorithm=fedavg"])
    assert cfg.algorithm == {"name": "fedavg"}
    assert load_config(QUICKSTART, ["algorithm=fedproto", "algorithm.lambda=0.5"]).algorithm == {
        "name": "fedproto",
        "lambda": 0.5,
    }
    model = load_config(QUICKSTART, ["model.hidden=7", "model=resnet18"]).model  # quickstart: mlp, hidden 64
    assert (model.name, model.hidden, model.feature_dim) == ("resnet18", 64, 200)
    data = load_config(QUICKSTART, ["data=breast_cancer"]).data  # quickstart's skew 0.6 goes with the section
    assert (data.name, data.skew, data.test_fraction) == ("breast_cancer", 0.0, 0.2)
    assert load_config(QUICKSTART, ["algorithm={name: fedavg}"]).algorithm == {"name": "fedavg"}  # as before


def test_a_group_name_in_a_yaml_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("clients: 2\nalgorithm: fedamp\nmodel: mlp\n")
    cfg = load_config(path)
    assert cfg.algorithm == {"name": "fedamp"} and cfg.model.name == "mlp"
    cls, params = resolve(cfg.algorithm)
    assert cls.name == "fedamp" and params.lambda_ == 0.1 and params.alpha == "auto"


def test_switching_method_by_name_with_the_old_methods_keys_says_use_the_group():
    """The config records the switch; the registry refuses it where the algorithm is chosen (resolve)."""
    switched = load_config(QUICKSTART, ["algorithm.name=fedavg"])  # quickstart: codistill with lambda and k
    with pytest.raises(ConfigError) as err:
        resolve(switched.algorithm)
    assert err.value.key == "algorithm.name"
    assert "algorithm=fedavg" in str(err.value) and "k, lambda" in str(err.value)
    with pytest.raises(ConfigError, match=r"fedproto takes no k \(left from codistill\): .*algorithm=fedproto "):
        resolve(load_config(QUICKSTART, ["algorithm.name=fedproto"]).algorithm)  # fedproto has a lambda, not a k
    carried = load_config(QUICKSTART, ["algorithm={name: fedproto, lambda: 0.5}", "algorithm.name=feddistill"])
    assert carried.algorithm == {"name": "feddistill", "lambda": 0.5}  # keys the new method has are kept
    cls, params = resolve(carried.algorithm)
    assert cls.name == "feddistill" and params.lambda_ == 0.5
    assert to_mapping(carried)["algorithm"] == {"name": "feddistill", "lambda": 0.5}  # a plain mapping again


def test_a_switch_is_judged_as_it_was_made_whatever_follows():
    """Each ``algorithm.name=X`` is checked against the keys the section held then, in order, even when a
    later override switches back or replaces the section; an unknown X is left to resolve's own error."""
    for overrides, message in (
        (["algorithm.name=fedavg", "algorithm.name=codistill"], "fedavg takes no k, lambda (left from codistill)"),
        (["algorithm.name=fedavg", "algorithm=fedavg"], "fedavg takes no k, lambda (left from codistill)"),
        (["algorithm.name=bogus", "algorithm.name=fedavg"], "fedavg takes no k, lambda (left from bogus)"),
        (["algorithm.name=feddistill", "algorithm.name=fedproto"], "feddistill takes no k (left from codistill)"),
        (["algorithm.k=5", "algorithm.name=local"], "local takes no k, lambda (left from codistill)"),
    ):
        with pytest.raises(ConfigError) as err:
            resolve(load_config(QUICKSTART, overrides).algorithm)
        assert err.value.key == "algorithm.name" and message in str(err.value), overrides
    with pytest.raises(ConfigError, match="must be one of"):
        resolve(load_config(QUICKSTART, ["algorithm.name=bogus"]).algorithm)
    assert load_config(QUICKSTART, ["algorithm={name: codistill}", "algorithm.name=fedavg"]).algorithm == {
        "name": "fedavg"
    }


def test_unknown_key_messages_list_the_keys_allowed_there():
    with pytest.raises(ConfigError) as err:
        load_config(QUICKSTART, ["train.learning_rate=0.1"])
    assert str(err.value).endswith(
        "(known keys here: batch_size, eval_batch_size, local_epochs, loss, lr, momentum, optimizer, "
        "optimizer_state, sampler, weight_decay)"
    )

    @dataclass
    class Nothing:
        pass

    with pytest.raises(ConfigError, match=r"algorithm\.k: unknown key \(no keys are allowed here\)"):
        from_mapping(Nothing, {"k": 3}, "algorithm")
    with pytest.raises(ConfigError, match=r"unknown key \(known keys here: name\)"):
        from_mapping(Nothing, {"k": 3}, "algorithm", also_known=("name",))


# --------------------------------------------------------------------------- numbers as people write them


@pytest.mark.parametrize(
    "override, get, expected",
    [
        ("train.lr=1e-3", lambda c: c.train.lr, 0.001),
        ("train.lr=1E-3", lambda c: c.train.lr, 0.001),
        ("train.lr=2.5e-4", lambda c: c.train.lr, 0.00025),
        ("train.weight_decay=5e4", lambda c: c.train.weight_decay, 50000.0),
        ("rounds=5e1", lambda c: c.rounds, 50),
        ("data.images_per_class=1.5e2", lambda c: c.data.images_per_class, 150),
        ("train.batch_size=32.0", lambda c: c.train.batch_size, 32),
        ("data.path=1e3", lambda c: c.data.path, "1e3"),  # a string key keeps the string
    ],
)
def test_numbers_in_exponent_notation_where_the_key_is_numeric(override, get, expected):
    value = get(load_config(QUICKSTART, [override]))
    assert value == expected and type(value) is type(expected)


@pytest.mark.parametrize(
    "override, key",
    [
        ("rounds=1e-3", "rounds"),
        ("train.batch_size=2.5e0", "train.batch_size"),
        ("train.lr=1e-3x", "train.lr"),
        ("train.lr=nan", "train.lr"),
        ("train.lr=0e0", "train.lr"),
        ("train.lr=1e400", "train.lr"),
    ],
)
def test_numbers_that_are_still_wrong(override, key):
    with pytest.raises(ConfigError) as err:
        load_config(QUICKSTART, [override])
    assert err.value.key == key


def test_exponent_numbers_in_yaml_files_and_algorithm_sections(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("rounds: 1e1\ntrain:\n  lr: 1e-3\nalgorithm:\n  name: fedamp\n  sigma: 2e-4\n  alpha: 5E-5\n")
    cfg = load_config(path)
    assert (cfg.rounds, cfg.train.lr) == (10, 0.001)
    _, params = resolve(cfg.algorithm)
    assert (params.sigma, params.alpha) == (0.0002, 0.00005)
    _, params = resolve(load_config(QUICKSTART, ["algorithm=fedamp", "algorithm.sigma=3e-4"]).algorithm)
    assert params.sigma == 0.0003


def test_exponent_numbers_in_a_sweep_grid(tmp_path):
    path = tmp_path / "sweep.yaml"
    path.write_text(
        f"config: {QUICKSTART}\noutput_dir: {tmp_path}\ngrid:\n  train.lr: [1e-3, 5e-4]\n"
        "  algorithm: [fedavg, codistill]\n"
    )
    runs = load_sweep(path)
    assert [load_config(r.config, r.overrides).train.lr for r in runs] == [0.001, 0.001, 0.0005, 0.0005]
    assert [load_config(r.config, r.overrides).algorithm["name"] for r in runs[:2]] == ["fedavg", "codistill"]
    assert runs[2].output.name == "0002_lr=5e-4_algorithm=fedavg.h5"
