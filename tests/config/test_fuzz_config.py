"""Property-based bad input: every generated bad config or override is exit 2 and one line naming the key.

The expected key and type of every setting are transcribed by hand from the configuration reference's table
(docs/reference/configuration.md; KEYS below), not read from mpicd.config.sections, so a lost bound or type
check fails here. Each example is one valid base config with exactly one thing broken, so the culprit is known
in advance: wrong types, values out of range, huge and negative numbers, strings where numbers belong, unknown
keys at every level, keys under a value, sections and whole files that are not mappings, broken YAML,
duplicate keys, bytes that are not UTF-8. Sections are dropped from the base at random (a missing section
means its defaults, so the base stays valid). Hypothesis runs in-process through ``mpicd check`` for breadth;
a few examples go through real ``python -m mpicd check`` and ``mpiexec -n 2 python -m mpicd run`` to show both
print the same single message.
"""

from __future__ import annotations

import contextlib
import io
import math
import signal
import string
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, Phase, given, settings, strategies as st

from mpicd.cli import main
from mpicd.config.loading import load_config
from mpicd.config.sections import Config
from mpicd.config.text import describe

from conftest import mpicd_cli, mpiexec


@dataclass(frozen=True)
class Key:
    """One setting as the README describes it: kind int | float | str | choice | bool | list; bounds; null allowed."""

    kind: str
    lo: float | None = None  # lower bound
    lo_open: bool = False  # True: the bound itself is out (gt), else it is in (ge)
    hi: float | None = None
    hi_open: bool = True
    optional: bool = False
    choices: tuple = ()
    always_bad: bool = False  # any non-null value is an error for the base (breast_cancer ignores it)


