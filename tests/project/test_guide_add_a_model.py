"""docs/how-to/add-a-model.md is kept true: its worked example (smallcnn) carried out as written in a copy
of the package, so the guide fails CI when the code it edits moves or the example stops working."""

import re
import subprocess
import sys

import numpy as np

from conftest import ROOT
from guide_example import apply_edits, copy_of_the_package, write_example_files

GUIDE = "docs/how-to/add-a-model.md"
GUIDE_INSERT = re.compile(r"<!-- example insert: (\S+) -->\n```python\n(.*?)```", flags=re.S)
INSERT_BEFORE = "\n\ndef build_model(\n"  # the guide: the new function goes above build_model
EDITS = [  # what the guide tells the reader to change in existing files: (file, old, new)
    (
        "mpicd/models/networks.py",
        'MIN_IMAGE_SIDE = {"lenet": 4, "fedavgcnn": 16, "resnet18": 1}\n',
        'MIN_IMAGE_SIDE = {"lenet": 4, "fedavgcnn": 16, "resnet18": 1, "smallcnn": 4}\n',
    ),
    (
        "mpicd/models/networks.py",
        "        return resnet18(input_shape[0], num_classes)\n",
        "        return resnet18(input_shape[0], num_classes)\n"
        '    if name == "smallcnn":\n'
        "        return smallcnn(input_shape[0], feature_dim, num_classes)\n",
    ),
    (
        "mpicd/config/sections.py",
        '    name: Literal["auto", "lenet", "fedavgcnn", "mlp", "resnet18"] = spec(\n',
        '    name: Literal["auto", "lenet", "fedavgcnn", "mlp", "resnet18", "smallcnn"] = spec(\n',
    ),
    (
        "mpicd/config/sections.py",
        '        doc="D, the width of the feature vector the head reads (lenet, mlp; "\n',
        '        doc="D, the width of the feature vector the head reads (lenet, mlp, smallcnn; "\n',
    ),
]
CHECKS = """\
from mpicd.cli import main
from mpicd.run.runner import EXIT_BAD_INPUT
assert main(['config']) == 0
assert main(['check', 'configs/pneumoniamnist.yaml', 'model.name=smallcnn']) == 0
assert main(['check', 'configs/quickstart.yaml', 'model.name=smallcnn']) == EXIT_BAD_INPUT
"""


def write_pneumonia_like(path):
    """An .npz of the official layout (uint8 28x28 grey, labels (n, 1), normal / pneumonia), big enough for
    configs/pneumoniamnist.yaml as it stands (4 clients x 300 images of each class), so the guide's
    `mpicd check` runs as typed without the real file."""
    rng = np.random.default_rng(0)
    arrays = {}
    for split, n in (("train", 2400), ("val", 40), ("test", 40)):
        arrays[f"{split}_images"] = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        arrays[f"{split}_labels"] = (np.arange(n) % 2).astype(np.uint8).reshape(-1, 1)
    path.parent.mkdir(parents=True)
    np.savez(path, **arrays)


def test_the_add_a_model_guides_worked_example_works_in_a_copy_of_the_package(tmp_path):
    """The guide carried out as written, in a copy of mpicd: its function above build_model, its edits
    (each shown in the guide), `mpicd config` and `mpicd check` with the new model (accepted on images,
    refused on the breast-cancer table), and the example's test (all but the one that starts mpiexec)."""
    text = (ROOT / GUIDE).read_text()
    copy = copy_of_the_package(tmp_path)
    files = write_example_files(GUIDE, copy)
    assert files == ["tests/models/test_smallcnn.py"], files
    inserts = GUIDE_INSERT.findall(text)
    assert [path for path, _ in inserts] == ["mpicd/models/networks.py"], inserts
    for path, body in inserts:
        source = (copy / path).read_text()
        assert "def smallcnn(" not in source, f"{GUIDE}: {path} already defines smallcnn"
        assert source.count(INSERT_BEFORE) == 1, f"{GUIDE}: {path} no longer has {INSERT_BEFORE.strip()!r}"
        (copy / path).write_text(source.replace(INSERT_BEFORE, f"\n\n{body.rstrip()}\n{INSERT_BEFORE}"))
    apply_edits(GUIDE, copy, EDITS)
    # configs/pneumoniamnist.yaml reads ../shared/data/pneumoniamnist.npz from the folder one stands in
    write_pneumonia_like(tmp_path / "shared" / "data" / "pneumoniamnist.npz")

    check = subprocess.run([sys.executable, "-c", CHECKS], cwd=copy, capture_output=True, text=True, timeout=300)
    assert check.returncode == 0, f"{check.stdout[-3000:]}\n{check.stderr[-3000:]}"
    assert "| smallcnn" in check.stdout, "mpicd config does not list smallcnn among model.name's values"
    assert "model: D = 200 features, 11,802 parameters" in check.stdout, check.stdout[-3000:]
    assert "model.name: smallcnn needs images; the dataset has feature vectors of shape (30,)" in check.stderr
    for shown in ("model: D = 200 features, 11,802 parameters", "smallcnn needs images"):
        assert shown in " ".join(text.split()), f"{GUIDE} no longer shows what mpicd prints: {shown!r}"

    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/models/test_smallcnn.py"]
    result = subprocess.run([*command, "-k", "not real_run"], cwd=copy, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    assert "6 passed, 1 deselected" in result.stdout, result.stdout[-1000:]  # four shapes, the count, the refusals
