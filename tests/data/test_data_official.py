"""The official MedMNIST v2 files: ``data.label_map`` and ``data.classes``, the md5 check against
MedMNIST's published checksums, RetinaMNIST and BreastMNIST as ../shared/data/README.md counts
them, and C > 2 classes end to end (every algorithm under a real mpiexec).

Tests on the real files skip when ../shared/data lacks them; the rest run on fixtures in the
official layout."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from fixtures_data import write_medmnist
from mpicd.config.loading import load_config
from mpicd.config.sections import ConfigError, DataConfig
from mpicd.data import load_dataset
from mpicd.data.medmnist import md5_check
from mpicd.results.reader import Results
from mpicd.run.plan import prepare

from conftest import ROOT, mpicd_cli, mpicd_run, mpiexec

SHARED = ROOT.parent / "shared" / "data"
RETINA_CONFIG = ROOT / "configs" / "retinamnist.yaml"
BREAST_CONFIG = ROOT / "configs" / "breastmnist.yaml"
# Written out here, not read from mpicd: MedMNIST's medmnist/info.py (v2.1.0), the 28x28 files.
PUBLISHED_MD5 = {
    "pneumoniamnist": "28209eda62fecd6e6a2d98b1501bb15f",
    "retinamnist": "bd4c0672f1bba3e3a89f0e4e876791e4",
    "breastmnist": "750601b1f35ba3300ea97c75c52ff8f6",
}

# A 5-label file: counts by hand, train 0:3 1:2 2:3 3:2 4:2, val one of each, test 0:2, others 1.
TRAIN = [0, 1, 2, 3, 4, 0, 2, 2, 4, 0, 1, 3]
LABELS5 = {"train": TRAIN, "val": [4, 3, 2, 1, 0], "test": [1, 0, 4, 2, 3, 0]}


def require(name: str) -> Path:
    path = SHARED / f"{name}.npz"
    if not path.is_file():
        pytest.skip(f"real data absent: {path} (see ../shared/data/README.md)")
    return path


def load(path: Path, **kw):
    return load_dataset(DataConfig(name="medmnist", path=str(path), **kw))


def md5_of(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


# --------------------------------------------------------------------------- label_map on a fixture


def test_label_map_merges_labels_by_position(tmp_path):
    write_medmnist(tmp_path / "x.npz", LABELS5, rgb=True)
    plain = load(tmp_path / "x.npz")
    ds = load(tmp_path / "x.npz", label_map=[0, 1, 1, 1, 1], classes=["no DR", "DR"])
    assert ds.num_classes == 2 and ds.class_names == ("no DR", "DR")
    assert ds.train.y.tolist() == [0, 1, 1, 1, 1, 0, 1, 1, 1, 0, 1, 1]
    assert np.bincount(ds.train.y).tolist() == [3, 9]
    assert np.bincount(ds.val.y).tolist() == [1, 4] and np.bincount(ds.test.y).tolist() == [2, 4]
    for split in ("train", "val", "test"):  # the images are untouched, in the file's order
        np.testing.assert_array_equal(getattr(ds, split).x, getattr(plain, split).x)
    assert ds.label_map == (0, 1, 1, 1, 1) and plain.label_map is None
    assert ds.label_map_text == "[0, 1, 1, 1, 1]: label 0 -> 'no DR'; labels 1, 2, 3, 4 -> 'DR'"
    assert plain.label_map_text == "none (the file's own labels)"
    assert plain.num_classes == 5 and np.bincount(plain.train.y).tolist() == [3, 2, 3, 2, 2]


def test_label_map_reorders_and_names_merged_classes_by_their_labels(tmp_path):
    """[2, 0, 1, 0, 2]: label 0 -> 2, 1 -> 0, 2 -> 1, 3 -> 0, 4 -> 2 (an inverse or a by-value reading
    of the list gives other labels)."""
    write_medmnist(tmp_path / "x.npz", LABELS5)
    ds = load(tmp_path / "x.npz", label_map=[2, 0, 1, 0, 2])
    assert ds.train.y.tolist() == [2, 0, 1, 0, 2, 2, 1, 1, 2, 2, 0, 0]
    assert ds.val.y.tolist() == [2, 0, 1, 0, 2] and ds.test.y.tolist() == [0, 2, 2, 1, 0, 2]
    assert np.bincount(ds.train.y).tolist() == [4, 3, 5]  # labels 1 + 3, label 2, labels 0 + 4
    assert ds.class_names == ("class1+class3", "class2", "class0+class4")
    assert ds.label_map_text == (
        "[2, 0, 1, 0, 2]: labels 1, 3 -> 'class1+class3'; label 2 -> 'class2'; labels 0, 4 -> 'class0+class4'"
    )


def test_known_names_follow_the_mapping(tmp_path):
    write_medmnist(tmp_path / "breastmnist.npz", {"train": [0, 1, 1], "val": [1, 0], "test": [0, 1]})
    swapped = load(tmp_path / "breastmnist.npz", label_map=[1, 0])
    assert swapped.class_names == ("normal_benign", "malignant") and swapped.train.y.tolist() == [1, 0, 0]
    same = load(tmp_path / "breastmnist.npz", label_map=[0, 1])
    assert same.class_names == ("malignant", "normal_benign") and same.train.y.tolist() == [0, 1, 1]
    assert load(tmp_path / "breastmnist.npz", classes=["m", "b"]).class_names == ("m", "b")


@pytest.mark.parametrize(
    "label_map, fragment",
    [
        ([0, 1, 1, 1], "has 4 entries [0, 1, 1, 1], but"),  # the file has 5 labels
        ([0, 1, 1, 1, 1, 1], "has 6 entries"),
        ([0, 2, 2, 2, 2], "maps no label to class 1"),
        ([0, 0, 0, 0, 0], "at least two classes"),
        ([-1, 0, 1, 1, 1], "must be >= 0"),
        ([1], "at least 2"),
    ],
)
def test_a_bad_label_map_is_one_error_naming_the_key(tmp_path, label_map, fragment):
    write_medmnist(tmp_path / "x.npz", LABELS5)
    with pytest.raises(ConfigError, match=r"data\.label_map: ") as err:
        load(tmp_path / "x.npz", label_map=label_map)
    assert err.value.key == "data.label_map" and fragment in str(err.value)
    if "entries" in fragment:
        assert "has 5 labels 0..4" in str(err.value) and "x.npz" in str(err.value)


def test_class_names_must_fit_the_mapped_classes(tmp_path):
    write_medmnist(tmp_path / "x.npz", LABELS5)
    for kw, fragment in [
        ({"label_map": [0, 1, 1, 1, 1], "classes": ["a", "b", "c"]}, "names 3 classes"),
        ({"classes": ["no DR", "DR"]}, "has 5 classes 0..4"),  # no mapping: the file's 5 labels
        ({"label_map": [0, 1, 1, 1, 1], "classes": ["a", "a"]}, "distinct"),
    ]:
        with pytest.raises(ConfigError) as err:
            load(tmp_path / "x.npz", **kw)
        assert err.value.key == "data.classes" and fragment in str(err.value), (kw, str(err.value))


def test_other_formats_refuse_a_label_map():
    with pytest.raises(ConfigError) as err:
        load_dataset(DataConfig(name="breast_cancer", label_map=[1, 0]))
    assert err.value.key == "data.label_map" and "is not used by data.name='breast_cancer'" in str(err.value)


def test_a_bad_label_map_stops_check_with_exit_2_naming_the_key(tmp_path):
    write_medmnist(tmp_path / "x.npz", LABELS5)
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"clients": 1, "data": {"name": "medmnist", "path": str(tmp_path / "x.npz")}}))
    for override, fragment in [("data.label_map=[0, 1, 1, 1]", "has 4 entries"), ("data.label_map=[0, 2]", "class 1")]:
        result = mpicd_cli("check", str(config), override)
        lines = result.stderr.splitlines()
        assert result.returncode == 2 and len(lines) == 1, (result.returncode, result.stderr)
        assert lines[0].startswith("mpicd: config error: data.label_map: ") and fragment in lines[0], lines[0]


def resolved(config) -> dict:
    """The config as a results file holds it (Plan.resolved_config: the algorithm's keys filled in)."""
    from mpicd.algorithms import resolve
    from mpicd.config.sections import to_mapping

    tree = to_mapping(config)
    cls, params = resolve(config.algorithm)
    tree["algorithm"] = {"name": cls.name, **to_mapping(params)}
    return tree


def test_older_results_without_label_map_compare_equal():
    from mpicd.config.sections import Config, config_difference

    new = resolved(Config())
    old = resolved(Config())
    del old["data"]["label_map"]  # a results file written before the key existed
    assert config_difference(old, new, "the file", "this run") is None
    mapped = resolved(Config(data=DataConfig(name="medmnist", path="x.npz", label_map=[0, 1, 1, 1, 1])))
    old["data"].update(name="medmnist", path="x.npz")
    assert config_difference(old, mapped, "the file", "this run") == (
        "data.label_map: the file has None, this run [0, 1, 1, 1, 1]"
    )


SHARED_LOAD = """
import json, sys
from mpicd.config.sections import Config, DataConfig
from mpicd.mpi.comm import Comm
from mpicd.run.plan import prepare
comm = Comm()
data = DataConfig(name="medmnist", path=sys.argv[1], label_map=[2, 0, 1, 0, 2], classes=["a", "b", "c"])
plan = prepare(Config(clients=comm.size, data=data), comm)
d = plan.dataset
row = [comm.rank, plan.shared is not None, d.label_map, d.md5, d.class_names, d.label_map_text]
with open(f"{sys.argv[2]}/rank{comm.rank}.json", "w") as out:  # a file per rank: mpiexec may interleave stdout lines
    json.dump(row, out)
plan.release()
"""


def test_the_mapping_and_md5_reach_every_rank_of_a_node(tmp_path):
    """One rank per node loads (and hashes) the file; the others get the map, names and md5 with the arrays."""
    write_medmnist(tmp_path / "x.npz", LABELS5)
    result = mpiexec(2, "-c", SHARED_LOAD, str(tmp_path / "x.npz"), str(tmp_path), timeout=120)
    assert result.returncode == 0, result.stderr
    rows = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    text = "[2, 0, 1, 0, 2]: labels 1, 3 -> 'a'; label 2 -> 'b'; labels 0, 4 -> 'c'"
    assert rows == [[r, True, [2, 0, 1, 0, 2], md5_of(tmp_path / "x.npz"), ["a", "b", "c"], text] for r in (0, 1)]


# --------------------------------------------------------------------------- the md5 check


def test_md5_check_names_official_modified_and_unknown_files():
    retina = PUBLISHED_MD5["retinamnist"]
    assert md5_check("retinamnist", retina) == (True, f"official MedMNIST v2 file retinamnist.npz (md5 {retina})")
    assert md5_check("copy", retina) == (
        True,
        f"official MedMNIST v2 file retinamnist.npz (md5 {retina}, read as copy.npz)",
    )
    found = "0123456789abcdef0123456789abcdef"
    official, line = md5_check("breastmnist", found)
    assert not official and f"expected md5 {PUBLISHED_MD5['breastmnist']}" in line and f"found {found}" in line
    official, line = md5_check("pneumoniamnist", "fba64bbd7011d51bc110a3641f8e049d")
    assert not official and "4707 training images" in line and PUBLISHED_MD5["pneumoniamnist"] in line
    official, line = md5_check("x", found)
    assert not official and found in line and all(v in line for v in PUBLISHED_MD5.values())


@pytest.mark.parametrize("name", sorted(PUBLISHED_MD5))
def test_the_real_files_are_hashed_once_and_official(name):
    path = require(name)
    ds = load(path)
    assert ds.md5 == md5_of(path) == PUBLISHED_MD5[name]
    assert md5_check(ds.name, ds.md5)[0]


def test_check_prints_official_for_the_real_file_and_warns_for_a_modified_copy(tmp_path):
    require("breastmnist")
    result = mpicd_cli("check", str(BREAST_CONFIG))
    assert result.returncode == 0, result.stderr
    assert f"data file: official MedMNIST v2 file breastmnist.npz (md5 {PUBLISHED_MD5['breastmnist']})" in result.stdout
    assert "warning" not in result.stdout + result.stderr
    copy = tmp_path / "breastmnist.npz"
    shutil.copyfile(SHARED / "breastmnist.npz", copy)
    with np.load(copy) as npz:
        arrays = dict(npz)
    arrays["train_images"][0, 0, 0] ^= 1  # one pixel of one image
    np.savez_compressed(copy, **arrays)
    found = md5_of(copy)
    result = mpicd_cli("check", str(BREAST_CONFIG), f"data.path={copy}")
    assert result.returncode == 0, result.stderr  # a warning, not an error
    warning = [line for line in result.stdout.splitlines() if line.startswith("warning: ")]
    assert len(warning) == 1 and "official MedMNIST v2 file" not in result.stdout.replace(warning[0], "")
    assert f"expected md5 {PUBLISHED_MD5['breastmnist']}" in warning[0] and f"found {found}" in warning[0]


# --------------------------------------------------------------------------- the real files


def test_real_retinamnist_counts_and_mapping():
    path = require("retinamnist")
    plain = load(path)
    assert plain.train.x.shape == (1080, 3, 28, 28) and plain.num_classes == 5
    assert np.bincount(plain.train.y).tolist() == [486, 128, 206, 194, 66]
    assert np.bincount(plain.val.y).tolist() == [54, 12, 28, 20, 6]
    assert np.bincount(plain.test.y).tolist() == [174, 46, 92, 68, 20]
    plan = prepare(load_config(RETINA_CONFIG))
    ds = plan.dataset
    assert ds.class_names == ("no DR", "DR") and ds.label_map == (0, 1, 1, 1, 1)
    assert np.bincount(ds.train.y).tolist() == [486, 594]
    assert np.bincount(ds.val.y).tolist() == [54, 66] and np.bincount(ds.test.y).tolist() == [174, 226]
    np.testing.assert_array_equal(ds.train.x, plain.train.x)
    assert ds.input_shape == (3, 28, 28) and ds.md5 == PUBLISHED_MD5["retinamnist"]
    # images_per_class null: floor(486 / 4) = 121; skew 0.6 keeps floor(0.4 * 121) = 48 of the other class
    assert plan.partition.base_per_class == 121
    assert plan.partition.train_counts.tolist() == [[121, 48], [48, 121], [121, 48], [48, 121]]


def test_real_breastmnist_counts_and_the_largest_partition():
    require("breastmnist")
    plan = prepare(load_config(BREAST_CONFIG))
    ds = plan.dataset
    assert ds.class_names == ("malignant", "normal_benign") and ds.label_map is None
    assert np.bincount(ds.train.y).tolist() == [147, 399]
    assert np.bincount(ds.val.y).tolist() == [21, 57] and np.bincount(ds.test.y).tolist() == [42, 114]
    assert plan.partition.base_per_class == 36  # floor(147 / 4), the most the config can ask for
    assert plan.partition.train_counts.tolist() == [[36, 14], [14, 36], [36, 14], [14, 36]]
    with pytest.raises(ConfigError, match="the largest allowed value is 36") as err:
        prepare(load_config(BREAST_CONFIG, ["data.images_per_class=37"]))
    assert err.value.key == "data.images_per_class"


def test_check_prints_the_retinamnist_partition_and_mapping():
    require("retinamnist")
    result = mpicd_cli("check", str(RETINA_CONFIG))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    header = next(line for line in lines if line.lstrip().startswith("client "))
    assert header.split()[2:8] == ["train:no", "DR", "train:DR", "test:no", "DR", "test:DR"]
    rows = [line.split() for line in lines[lines.index(header) + 1 : lines.index(header) + 5]]
    assert [r[:2] for r in rows] == [["0", "no"], ["1", "DR"], ["2", "no"], ["3", "DR"]]
    assert "labels mapped (data.label_map): [0, 1, 1, 1, 1]: label 0 -> 'no DR'; labels 1, 2, 3, 4 -> 'DR'" in lines
    assert f"data file: official MedMNIST v2 file retinamnist.npz (md5 {PUBLISHED_MD5['retinamnist']})" in lines
    # unmapped, the two names no longer fit: one error naming data.classes
    result = mpicd_cli("check", str(RETINA_CONFIG), "data.label_map=null")
    assert result.returncode == 2 and result.stderr.startswith("mpicd: config error: data.classes: names 2 classes")


# --------------------------------------------------------------------------- C = 5 end to end

METHODS = [
    {"name": "codistill"},
    {"name": "codistill", "classes": "all"},
    {"name": "codistill", "teacher_per": "batch"},
    {"name": "fedproto"},
    {"name": "feddistill"},
    {"name": "fedamp"},
    {"name": "fedavg"},
    {"name": "local"},
    {"name": "centralized"},
]


def check_five_classes(results: Results, base: int, kept: int) -> None:
    """Partition, recall and minority accuracy of a 4-client run on 5 classes."""
    assert results.completed_rounds == 2 and int(results.attrs["num_classes"]) == 5
    assert results.partition["expertise"].tolist() == [0, 1, 2, 3]  # class 4 is no client's expertise
    expected = np.full((4, 5), kept)
    expected[np.arange(4), np.arange(4)] = base
    np.testing.assert_array_equal(results.partition["train_counts"], expected)
    recall = results.metrics["recall"]
    assert recall.shape == (2, 4, 5) and np.isfinite(recall).all()
    for i in range(4):  # mean recall of the 4 classes that are not client i's expertise
        others = np.delete(recall[:, i], i, axis=1).mean(axis=1)
        np.testing.assert_allclose(results.metrics["minority_acc"][:, i], others, rtol=1e-12)
        np.testing.assert_allclose(results.metrics["balanced_acc"][:, i], recall[:, i].mean(axis=1), rtol=1e-12)
    assert np.isfinite(results.metrics["train_loss"]).all()


@pytest.fixture(scope="module")
def five_class_sweep(tmp_path_factory):
    """Every method (and co-distillation's two other modes) on a 5-class RGB file, one MPI job."""
    folder = tmp_path_factory.mktemp("five")
    labels = {"train": [c for c in range(5) for _ in range(24)], "val": list(range(5)) * 3, "test": list(range(5)) * 4}
    write_medmnist(folder / "five.npz", labels, size=12, rgb=True)
    (folder / "base.yaml").write_text(
        yaml.safe_dump(
            {
                "clients": 4,
                "rounds": 2,
                "device": "cpu",
                "data": {"name": "medmnist", "path": str(folder / "five.npz"), "skew": 0.5},
                "model": {"name": "lenet", "feature_dim": 8},
                "train": {"batch_size": 8},
                "checkpoint": {"every": 0},
            }
        )
    )
    sweep = folder / "sweep.yaml"
    sweep.write_text(
        yaml.safe_dump({"config": "base.yaml", "output_dir": str(folder / "out"), "grid": {"algorithm": METHODS}})
    )
    result = mpiexec(4, "-m", "mpicd", "pack", str(sweep), timeout=600)
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    from mpicd.sweep.grid import load_sweep

    return {i: Results(run.output) for i, run in enumerate(load_sweep(sweep))}


@pytest.mark.parametrize("index", range(len(METHODS)), ids=[",".join(map(str, m.values())) for m in METHODS])
def test_every_method_trains_and_scores_five_classes(five_class_sweep, index):
    results = five_class_sweep[index]
    assert results.attrs["algorithm"] == METHODS[index]["name"]
    check_five_classes(results, base=6, kept=3)  # 24 // 4 = 6 of each class; floor(0.5 * 6) = 3
    # Bytes sent per round and rank, by hand for C = 5, D = 8 and the LeNet on 3 x 12 x 12 images, whose
    # P = 456 + 2416 + 17400 + 968 (conv 3->6, 6->16, 16->120, Linear 120->8) + 45 (head 8->5) = 21285
    expected = {
        "fedproto": 4 * 5 * (8 + 1),  # [C x D sums ; C counts]
        "feddistill": 4 * 5 * (5 + 1),  # [C x C logits ; C flags]
        "fedavg": 4 * (21285 + 1),
        "fedamp": 4 * 21285,
        "local": 0,
        "centralized": 0,
    }.get(METHODS[index]["name"])
    if len(METHODS[index]) > 1:  # co-distillation's Allgather modes
        expected = 4 * 5 * 8 if METHODS[index].get("classes") == "all" else 4 * 8
    sent = results.metrics["bytes_sent"]
    if expected is not None:
        assert (sent == expected).all(), (METHODS[index], sent)
    else:  # co-distillation as published: 4 D to each student, some teacher has one in every round
        assert (sent % 32 == 0).all() and (sent.sum(axis=1) == 4 * 4 * 8).all(), sent


def test_real_retinamnist_five_grades_end_to_end(tmp_path):
    require("retinamnist")
    out = tmp_path / "retina5.h5"
    mpicd_run(4, RETINA_CONFIG, out, "data.label_map=null", "data.classes=null", "rounds=2", "device=cpu", timeout=400)
    results = Results(out)
    assert [str(n) for n in results.attrs["class_names"]] == ["class0", "class1", "class2", "class3", "class4"]
    # images_per_class null: floor(66 grade-4 images / 4) = 16; skew 0.6 keeps floor(0.4 * 16) = 6
    check_five_classes(results, base=16, kept=6)
