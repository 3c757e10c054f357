"""Reference numbers for FedLC and FedRS, produced by running the public reference implementations.

The references' own files are extracted with ``git archive`` from mirrored bare git directories and imported
unchanged; their loss code, their count/calibration code and their local training loops are what runs here.
This script only supplies fixed inputs: stub data readers/loaders (fixed batches in a fixed order), tiny models
(a linear classifier, or a module whose output is a fixed tensor held as a parameter so that its ``.grad`` is the
gradient of the loss w.r.t. that tensor), and ``sys.modules`` stubs for packages that are not installed
(``flwr``, ``flwr_datasets``; ``sklearn``/``h5py``/``matplotlib``/``pandas`` only if missing).

References:
  * PFLlib (TsingZ0/PFLlib): FedLC, system/flcore/clients/clientlc.py + system/flcore/servers/serverlc.py.
  * Flower baselines, FedLC: adap/flower pull request 4548 (refs/pull/4548/head, not merged into main),
    baselines/fedlc/fedlc/client_app.py; that file also holds a FedRS loss (RestrictedSoftmaxLoss).
  * Flower baselines, FedRS: adap/flower pull request 4547 (refs/pull/4547/head, not merged into main),
    baselines/fedrs/fedrs/client_app.py.
  * FedRepo (lxcnju/FedRepo, by the FedRS authors): FedRS, algorithms/fedrs.py.

All runs use torch.set_default_dtype(torch.float64) and float64 inputs, so constants the references build with the
default dtype (PFLlib's class counts, Flower's corrections) are float64; FedRepo builds its counts with
torch.FloatTensor, so its FedRS scale vector is float32 (promoted to float64 when multiplied with the logits).

Usage (from the repository root):
  .venv/bin/python tools/label_skew_reference.py \
      --pfllib /work/.mirror/TsingZ0+PFLlib/repo --flower /work/.mirror/adap+flower/repo \
      --fedrepo /work/.mirror/lxcnju+FedRepo/repo [--out tests/algorithms/data/label_skew_reference.json]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import io
import json
import math
import shutil
import subprocess
import sys
import tarfile
import tempfile
import types
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
from torch import nn

MIRROR = Path("/work/.mirror")
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "tests" / "algorithms" / "data" / "label_skew_reference.json"

PFLLIB_FILES = [
    "system/flcore/clients/clientbase.py",
    "system/flcore/clients/clientlc.py",
    "system/flcore/servers/serverbase.py",
    "system/flcore/servers/serverlc.py",
    "system/flcore/trainmodel/models.py",
    "system/utils/data_utils.py",
    "system/utils/dlg.py",
]
FLOWER_FEDLC_REF = "refs/pull/4548/head"
FLOWER_FEDLC_FILES = [
    "baselines/fedlc/fedlc/__init__.py",
    "baselines/fedlc/fedlc/client_app.py",
    "baselines/fedlc/fedlc/dataset.py",
    "baselines/fedlc/fedlc/model.py",
    "baselines/fedlc/fedlc/utils.py",
    "baselines/fedlc/pyproject.toml",
]
FLOWER_FEDRS_REF = "refs/pull/4547/head"
FLOWER_FEDRS_FILES = [
    "baselines/fedrs/fedrs/__init__.py",
    "baselines/fedrs/fedrs/client_app.py",
    "baselines/fedrs/fedrs/dataset.py",
    "baselines/fedrs/fedrs/model.py",
    "baselines/fedrs/fedrs/utils.py",
    "baselines/fedrs/pyproject.toml",
]
FEDREPO_FILES = ["algorithms/__init__.py", "algorithms/fedrs.py", "utils.py", "tools.py", "config.py", "train_lab.py"]

CPU = torch.device("cpu")
BATCH = 4  # rows per batch in every case
LR = 0.1  # plain SGD learning rate of the local rounds
TAUS = [0.5, 1.0]  # Flower default, PFLlib default
ALPHAS = [0.5, 0.9]  # the two values of the FedRS paper/baselines' runs

# (name, counts of the client's whole training set, labels of the batch, seed)
LOSS_CASES = [
    ("c2_one_count_zero", [8, 0], [0, 0, 0, 0], 11),
    ("c2_both_counts_positive", [6, 2], [0, 1, 0, 0], 12),
    ("c3_all_counts_positive", [5, 2, 1], [0, 2, 1, 0], 13),
    ("c3_one_count_zero", [6, 2, 0], [1, 0, 0, 1], 14),
]
# (name, labels of batch 1 + batch 2, seed); the client's counts are the counts of these 8 labels
ROUND_CASES = [
    ("c3_round_class2_missing", [0, 1, 0, 0, 1, 0, 1, 0], 21),
    ("c3_round_all_present", [0, 1, 2, 0, 0, 1, 0, 2], 22),
]
FEAT_DIM = 3


# ----------------------------------------------------------------------------------------------- git extraction
def git(git_dir: Path, *args: str) -> str:
    return subprocess.run(
        ["git", f"--git-dir={git_dir}", *args], check=True, capture_output=True, text=True
    ).stdout.strip()


def extract(git_dir: Path, rev: str, paths: list[str], dest: Path) -> dict:
    """Write ``paths`` at ``rev`` under ``dest``; return the commit and each file's last-change commit."""
    commit = git(git_dir, "rev-parse", f"{rev}^{{commit}}")
    data = subprocess.run(
        ["git", f"--git-dir={git_dir}", "archive", "--format=tar", commit, *paths], check=True, capture_output=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(dest, filter="data")
    files = {p: git(git_dir, "log", "-1", "--format=%H", commit, "--", p) for p in paths}
    return {
        "rev": rev,
        "commit": commit,
        "commit_date": git(git_dir, "show", "-s", "--format=%ci", commit),
        "files": files,
    }


# ----------------------------------------------------------------------------------------------- import isolation
def _module(name: str, **attrs) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    return mod


class _Anything:
    """Stand-in class for stubbed names; accepts any arguments."""

    def __init__(self, *args, **kwargs):
        self.args, self.kwargs = args, kwargs

    def to_client(self):
        return self


def _stubs_for_missing() -> dict[str, types.ModuleType]:
    """Minimal stubs, only for top-level packages that cannot be imported here."""
    wanted = {
        "flwr": {
            "flwr": {},
            "flwr.client": {"ClientApp": _Anything, "NumPyClient": _Anything},
            "flwr.common": {"Context": _Anything},
        },
        "flwr_datasets": {
            "flwr_datasets": {"FederatedDataset": _Anything},
            "flwr_datasets.partitioner": {"DirichletPartitioner": _Anything, "ShardPartitioner": _Anything},
        },
        "sklearn": {
            "sklearn": {},
            "sklearn.metrics": {"f1_score": lambda *a, **k: 0.0, "roc_auc_score": lambda *a, **k: 0.0},
            "sklearn.preprocessing": {"label_binarize": lambda y, classes: np.eye(len(classes))[y]},
        },
        "h5py": {"h5py": {}},
        "matplotlib": {"matplotlib": {}, "matplotlib.pyplot": {}},
        "pandas": {"pandas": {}},
    }
    out = {}
    for top, mods in wanted.items():
        if importlib.util.find_spec(top) is None:
            out.update({name: _module(name, **attrs) for name, attrs in mods.items()})
    return out


@contextlib.contextmanager
def isolated(root: Path, stubs: dict[str, types.ModuleType]):
    """Put ``root`` first on sys.path and ``stubs`` in sys.modules; afterwards drop the stubs and the modules
    loaded from ``root`` (PFLlib and FedRepo both have a top-level ``utils``)."""
    before = set(sys.modules)
    sys.path.insert(0, str(root))
    sys.modules.update(stubs)
    try:
        yield
    finally:
        sys.path.remove(str(root))
        drop = []
        for name in set(sys.modules) - before:
            mod = sys.modules[name]
            spec = getattr(mod, "__spec__", None)
            origin = [getattr(mod, "__file__", None) or "", *((spec.submodule_search_locations or []) if spec else [])]
            if name in stubs or any(str(p).startswith(str(root)) for p in origin):
                drop.append(name)
        for name in drop:
            del sys.modules[name]


# ----------------------------------------------------------------------------------------------- fixed inputs
def fl(x) -> list:
    """Tensor/array -> nested lists of Python floats (non-finite values as the strings 'inf', '-inf', 'nan')."""
    if x is None:
        return None
    arr = x.detach().cpu().double().numpy() if isinstance(x, torch.Tensor) else np.asarray(x, dtype=np.float64)

    def conv(v):
        if isinstance(v, list):
            return [conv(u) for u in v]
        return v if math.isfinite(v) else repr(v)

    return conv(arr.tolist())


def t64(a) -> torch.Tensor:
    return torch.tensor(np.asarray(a), dtype=torch.float64)


def labels_from_counts(counts: list[int]) -> torch.Tensor:
    return torch.tensor(np.repeat(np.arange(len(counts)), counts), dtype=torch.int64)


class ParamOutput(nn.Module):
    """Returns a fixed tensor held as a parameter (ignores its input), so its .grad is d loss / d tensor."""

    def __init__(self, value: torch.Tensor):
        super().__init__()
        self.value = nn.Parameter(value.clone())

    def forward(self, x):
        return self.value


class FeatureClassifier(nn.Module):
    """encoder (fixed features as a parameter, or identity on the input) followed by a linear classifier."""

    def __init__(self, W, b, h=None, returns_features=False):
        super().__init__()
        self.encoder = ParamOutput(h) if h is not None else nn.Identity()
        self.classifier = nn.Linear(W.shape[1], W.shape[0], bias=b is not None)
        with torch.no_grad():
            self.classifier.weight.copy_(W)
            if b is not None:
                self.classifier.bias.copy_(b)
        self.returns_features = returns_features

    def forward(self, x):
        h = self.encoder(x)
        logits = self.classifier(h)
        return (h, logits) if self.returns_features else logits


class FixedLoader:
    """Yields the given batches in the given order; its iterator also has FedRepo's Python-2 style ``next()``."""

    def __init__(self, batches: list, dataset=None):
        self.batches = batches
        self.dataset = dataset

    def __iter__(self):
        return _FixedIter(self.batches)

    def __len__(self):
        return len(self.batches)


class _FixedIter:
    def __init__(self, batches):
        self._it = iter(batches)

    def __iter__(self):
        return self

    def __next__(self):
        return next(self._it)

    def next(self):  # FedRepo algorithms/fedrs.py calls loader_iter.next()
        return next(self._it)


class CountDataset(torch.utils.data.Dataset):
    """Samples (x, y) with FedRepo's ``.ys`` attribute (FedRS.get_client_dists reads it)."""

    def __init__(self, xs: torch.Tensor, ys: torch.Tensor):
        self.xs, self.ys_t = xs, ys
        self.ys = ys.numpy()

    def __len__(self):
        return len(self.ys)

    def __getitem__(self, i):
        return self.xs[i], self.ys_t[i]


def dummy_inputs(n: int) -> torch.Tensor:
    return torch.zeros(n, 1, dtype=torch.float64)


def loss_case_inputs(counts, labels, seed):
    rng = np.random.RandomState(seed)
    C = len(counts)
    return {
        "counts": list(counts),
        "labels": list(labels),
        "logits": rng.normal(0.0, 2.0, size=(BATCH, C)),
        "h": rng.normal(0.0, 1.0, size=(BATCH, FEAT_DIM)),
        "W": rng.normal(0.0, 0.5, size=(C, FEAT_DIM)),
        "b": rng.normal(0.0, 0.1, size=C),
    }


def round_case_inputs(labels, seed):
    rng = np.random.RandomState(seed)
    C = 3
    return {
        "labels": list(labels),
        "counts": np.bincount(labels, minlength=C).tolist(),
        "x": rng.normal(0.0, 1.0, size=(len(labels), FEAT_DIM)),
        "W0": rng.normal(0.0, 0.5, size=(C, FEAT_DIM)),
        "b0": rng.normal(0.0, 0.1, size=C),
    }


def batches_of(x: torch.Tensor, y: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(x[i : i + BATCH], y[i : i + BATCH]) for i in range(0, len(y), BATCH)]


def quiet():
    return contextlib.redirect_stdout(io.StringIO())


# ----------------------------------------------------------------------------------------------- PFLlib FedLC
class RecordingCE(nn.CrossEntropyLoss):
    """nn.CrossEntropyLoss (PFLlib's self.loss) that also keeps each returned loss value."""

    def __init__(self):
        super().__init__()
        self.values = []

    def forward(self, input, target):
        out = super().forward(input, target)
        self.values.append(out.item())
        return out


def pfllib_fedlc(root: Path, stubs, client_sets, model: nn.Module, batches, tau: float, lr: float, num_classes: int):
    """Build PFLlib's FedLC server (which builds clientLC clients), then run client 0's train()."""
    with isolated(root / "system", stubs):
        clientbase = importlib.import_module("flcore.clients.clientbase")
        serverbase = importlib.import_module("flcore.servers.serverbase")
        serverlc = importlib.import_module("flcore.servers.serverlc")

        def read_client_data(dataset, idx, is_train=True, few_shot=0):  # stub of utils.data_utils.read_client_data
            return client_sets[idx]

        clientbase.read_client_data = read_client_data
        serverbase.read_client_data = read_client_data
        args = SimpleNamespace(
            model=model, algorithm="FedLC", dataset="stub", device="cpu", save_folder_name="unused",
            num_classes=num_classes, batch_size=BATCH, local_learning_rate=lr, local_epochs=1, few_shot=0,
            learning_rate_decay=False, learning_rate_decay_gamma=0.99, global_rounds=1, num_clients=len(client_sets),
            join_ratio=1.0, random_join_ratio=False, time_select=False, goal="test", time_threthold=10000,
            top_cnt=100, auto_break=False, eval_gap=1, client_drop_rate=0.0, train_slow_rate=0.0,
            send_slow_rate=0.0, dlg_eval=False, dlg_gap=100, batch_num_per_client=2, num_new_clients=0,
            fine_tuning_epoch_new=0, tau=tau,
        )  # fmt: skip
        with quiet():
            server = serverlc.FedLC(args, 0)
        client = server.clients[0]
        client.load_train_data = lambda batch_size=None: FixedLoader(batches)  # fixed order, no shuffling
        client.loss = RecordingCE()
        client.train()
        return server, client


# ----------------------------------------------------------------------------------------------- drivers
def flower_train_fedlc_pr(mod_model, net, batches, criterion, lr):
    loader = FixedLoader([{"img": x, "label": y} for x, y in batches])
    return mod_model.train(net, loader, 1, CPU, lr, criterion, 0.0)


def flower_train_fedrs_pr(mod_model, net, batches, criterion, lr):
    loader = FixedLoader([{"img": x, "label": y} for x, y in batches])
    return mod_model.train(net, loader, 1, CPU, lr, criterion, 0.0, 0.0, 0.0)


def fedrepo_fedrs(fedrs_mod, model, all_x, all_y, batches, alpha, lr, steps, num_classes):
    """Run FedRepo's FedRS.__init__ and FedRS.train() (1 round, 1 client); return the local model and loss."""
    C = num_classes
    ds = CountDataset(all_x, all_y)
    test_ds = CountDataset(*batches[0])  # only read by their accuracy / F1 logging
    args = SimpleNamespace(
        n_classes=C, batch_size=BATCH, lr=lr, optimizer="SGD", momentum=0.0, weight_decay=0.0,
        max_grad_norm=100.0, cuda=False, local_steps=steps, local_epochs=None, alpha=alpha,
        max_round=1, c_ratio=1.0, test_round=1,
    )  # fmt: skip
    algo = fedrs_mod.FedRS({"c0": (ds, test_ds)}, test_ds, model, args)
    algo.train_loaders["c0"] = FixedLoader(batches)
    captured = {}
    original = algo.update_local

    def update_local(**kwargs):
        out = original(**kwargs)
        captured["out"] = out
        return out

    algo.update_local = update_local
    with quiet():
        algo.train()
    local_model, _, _, loss = captured["out"]
    return algo, local_model, loss


def fedrepo_scale(cnts: torch.Tensor, alpha: float) -> torch.Tensor:
    """NOT their code: FedRepo's cdist re-typed (float32, same operation order) only so a test can use the exact
    float32 scale; ``verify_fedrepo_scale`` checks it against the loss their code returned."""
    dist = cnts.float() / cnts.float().sum()
    return (dist / dist.max()) * (1.0 - alpha) + alpha


def verify_fedrepo_scale(case: dict) -> float:
    """|their loss - CE(scale_reconstructed * h @ W.T)|, in float64."""
    h, W = t64(case["h"]), t64(case["W"])
    z = t64(case["scale_reconstructed"]) * (h @ W.T)
    ce = nn.functional.cross_entropy(z, torch.tensor(case["labels"]))
    return abs(float(ce) - case["loss"])


def grad_norm(model: nn.Module) -> float:
    return float(torch.sqrt(sum((p.grad**2).sum() for p in model.parameters() if p.grad is not None)))


# ----------------------------------------------------------------------------------------------- main
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pfllib", type=Path, default=MIRROR / "TsingZ0+PFLlib" / "repo")
    ap.add_argument("--flower", type=Path, default=MIRROR / "adap+flower" / "repo")
    ap.add_argument("--fedrepo", type=Path, default=MIRROR / "lxcnju+FedRepo" / "repo")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    a = ap.parse_args(argv)

    torch.set_default_dtype(torch.float64)
    stubs = _stubs_for_missing()
    tmp = Path(tempfile.mkdtemp(prefix="label_skew_ref_"))
    src = {
        "pfllib": extract(a.pfllib, "HEAD", PFLLIB_FILES, tmp / "pfllib"),
        "flower_fedlc": extract(a.flower, FLOWER_FEDLC_REF, FLOWER_FEDLC_FILES, tmp / "flower_fedlc"),
        "flower_fedrs": extract(a.flower, FLOWER_FEDRS_REF, FLOWER_FEDRS_FILES, tmp / "flower_fedrs"),
        "fedrepo": extract(a.fedrepo, "HEAD", FEDREPO_FILES, tmp / "fedrepo"),
    }

    refs: dict[str, dict] = {}
    flower_main = git(a.flower, "rev-parse", "HEAD")
    on_main = git(a.flower, "ls-tree", "--name-only", flower_main, "baselines/fedlc", "baselines/fedrs")
    flower_note = (
        f"adap/flower HEAD {flower_main} has {'these baselines: ' + on_main if on_main else 'no baselines/fedlc or '}"
        f"{'' if on_main else 'baselines/fedrs'}; the code is taken from the pull request head"
    )

    # ---------------- FedLC: PFLlib
    pf = {
        "method": "FedLC",
        "repository": "TsingZ0/PFLlib",
        "source": src["pfllib"],
        "paths": ["system/flcore/clients/clientlc.py", "system/flcore/servers/serverlc.py"],
        "formula": (
            "loss = CrossEntropyLoss(output - calibration, y) with calibration = tau * n_c ** (-1/4), where n_c is "
            "the count of class c summed over ALL clients of the federation (server-side), tiled to (batch_size, C)"
        ),
        "where": {
            "per-client counts (via drop_last=True, shuffled loader)": "system/flcore/clients/clientlc.py:12-16",
            "federation-wide sum and calibration": "system/flcore/servers/serverlc.py:20-26",
            "loss": "system/flcore/clients/clientlc.py:40",
            "loader drop_last=True": "system/flcore/clients/clientbase.py:59",
            "optimizer plain SGD": "system/flcore/clients/clientbase.py:47",
        },
        "defaults": {
            "tau": 1.0,
            "tau_where": "system/main.py:469 (shared with MOON / FedCAC)",
            "local_learning_rate": 0.005,
            "batch_size": 10,
            "local_epochs": 1,
            "defaults_where": "system/main.py:399-407",
        },  # fmt: skip
        "dtype": "float64 inputs; torch default dtype float64, so the counts and calibration are float64",
        "notes": [
            "A class with federation-wide count 0 gets calibration inf (0 ** -0.25 = inf), its calibrated logit is "
            "-inf: softmax weight 0 and gradient 0 for that column. With tau = 0 that column would be 0 * inf = nan.",
            "Counts are taken from a shuffled DataLoader with drop_last=True, so samples in a final partial batch "
            "are not counted; the cases here use client sets whose size is a multiple of the batch size.",
            "Loss values are read from a recording subclass of nn.CrossEntropyLoss put in place of client.loss; "
            "gradients are the .grad of the parameters after client.train() (one batch: the gradient of that batch).",
        ],
        "cases": [],
        "rounds": [],
    }
    refs["pfllib_fedlc"] = pf

    # ---------------- FedLC + FedRS: Flower PR 4548 (fedlc baseline)
    ffl = {
        "method": "FedLC (LogitCorrectedLoss); the same file also has a FedRS loss (RestrictedSoftmaxLoss)",
        "repository": "adap/flower",
        "source": src["flower_fedlc"],
        "paths": ["baselines/fedlc/fedlc/client_app.py", "baselines/fedlc/fedlc/model.py"],
        "status": "pull request 4548 (refs/pull/4548/head), not merged into adap/flower main",
        "main_branch": flower_note,
        "formula": (
            "loss = CrossEntropyLoss(logits - tau * n_c.pow(-0.25), y), n_c = count of class c in the client's "
            "whole partition (labels.unique(return_counts=True))"
        ),
        "where": {
            "LogitCorrectedLoss": "baselines/fedlc/fedlc/client_app.py:11-30 (correction at :26, subtraction at :29)",
            "train loop (plain SGD)": "baselines/fedlc/fedlc/model.py:40-70",
        },
        "defaults": {
            "tau": 0.5,
            "tau_where": "baselines/fedlc/pyproject.toml:143 (README: tau not given in paper)",
            "learning-rate": 0.01,
            "learning-rate_where": "baselines/fedlc/pyproject.toml:130",
        },  # fmt: skip
        "dtype": "float64 inputs; torch default dtype float64, so the correction is float64",
        "notes": ["Count 0 gives pow(0, -0.25) = inf, i.e. a -inf calibrated logit (same as PFLlib)."],
        "cases": [],
        "rounds": [],
    }
    refs["flower_pr4548_fedlc"] = ffl
    ffl_rs = {
        "method": "FedRS (RestrictedSoftmaxLoss inside the FedLC baseline)",
        "repository": "adap/flower",
        "source": src["flower_fedlc"],
        "paths": ["baselines/fedlc/fedlc/client_app.py"],
        "status": "pull request 4548 (refs/pull/4548/head), not merged into adap/flower main",
        "main_branch": flower_note,
        "formula": (
            "loss = CrossEntropyLoss(logits * s, y), s_c = 1 if class c occurs in the client's partition else alpha; "
            "logits is the full model output, which in this baseline's CNNModel includes the fc bias"
        ),
        "where": {
            "RestrictedSoftmaxLoss": "baselines/fedlc/fedlc/client_app.py:32-50",
            "model fc with bias": "baselines/fedlc/fedlc/model.py:21",
        },
        "defaults": {"alpha": 0.0, "alpha_where": "baselines/fedlc/pyproject.toml:142 (fedrs-alpha); README runs 0.9"},
        "dtype": "float64",
        "cases": [],
        "rounds": [],
    }
    refs["flower_pr4548_fedrs"] = ffl_rs

    # ---------------- FedRS: Flower PR 4547
    frs = {
        "method": "FedRS",
        "repository": "adap/flower",
        "source": src["flower_fedrs"],
        "paths": ["baselines/fedrs/fedrs/client_app.py", "baselines/fedrs/fedrs/model.py"],
        "status": "pull request 4547 (refs/pull/4547/head), not merged into adap/flower main",
        "main_branch": flower_note,
        "formula": (
            "loss = CrossEntropyLoss(logits * s, y), s_c = 1 if class c occurs in the client's partition else alpha "
            "(hard restriction); the baseline's VGG classifier is nn.Linear(512, C, bias=False)"
        ),
        "where": {
            "_calc_logit_correction": "baselines/fedrs/fedrs/client_app.py:11-17",
            "RestrictedSoftmaxCELoss.forward": "baselines/fedrs/fedrs/client_app.py:29-32",
            "classifier without bias": "baselines/fedrs/fedrs/model.py:19",
            "train loop (SGD with momentum, weight_decay)": "baselines/fedrs/fedrs/model.py:55-97",
        },
        "defaults": {
            "alpha": 1.0,
            "alpha_where": "baselines/fedrs/pyproject.toml:131 (README table says 0.9; runs use 0.5 and 0.9)",
            "learning-rate": 0.03,
            "momentum": 0.9,
            "weight-decay": 5e-4,
            "optimizer_where": "baselines/fedrs/pyproject.toml:133-135",
        },  # fmt: skip
        "dtype": "float64",
        "notes": ["The rounds here use momentum=0 and weight_decay=0 (plain SGD) for comparability."],
        "cases": [],
        "rounds": [],
    }
    refs["flower_pr4547_fedrs"] = frs

    # ---------------- FedRS: FedRepo
    fr = {
        "method": "FedRS",
        "repository": "lxcnju/FedRepo",
        "source": src["fedrepo"],
        "paths": ["algorithms/fedrs.py"],
        "formula": (
            "loss = CrossEntropyLoss(cdist * (h @ W.T), y), cdist_c = alpha + (1 - alpha) * p_c / max_k p_k, "
            "p = n / n.sum() from the client's counts (soft restriction: every class with p_c < max is scaled, "
            "missing classes by alpha); the classifier bias never enters"
        ),
        "where": {
            "counts (torch.FloatTensor)": "algorithms/fedrs.py:53-57",
            "dist = cnts / cnts.sum()": "algorithms/fedrs.py:79-80",
            "cdist and logits": "algorithms/fedrs.py:185-189",
            "loss, clip_grad_norm_, step": "algorithms/fedrs.py:191-199",
            "loader_iter.next()": "algorithms/fedrs.py:171-174",
        },
        "defaults": {
            "alpha": "no single default: train_lab.py:163-167 sweeps [0.9, 0.5, 0.1]",
            "optimizer": "SGD lr 0.03, momentum 0.9, weight_decay 1e-5, max_grad_norm 100.0 (config.py:38-42, cifar10)",
        },
        "dtype": "float64 inputs; cdist is float32 (torch.FloatTensor counts), promoted to float64 in the product",
        "notes": [
            "update_local calls loader_iter.next(); torch DataLoader iterators have had no .next() since torch 1.13, "
            "so with a real DataLoader their loop fails (AttributeError, re-raised in the except branch); the stub "
            "loader here provides next().",
            "The classifier bias, if the model has one, is not used in training: its .grad stays None (reported null).",
            "The rounds here use momentum=0, weight_decay=0 (plain SGD); max_grad_norm=100.0 as in config.py, and the "
            "gradient norms stay below it (recorded per case).",
            "Driven through FedRS.__init__ (real DataLoaders from construct_dataloaders, counts by get_client_dists) "
            "and FedRS.train() with max_round=1, c_ratio=1.0, local_steps=number of batches; the local model is "
            "taken from update_local's return value.",
        ],
        "cases": [],
        "rounds": [],
    }
    refs["fedrepo_fedrs"] = fr

    fl_root = tmp / "flower_fedlc" / "baselines" / "fedlc"
    frs_root = tmp / "flower_fedrs" / "baselines" / "fedrs"

    # ---------------- loss / gradient cases
    for name, counts, labels, seed in LOSS_CASES:
        inp = loss_case_inputs(counts, labels, seed)
        C = len(counts)
        y = torch.tensor(labels, dtype=torch.int64)
        L = t64(inp["logits"])
        part_y = labels_from_counts(counts)
        part_x = dummy_inputs(len(part_y))

        for tau in TAUS:
            base = {"case": name, "tau": tau, "counts": counts, "labels": labels, "logits": fl(L)}
            # PFLlib: one client whose training set has exactly these counts
            with isolated(tmp / "pfllib" / "system", stubs):
                models = importlib.import_module("flcore.trainmodel.models")
                model = models.BaseHeadSplit(nn.Identity(), ParamOutput(L))
            server, client = pfllib_fedlc(
                tmp / "pfllib", stubs, [list(zip(part_x, part_y))], model, [(dummy_inputs(BATCH), y)], tau, 1.0, C
            )
            pf["cases"].append(
                base
                | {
                    "client_sample_per_class": fl(client.sample_per_class),
                    "calibration_row": fl(client.calibration[0]),
                    "loss": client.loss.values[0],
                    "grad_logits": fl(client.model.head.value.grad),
                }
            )
            # Flower PR 4548
            with isolated(fl_root, stubs):
                ca = importlib.import_module("fedlc.client_app")
                mm = importlib.import_module("fedlc.model")
                crit = ca.LogitCorrectedLoss(C, part_y, tau, CPU)
                net = ParamOutput(L)
                loss = flower_train_fedlc_pr(mm, net, [(dummy_inputs(BATCH), y)], crit, 1.0)
            ffl["cases"].append(
                base | {"correction": fl(crit.correction), "loss": loss, "grad_logits": fl(net.value.grad)}
            )

        # PFLlib: federation-wide counts (second client holds the class this client lacks)
        if name == "c2_one_count_zero":
            other = [2, 6]
            oy = labels_from_counts(other)
            for tau in TAUS:
                with isolated(tmp / "pfllib" / "system", stubs):
                    models = importlib.import_module("flcore.trainmodel.models")
                    model = models.BaseHeadSplit(nn.Identity(), ParamOutput(L))
                sets = [list(zip(part_x, part_y)), list(zip(dummy_inputs(len(oy)), oy))]
                server, client = pfllib_fedlc(
                    tmp / "pfllib", stubs, sets, model, [(dummy_inputs(BATCH), y)], tau, 1.0, C
                )
                pf["cases"].append(
                    {
                        "case": name + "_two_clients",
                        "tau": tau,
                        "counts": counts,
                        "other_client_counts": other,
                        "labels": labels,
                        "logits": fl(L),
                        "client_sample_per_class": fl(client.sample_per_class),
                        "calibration_row": fl(client.calibration[0]),
                        "loss": client.loss.values[0],
                        "grad_logits": fl(client.model.head.value.grad),
                    }
                )

        # FedRS cases
        h, W, b = t64(inp["h"]), t64(inp["W"]), t64(inp["b"])
        for alpha in ALPHAS:
            for with_bias in (True, False):
                bb = b if with_bias else None
                base = {
                    "case": name + ("" if with_bias else "_no_bias"),
                    "alpha": alpha,
                    "counts": counts,
                    "labels": labels,
                    "h": fl(h),
                    "W": fl(W),
                    "b": fl(bb),
                }
                for key, root, ref in (
                    ("fedlc.client_app", fl_root, ffl_rs),
                    ("fedrs.client_app", frs_root, frs),
                ):
                    with isolated(root, stubs):
                        ca = importlib.import_module(key)
                        mm = importlib.import_module(key.split(".")[0] + ".model")
                        net = FeatureClassifier(W, bb, h=h)
                        if ref is ffl_rs:
                            crit = ca.RestrictedSoftmaxLoss(C, part_y, alpha, CPU)
                            loss = flower_train_fedlc_pr(mm, net, [(dummy_inputs(BATCH), y)], crit, 1.0)
                            scale = crit.correction
                        else:
                            crit = ca.RestrictedSoftmaxCELoss(C, part_y, CPU, alpha)
                            loss = flower_train_fedrs_pr(mm, net, [(dummy_inputs(BATCH), y)], crit, 1.0)
                            scale = crit.logits_correction
                    ref["cases"].append(
                        base
                        | {
                            "scale": fl(scale[0]),
                            "loss": loss,
                            "grad_h": fl(net.encoder.value.grad),
                            "grad_W": fl(net.classifier.weight.grad),
                            "grad_b": fl(net.classifier.bias.grad) if with_bias else None,
                        }
                    )
                with isolated(tmp / "fedrepo", stubs):
                    fedrs_mod = importlib.import_module("algorithms.fedrs")
                    net = FeatureClassifier(W, bb, h=h, returns_features=True)
                    algo, local, loss = fedrepo_fedrs(
                        fedrs_mod, net, part_x, part_y, [(dummy_inputs(BATCH), y)], alpha, 1.0, 1, C
                    )
                fr["cases"].append(
                    base
                    | {
                        "client_cnts": fl(algo.client_cnts["c0"]),
                        "scale_reconstructed": fl(fedrepo_scale(algo.client_cnts["c0"], alpha)),
                        "loss": loss,
                        "grad_h": fl(local.encoder.value.grad),
                        "grad_W": fl(local.classifier.weight.grad),
                        "grad_b": fl(local.classifier.bias.grad) if with_bias else None,
                        "grad_norm": grad_norm(local),
                    }
                )

    # ---------------- one local round: 2 batches x 1 epoch, plain SGD, fixed order
    for name, labels, seed in ROUND_CASES:
        inp = round_case_inputs(labels, seed)
        C = 3
        x, y = t64(inp["x"]), torch.tensor(labels, dtype=torch.int64)
        W0, b0 = t64(inp["W0"]), t64(inp["b0"])
        batches = batches_of(x, y)
        base = {
            "case": name,
            "lr": LR,
            "batches": [{"x": fl(bx), "y": by.tolist()} for bx, by in batches],
            "counts": inp["counts"],
            "W0": fl(W0),
            "b0": fl(b0),
        }
        for tau in TAUS:
            with isolated(tmp / "pfllib" / "system", stubs):
                models = importlib.import_module("flcore.trainmodel.models")
                head = nn.Linear(FEAT_DIM, C)
                with torch.no_grad():
                    head.weight.copy_(W0)
                    head.bias.copy_(b0)
                model = models.BaseHeadSplit(nn.Identity(), head)
            server, client = pfllib_fedlc(tmp / "pfllib", stubs, [list(zip(x, y))], model, batches, tau, LR, C)
            pf["rounds"].append(
                base
                | {
                    "tau": tau,
                    "calibration_row": fl(client.calibration[0]),
                    "batch_losses": client.loss.values,
                    "W": fl(client.model.head.weight),
                    "b": fl(client.model.head.bias),
                }
            )
            with isolated(fl_root, stubs):
                ca = importlib.import_module("fedlc.client_app")
                mm = importlib.import_module("fedlc.model")
                net = FeatureClassifier(W0, b0)
                crit = ca.LogitCorrectedLoss(C, y, tau, CPU)
                avg = flower_train_fedlc_pr(mm, net, batches, crit, LR)
            ffl["rounds"].append(
                base
                | {
                    "tau": tau,
                    "correction": fl(crit.correction),
                    "avg_loss": avg,
                    "W": fl(net.classifier.weight),
                    "b": fl(net.classifier.bias),
                }
            )
        for alpha in ALPHAS:
            rbase = base | {"alpha": alpha}
            for key, root, ref in (("fedlc.client_app", fl_root, ffl_rs), ("fedrs.client_app", frs_root, frs)):
                with isolated(root, stubs):
                    ca = importlib.import_module(key)
                    mm = importlib.import_module(key.split(".")[0] + ".model")
                    net = FeatureClassifier(W0, b0)
                    if ref is ffl_rs:
                        crit = ca.RestrictedSoftmaxLoss(C, y, alpha, CPU)
                        avg = flower_train_fedlc_pr(mm, net, batches, crit, LR)
                        scale = crit.correction
                    else:
                        crit = ca.RestrictedSoftmaxCELoss(C, y, CPU, alpha)
                        avg = flower_train_fedrs_pr(mm, net, batches, crit, LR)
                        scale = crit.logits_correction
                ref["rounds"].append(
                    rbase
                    | {
                        "scale": fl(scale[0]),
                        "avg_loss": avg,
                        "W": fl(net.classifier.weight),
                        "b": fl(net.classifier.bias),
                    }
                )
            with isolated(tmp / "fedrepo", stubs):
                fedrs_mod = importlib.import_module("algorithms.fedrs")
                net = FeatureClassifier(W0, b0, returns_features=True)
                algo, local, avg = fedrepo_fedrs(fedrs_mod, net, x, y, batches, alpha, LR, len(batches), C)
            fr["rounds"].append(
                rbase
                | {
                    "client_cnts": fl(algo.client_cnts["c0"]),
                    "avg_loss": avg,
                    "W": fl(algo.model.classifier.weight),
                    "b": fl(algo.model.classifier.bias),
                }
            )

    # ---------------- cross-checks between references (max |difference|)
    def maxdiff(a, b):
        fa = np.asarray(a, dtype=object).ravel().tolist() if isinstance(a, list) else [a]
        fb = np.asarray(b, dtype=object).ravel().tolist() if isinstance(b, list) else [b]
        return max(abs(float(u) - float(v)) for u, v in zip(fa, fb))

    checks = [
        {
            "what": "FedRepo scale_reconstructed reproduces their loss (max over cases)",
            "loss": max(verify_fedrepo_scale(c) for c in fr["cases"]),
        }
    ]
    single = [c for c in pf["cases"] if "other_client_counts" not in c]
    for c1, c2 in zip(single, ffl["cases"]):
        checks.append(
            {
                "what": f"FedLC PFLlib vs Flower PR 4548, {c1['case']}, tau={c1['tau']}",
                "loss": maxdiff(c1["loss"], c2["loss"]),
                "grad_logits": maxdiff(c1["grad_logits"], c2["grad_logits"]),
            }
        )
    for r1, r2 in zip(pf["rounds"], ffl["rounds"]):
        checks.append(
            {
                "what": f"FedLC round PFLlib vs Flower PR 4548, {r1['case']}, tau={r1['tau']}",
                "W": maxdiff(r1["W"], r2["W"]),
                "b": maxdiff(r1["b"], r2["b"]),
            }
        )
    for c1, c2, c3 in zip(ffl_rs["cases"], frs["cases"], fr["cases"]):
        checks.append(
            {
                "what": f"FedRS {c1['case']}, alpha={c1['alpha']}: Flower 4548 vs 4547, Flower 4547 vs FedRepo",
                "loss_4548_vs_4547": maxdiff(c1["loss"], c2["loss"]),
                "loss_4547_vs_fedrepo": maxdiff(c2["loss"], c3["loss"]),
                "grad_W_4547_vs_fedrepo": maxdiff(c2["grad_W"], c3["grad_W"]),
            }
        )

    out = {
        "generated_by": "tools/label_skew_reference.py",
        "torch": torch.__version__,
        "numpy": np.__version__,
        "python": sys.version.split()[0],
        "dtype": "float64 (torch default dtype set to float64; inputs float64); FedRepo's cdist is float32",
        "float_encoding": "JSON numbers are Python float reprs (round-trip exact); non-finite values are strings",
        "stubbed_modules": sorted(stubs),
        "rerun": "/work/main/.venv/bin/python tools/label_skew_reference.py --pfllib DIR --flower DIR --fedrepo DIR",
        "not_run": [
            "KarhouTam/FL-bench src/client/fedlc.py (another FedLC implementation; not among the references asked for)"
        ],
        "conventions": {
            "batch_size": BATCH,
            "loss": "mean over the batch (nn.CrossEntropyLoss default reduction)",
            "grad": "d loss / d tensor for the single batch of the case",
            "counts": "class counts of the client's whole training set (the references derive them from its labels)",
            "W": "classifier weight, shape (C, d); logits = h @ W.T + b",
            "round": "2 batches of 4, 1 epoch, fixed order, plain SGD with lr given; W/b are after the round",
            "seeds": "numpy.random.RandomState(seed) per case; see LOSS_CASES / ROUND_CASES in the script",
        },
        "references": refs,
        "cross_checks": checks,
    }
    shutil.rmtree(tmp, ignore_errors=True)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {a.out}")
    for c in checks:
        print(json.dumps(c))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