KEYS = {
    "clients": Key("int", 1),
    "rounds": Key("int", 1),
    "seed": Key("int", 0),
    "device": Key("choice", choices=("auto", "cpu", "cuda")),
    "output": Key("str"),
    "clients_per_rank": Key("choice", choices=("one", "balanced")),
    "participation": Key("float", 0, True, 1, False),
    "on_nonfinite": Key("choice", choices=("abort", "skip")),
    "data.name": Key("choice", choices=("breast_cancer", "medmnist", "imagefolder", "aptos", "covid")),
    "data.display_name": Key("str", optional=True, always_bad=True),
    "data.path": Key("str", optional=True, always_bad=True),
    "data.image_size": Key("int", 8, optional=True, always_bad=True),
    "data.classes": Key("list", optional=True, always_bad=True),
    "data.label_map": Key("list", optional=True, always_bad=True),
    "data.test_fraction": Key("float", 0, True, 1),
    "data.val_fraction": Key("float", 0, True, 1),
    "data.split_seed": Key("int", 0),
    "data.images_per_class": Key("int", 1, optional=True),
    "data.skew": Key("float", 0, False, 1),
    "data.skew_mode": Key("choice", choices=("symmetric", "authors")),
    "data.partition": Key("choice", choices=("expertise", "natural", "dirichlet")),
    "data.dirichlet_alpha": Key("float", 0, True, optional=True, always_bad=True),  # dirichlet only
    "data.images_per_client": Key("int", 1, optional=True, always_bad=True),  # natural, dirichlet only
    "model.name": Key("choice", choices=("auto", "lenet", "fedavgcnn", "mlp", "resnet18")),
    "model.feature_dim": Key("int", 1, hi=65536, hi_open=False),
    "model.hidden": Key("int", 1, hi=65536, hi_open=False),
    "train.optimizer": Key("choice", choices=("adam", "sgd")),
    "train.lr": Key("float", 0, True),
    "train.momentum": Key("float", 0, False, 1),
    "train.weight_decay": Key("float", 0),
    "train.batch_size": Key("int", 1),
    "train.local_epochs": Key("int", 1),
    "train.eval_batch_size": Key("int", 1),
    "train.optimizer_state": Key("choice", choices=("keep", "reset")),
    "train.sampler": Key("choice", choices=("shuffle", "balanced")),
    "train.loss": Key("choice", choices=("ce", "balanced")),
    "eval.every": Key("int", 1),
    "eval.train_split": Key("bool"),
    "eval.shared_models": Key("choice", choices=("once", "per_client")),
    "eval.diagnostics": Key("bool"),
    "eval.share_train_metrics": Key("bool"),
    "checkpoint.every": Key("int", 0),
    "checkpoint.flush_every": Key("int", 1, choices=("auto",)),
    "debug.fail_rank": Key("int", 0, optional=True),
    "debug.fail_round": Key("int", 0),
    "debug.fail_kind": Key("choice", choices=("exception", "exit", "kill", "hang", "nan")),
    "debug.fail_at": Key(
        "choice", choices=("before_exchange", "in_exchange", "after_epoch", "in_write", "in_checkpoint")
    ),
    "timeout.round_seconds": Key("float", 0, True, optional=True),
    "algorithm.name": Key(
        "choice", choices=("codistill", "local", "fedavg", "fedproto", "feddistill", "fedamp", "centralized")
    ),
    "algorithm.lambda": Key("float", 0),
    "algorithm.k": Key("int", 1, choices=("all",)),
    "algorithm.teacher_per": Key("choice", choices=("round", "batch")),
    "algorithm.classes": Key("choice", choices=("expertise", "all")),
    "algorithm.share": Key("choice", choices=("features", "logits")),
    "algorithm.term_mean": Key("choice", choices=("matching", "batch")),
    "privacy.epsilon": Key("float", 0, True, optional=True),
    "privacy.delta": Key("float", 0, True, 1, True),
    "privacy.clip": Key("float", 0, True),
    "privacy.noise_multiplier": Key("float", 0, optional=True),
    "privacy.sample_rate": Key("float", 0, True, 1, False),
    "privacy.counts": Key("choice", choices=("public", "noised")),
    "privacy.noise": Key("choice", choices=("secret", "seeded")),
    "privacy.key_dir": Key("str", optional=True),
    "privacy.nonce": Key("str", optional=True, always_bad=True),  # 16 hex digits only: a fuzzed string is none
}
SECTIONS = ("data", "model", "train", "eval", "checkpoint", "debug", "timeout", "algorithm")
KNOWN = {section: {k.split(".")[1] for k in KEYS if k.startswith(section + ".")} for section in SECTIONS}
KNOWN[""] = {k for k in KEYS if "." not in k} | set(SECTIONS) | {"privacy"}  # privacy: off in BASE (null)
KNOWN["privacy"] = {k.split(".")[1] for k in KEYS if k.startswith("privacy.")}
# A valid config for 2 ranks (the data limit: a client holds at most 74 training images of a class).
BASE = {
    "clients": 2,
    "rounds": 1,
    "seed": 0,
    "device": "cpu",
    "output": "results/fuzz.h5",
    "data": {"name": "breast_cancer", "skew": 0.6},
    "model": {"name": "mlp", "feature_dim": 8, "hidden": 8},
    "train": {"optimizer": "adam", "lr": 0.001, "batch_size": 32},
    "eval": {"every": 1},
    "checkpoint": {"every": 0},
    "debug": {"fail_kind": "exception"},
    "timeout": {"round_seconds": None},
    "algorithm": {"name": "codistill", "lambda": 1.0, "k": "all"},
}
TOO_MANY_CLIENTS = 213  # breast_cancer has 212 malignant cases in all, so fewer training images than this


def test_the_hand_written_table_covers_every_declared_key():
    declared = {row.key for row in describe(Config)} | {"algorithm.name"}
    codistill = {"algorithm.lambda", "algorithm.k", "algorithm.teacher_per", "algorithm.classes"}
    assert declared | codistill | {"algorithm.share", "algorithm.term_mean"} == set(KEYS)


# --------------------------------------------------------------------------- values


def not_numeric_text() -> st.SearchStrategy[str]:
    """Strings no one writes as a number: a letter other than e/E (or %, $, _) between optional digits."""
    middle = "".join(c for c in string.ascii_letters if c not in "eE") + "%$_"
    return st.builds(
        lambda a, m, b: a + m + b,
        st.text("0123456789", max_size=3),
        st.text(middle, min_size=1, max_size=5),
        st.text("0123456789", max_size=3),
    )


def other_types(*exclude: str) -> st.SearchStrategy:
    """Values of the YAML types not named in ``exclude``."""
    kinds = {
        "bool": st.booleans(),
        "list": st.lists(st.integers(-3, 3) | st.text(string.ascii_letters, max_size=3), max_size=3),
        "dict": st.dictionaries(
            st.text(string.ascii_lowercase, min_size=1, max_size=3), st.integers(0, 3), min_size=1, max_size=2
        ),
        "text": not_numeric_text() | st.sampled_from(["", " ", "１", "٣", "1e-3x", "0x1G", "1,5", "1 000"]),
        "fraction": st.floats(0.05, 1e6).filter(lambda v: v != int(v)),
        "nonfinite": st.sampled_from([math.nan, math.inf, -math.inf]),
        "int": st.integers(-5, 5),
        "null": st.none(),
    }
    return st.one_of(*[s for name, s in kinds.items() if name not in exclude])


def huge_int() -> st.SearchStrategy:
    """At or beyond 2**63: no numpy/torch/HDF5 integer holds it, written as an int or as people write it."""
    return st.one_of(
        st.integers(2**63, 10**40),
        st.integers(-(10**40), -(2**63) - 1),
        st.sampled_from(["1e30", "1e300", "9" * 30, "1e999999999", "-1e30", 10**400]),
    )


def bad_value(name: str) -> st.SearchStrategy:
    """A value ``name`` must refuse: of another type, out of range, huge, negative, or text."""
    key = KEYS[name]
    null = ("null",) if key.optional else ()
    if key.kind == "int":
        below = st.integers(-(10**6), int(key.lo) - 1)
        text = not_numeric_text().filter(lambda s: s not in key.choices)  # algorithm.k takes "all"
        out = [below, huge_int(), text, other_types("int", "text", *null)]
        if name == "clients":
            out.append(st.integers(TOO_MANY_CLIENTS, 2**62))
        if name == "data.images_per_class":
            out.append(st.integers(TOO_MANY_CLIENTS, 2**62))
        if name == "algorithm.k":
            out.append(st.integers(75, 2**62))  # more than a client holds of a class
        if name == "debug.fail_rank":
            out.append(st.integers(2, 2**62))  # ranks are 0..1
        if key.always_bad:
            out.append(st.integers(int(key.lo), 10**6))
        return st.one_of(*out)
    if key.kind == "float":
        lo, hi = key.lo, key.hi
        below = st.floats(-1e300, lo, allow_nan=False).filter(lambda v: v <= lo if key.lo_open else v < lo)
        below |= st.integers(-(10**6), -1)
        out = [below, other_types("int", "fraction", "nonfinite", *null), st.sampled_from([10**400, "1e400", "-1e400"])]
        out.append(st.sampled_from([math.nan, math.inf, -math.inf]))
        if hi is not None:
            out.append(st.floats(hi, 1e300, exclude_min=not key.hi_open, allow_nan=False) | st.integers(1, 10**30))
        return st.one_of(*out)
    if key.kind == "str":
        return other_types("text", *null) | (not_numeric_text() if key.always_bad else st.nothing())
    if key.kind == "choice":
        text = st.text(string.printable, max_size=12).filter(lambda s: s not in key.choices)
        return text | other_types("text")
    if key.kind == "bool":  # true | false only: no 0/1, no "yes"
        return other_types("bool", *null)
    if key.kind == "list":  # data.classes: breast_cancer takes no class list, and a list must hold strings
        return st.lists(st.text(string.ascii_letters, max_size=4), max_size=3) | other_types("null")
    raise AssertionError(name)


@dataclass(frozen=True)
class Case:
    """A config file's contents (a tree, or raw bytes) plus overrides, and the culprit every message must name."""

    tree: object
    overrides: tuple[str, ...]
    key: str  # the dotted key the message names ("" for the file itself)
    raw: bytes | None = None


def flow(value) -> str:
    """``value`` as one line of YAML that reads back as ``value`` (an override's right-hand side)."""
    text = yaml.safe_dump(value, default_flow_style=True, width=10**9, allow_unicode=True).strip()
    return text.removesuffix("...").strip()


def same(a, b) -> bool:
    return (a != a and b != b) or (type(a) is type(b) and a == b)


@st.composite
def base_tree(draw) -> dict:
    tree = yaml.safe_load(yaml.safe_dump(BASE))
    for section in draw(st.sets(st.sampled_from(SECTIONS))):
        del tree[section]
    return tree


def with_method(tree: dict, dotted: str) -> dict:
    """An algorithm section needs its name (a section without one is its own error), so one is put back."""
    if dotted.startswith("algorithm.") and "algorithm" not in tree:
        tree["algorithm"] = {"name": "codistill"}
    return tree


def place(tree: dict, dotted: str, value) -> dict:
    *path, leaf = dotted.split(".")
    node = tree
    for part in path:
        node = node.setdefault(part, {})
    node[leaf] = value
    return tree


@st.composite
def bad_setting(draw, name: str | None = None) -> Case:
    """One known key (``name``, else any) set to a value it must refuse, in the file or as an override."""
    name = name or draw(st.sampled_from(sorted(KEYS)))
    tree = with_method(draw(base_tree()), name)
    value = draw(bad_value(name))
    if draw(st.booleans()):
        return Case(place(tree, name, value), (), name)
    assert same(yaml.safe_load(flow(value)), value), value
    return Case(tree, (f"{name}={flow(value)}",), name)


IDENT = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,10}", fullmatch=True)
ODD_KEYS = st.sampled_from(["a b", "ключ", "1", "-", "a-b", "x\ty", "a\nb", "Clients", "DATA", " "])


def shown(key) -> str:
    return key if isinstance(key, str) and key.isprintable() and key.strip() == key and key else repr(key)


@st.composite
def unknown_key(draw) -> Case:
    """A key no section has, at the top or inside any section (YAML files also allow non-string keys)."""
    section = draw(st.sampled_from(("",) + SECTIONS))
    tree = with_method(draw(base_tree()), section + ".")
    in_file = draw(st.booleans())
    names = IDENT | ODD_KEYS | (st.integers(-3, 3) | st.booleans() | st.none() if in_file else st.nothing())
    name = draw(
        names.filter(
            lambda k: (
                k not in KNOWN[section]
                and not (not in_file and (not isinstance(k, str) or "\n" in k or not k.strip() or k.strip() != k))
            )
        )
    )
    value = draw(st.integers(0, 3) | st.text(string.ascii_letters, max_size=3))
    dotted = f"{section}.{shown(name)}" if section else shown(name)
    if in_file:
        (tree if not section else tree.setdefault(section, {}))[name] = value
        return Case(tree, (), dotted)
    return Case(tree, (f"{section + '.' if section else ''}{name}={flow(value)}",), dotted)


@st.composite
def key_under_a_value(draw) -> Case:
    """``data.skew.x=1``: a key inside something that is a number, a string or a list."""
    name = draw(st.sampled_from([k for k, v in KEYS.items() if not v.optional and k != "algorithm.name"]))
    tree = with_method(draw(base_tree()), name)
    inner = draw(IDENT)
    if draw(st.booleans()):
        return Case(place(tree, name, {inner: 1}), (), name)
    return Case(tree, (f"{name}=1", f"{name}.{inner}=1") if KEYS[name].kind != "str" else (f"{name}.{inner}=1",), name)


@st.composite
def section_not_a_mapping(draw) -> Case:
    tree = draw(base_tree())
    section = draw(st.sampled_from(SECTIONS))
    grouped = section in ("data", "model", "algorithm")  # a string there selects an entry by name
    value = draw(other_types("null", "dict", *(("text",) if grouped else ())))
    if draw(st.booleans()):
        tree[section] = value
        return Case(tree, (), section)
    return Case(tree, (f"{section}={flow(value)}",), section)


@st.composite
def file_not_a_mapping(draw) -> Case:
    value = draw(other_types("null", "dict") | st.lists(st.dictionaries(IDENT, st.integers(0, 2)), min_size=1))
    return Case(value, (), "")


BROKEN_YAML = [
    b"rounds: [1\n",
    b"a: b: c\n",
    b"rounds:\t3\n\tseed: 1\n",
    b"rounds: 'abc\n",
    b"{\n",
    b"- a\nb: 1\n",
    b"rounds: 3\n---\nseed: 1\n",
    b"rounds: *nowhere\n",
    b"? [a, b]\n: 1\n",
    b"rounds: !!python/object/apply:os.system [true]\n",
    b"rounds: !!binary 'a'\n",
    b"rounds: " + b"[" * 1200 + b"]" * 1200 + b"\n",
    b"rounds: 1" + b"0" * 5000 + b"\n",
    b"rounds: 2\n\xff\xfe\n",
    b"output: caf\xe9.h5\n",
    b"\x00\x01\x02",
]
DUPLICATES = [
    (b"rounds: 3\nrounds: 5\n", "rounds"),
    (b"data:\n  skew: 0.2\n  skew: 0.4\n", "data.skew"),
    (b"train: {lr: 0.1, lr: 0.2}\n", "train.lr"),
    (b"data: {}\ndata: {}\n", "data"),
]


@st.composite
def broken_file(draw) -> Case:
    """Not YAML, not UTF-8, or a key twice (YAML keeps the last silently: a silent wrong number)."""
    if draw(st.booleans()):
        return Case(None, (), "", draw(st.sampled_from(BROKEN_YAML)))
    raw, key = draw(st.sampled_from(DUPLICATES))
    return Case(None, (), key, raw)


BROKEN_OVERRIDES = [
    "rounds=[1",
    "rounds={",
    "rounds=*x",
    "rounds='abc",
    "rounds=!!python/name:os.system",
    "rounds=" + "[" * 1200,
    "rounds=1" + "0" * 5000,
    "rounds",
    "rounds.=1",
    ".rounds=1",
    "data..skew=1",
]


@st.composite
def broken_override(draw) -> Case:
    override = draw(st.sampled_from(BROKEN_OVERRIDES))
    key = override.split("=")[0]
    return Case(draw(base_tree()), (override,), "rounds" if key == "rounds" else key)


@st.composite
def wrong_clients(draw) -> Case:
    """clients that no rank count can match: zero, negative, not an integer, more than the data holds."""
    tree = draw(base_tree())
    value = draw(
        st.one_of(
            st.integers(-(10**9), 0),
            st.integers(TOO_MANY_CLIENTS, 2**62),
            huge_int(),
            not_numeric_text(),
            other_types("int", "text"),
        )
    )
    return Case(tree, (f"clients={flow(value)}",), "clients")


CLASSES = {
    "bad_setting": bad_setting(),
    "unknown_key": unknown_key(),
    "key_under_a_value": key_under_a_value(),
    "section_not_a_mapping": section_not_a_mapping(),
    "file_not_a_mapping": file_not_a_mapping(),
    "broken_file": broken_file(),
    "broken_override": broken_override(),
    "wrong_clients": wrong_clients(),
}


# --------------------------------------------------------------------------- checking


@contextlib.contextmanager
def time_limit(seconds: float):
    """A hang fails the example instead of stalling the suite."""

    def expired(signum, frame):
        raise TimeoutError(f"no answer within {seconds} s (a hang)")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def write(case: Case, folder: Path) -> Path:
    path = folder / "config.yaml"
    path.write_bytes(
        case.raw if case.raw is not None else yaml.safe_dump(case.tree, allow_unicode=True, width=10**9).encode()
    )
    return path


def check_in_process(path: Path, overrides) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with time_limit(30), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["check", str(path), *overrides])
    return code, out.getvalue(), err.getvalue()


def assert_names(case: Case, path: Path, code: int, stderr: str) -> str:
    """Exit 2 and exactly one line, ``mpicd: config error: KEY: ...`` (a file's fault: naming the file)."""
    lines = stderr.splitlines()
    assert code == 2 and len(lines) == 1, (case, code, stderr)
    line = lines[0]
    assert "Traceback" not in stderr
    if case.key:
        assert line.startswith(f"mpicd: config error: {case.key}: "), (case, line)
    else:
        assert line.startswith("mpicd: config error: ") and repr(str(path)) in line, (case, line)
    return line


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz")


def test_the_base_config_is_valid(folder):
    path = write(Case(BASE, (), ""), folder)
    code, out, err = check_in_process(path, ())
    assert code == 0, err
    assert "breast_cancer" in out


FAST = settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


def refused(case: Case, folder: Path) -> None:
    path = write(case, folder)
    code, _, err = check_in_process(path, case.overrides)
    assert_names(case, path, code, err)


@pytest.mark.parametrize("kind", sorted(set(CLASSES) - {"bad_setting"}))
def test_every_bad_input_is_exit_2_and_one_line_naming_the_key(kind, folder):
    FAST(given(case=CLASSES[kind])(lambda case: refused(case, folder)))()


@pytest.mark.parametrize("name", sorted(KEYS))
def test_every_key_refuses_every_kind_of_bad_value(name, folder):
    """Per key: another type, below or above its range, huge, negative, text: in a file or an override."""
    settings(FAST, max_examples=15)(given(case=bad_setting(name))(lambda case: refused(case, folder)))()


@settings(max_examples=10, deadline=None, derandomize=True, database=None)
@given(tree=base_tree())
def test_missing_sections_mean_their_defaults(tree, folder):
    path = write(Case(tree, (), ""), folder)
    code, _, err = check_in_process(path, ())
    assert code == 0, err
    cfg = load_config(path)
    for section in SECTIONS:
        if section not in tree:
            assert getattr(cfg, section) == getattr(Config(), section)
    assert (cfg.clients, cfg.data.skew) == (2, 0.6 if "data" in tree else 0.0)  # what is written still counts


SIZES = {"model.feature_dim", "model.hidden"}  # a valid but large one would allocate a large model
SCALARS = st.none() | st.booleans() | st.integers(-1000, 1000) | st.floats(allow_nan=True) | st.text(max_size=8)
TREES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(sorted(KNOWN[""] | {"name", "skew", "lr", "k", "lambda", "x"})) | st.text(max_size=4),
            inner,
            max_size=4,
        )
    ),
    max_leaves=12,
)


@settings(max_examples=100, deadline=None, derandomize=True, database=None)
@given(
    tree=TREES,
    overrides=st.lists(
        st.builds(
            lambda k, v: f"{k}={v}",
            st.sampled_from(sorted(set(KEYS) - SIZES)) | IDENT,
            st.text(string.printable, max_size=8) | st.integers(-1000, 1000).map(str),
        ),
        max_size=3,
    ),
)
def test_any_yaml_tree_and_overrides_either_load_or_fail_in_one_line(tree, overrides, folder):
    """Random structure (bounded numbers, so a valid one is cheap): exit 0, or exit 2 with one line."""
    path = folder / "any.yaml"
    path.write_text(yaml.safe_dump(tree, allow_unicode=True))
    code, _, err = check_in_process(path, overrides)
    assert code in (0, 2), (code, err)
    if code == 2:
        assert len(err.splitlines()) == 1 and err.startswith("mpicd: config error: "), err


# --------------------------------------------------------------------------- the real commands agree

AGREE = ["bad_setting", "unknown_key", "file_not_a_mapping", "broken_override"]


@pytest.mark.parametrize("kind", AGREE)
def test_check_and_run_under_mpiexec_print_the_same_one_line(kind, folder):
    @settings(max_examples=1, deadline=None, derandomize=True, database=None, phases=[Phase.generate])
    @given(case=CLASSES[kind])
    def prop(case):
        path = write(case, folder)
        checked = mpicd_cli("check", str(path), *case.overrides, timeout=120)
        line = assert_names(case, path, checked.returncode, checked.stderr)
        ran = mpiexec(
            2, "-m", "mpicd", "run", str(path), *case.overrides, "--out", str(folder / "never.h5"), timeout=120
        )
        assert ran.returncode == 2 and "Traceback" not in ran.stderr, ran.stderr
        assert [x for x in ran.stderr.splitlines() if "config error" in x] == [line]
        assert not (folder / "never.h5").exists()

    prop()


@pytest.mark.parametrize("key", ["model.feature_dim", "model.hidden"])
def test_a_model_too_large_to_allocate_is_a_config_error(key, folder):
    """10**15 weights per row need more than the 2**47 bytes of address space, so this fails at once."""
    refused(Case(BASE, (f"{key}=1e15",), key), folder)


def test_a_rank_count_that_differs_from_clients_is_exit_2_naming_clients(folder):
    path = write(Case(place(yaml.safe_load(yaml.safe_dump(BASE)), "clients", 3), (), ""), folder)
    ran = mpiexec(2, "-m", "mpicd", "run", str(path), "--out", str(folder / "never.h5"), timeout=120)
    lines = [x for x in ran.stderr.splitlines() if "config error" in x]
    assert ran.returncode == 2 and "Traceback" not in ran.stderr, ran.stderr
    assert len(lines) == 1 and lines[0].startswith(
        "mpicd: config error: clients: the config has 3 clients but the job has 2 MPI ranks"
    ), ran.stderr
