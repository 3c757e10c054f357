"""Reference numbers for FedRoD, FedNTD and CCVR, produced by running the public reference implementations.

Same approach as tools/label_skew_reference.py (whose helpers are reused): the references' own files are extracted
with ``git archive`` from mirrored bare git directories and imported unchanged; this script only supplies fixed
float64 inputs (stub data readers/loaders yielding fixed batches in a fixed order, tiny models, a module whose
output is a fixed tensor held as a parameter so that its ``.grad`` is the gradient w.r.t. that tensor) and
``sys.modules`` stubs for packages that are not installed (FL-bench: ``ray``, ``hydra``, ``omegaconf``, ``rich``,
``pynvml``, none of which the code run here uses).

References:
  * PFLlib (TsingZ0/PFLlib): FedRoD, system/flcore/clients/clientrod.py + servers/serverrod.py;
    FedNTD, system/flcore/clients/clientntd.py + servers/serverntd.py.
  * FedNTD authors' code (Lee-Gihun/FedNTD): algorithms/fedntd/criterion.py (NTD_Loss), as a cross-check.
  * FL-bench (KarhouTam/FL-bench): CCVR, src/client/ccvr.py + src/server/ccvr.py.

Usage (from the repository root):
  .venv/bin/python tools/label_skew_reference_part2.py \
      --pfllib /work/.mirror/TsingZ0+PFLlib/repo --fedntd /work/.mirror/Lee-Gihun+FedNTD/repo \
      --flbench /work/.mirror/KarhouTam+FL-bench/repo [--out tests/algorithms/data/label_skew_reference_part2.json]
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import random
import shutil
import sys
import tempfile
import types
import warnings
from collections import OrderedDict
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
from torch import nn

_spec = importlib.util.spec_from_file_location(
    "label_skew_reference", Path(__file__).with_name("label_skew_reference.py")
)
ref1 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ref1)
extract, isolated, fl, t64, quiet = ref1.extract, ref1.isolated, ref1.fl, ref1.t64, ref1.quiet
FixedLoader, ParamOutput, RecordingCE = ref1.FixedLoader, ref1.ParamOutput, ref1.RecordingCE
labels_from_counts, dummy_inputs, batches_of = ref1.labels_from_counts, ref1.dummy_inputs, ref1.batches_of
_Anything, _module = ref1._Anything, ref1._module

MIRROR = Path("/work/.mirror")
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "tests" / "algorithms" / "data" / "label_skew_reference_part2.json"
CPU = torch.device("cpu")
BATCH = ref1.BATCH  # 4 rows per batch
LR = 0.1  # plain SGD learning rate of the local rounds

PFLLIB_FILES = [
    "system/flcore/clients/clientbase.py",
    "system/flcore/clients/clientrod.py",
    "system/flcore/clients/clientntd.py",
    "system/flcore/servers/serverbase.py",
    "system/flcore/servers/serverrod.py",
    "system/flcore/servers/serverntd.py",
    "system/flcore/trainmodel/models.py",
    "system/utils/data_utils.py",
    "system/utils/dlg.py",
]
FEDNTD_FILES = ["algorithms/fedntd/criterion.py", "algorithms/fedntd/utils.py", "config/fedntd.json"]
FLBENCH_FILES = [
    "src/client/ccvr.py",
    "src/client/fedavg.py",
    "src/server/ccvr.py",
    "src/server/fedavg.py",
    "src/utils/constants.py",
    "src/utils/functional.py",
    "src/utils/logger.py",
    "src/utils/metrics.py",
    "src/utils/models.py",
    "src/utils/trainer.py",
    "data/utils/__init__.py",
    "data/utils/datasets.py",
    "config/defaults.yaml",
]

# FedRoD loss cases: (name, counts of the client's whole training set, labels of the batch, seed)
ROD_CASES = [
    ("c2_one_count_zero", [8, 0], [0, 0, 0, 0], 31),
    ("c2_both_counts_positive", [6, 2], [0, 1, 0, 0], 32),
    ("c3_all_counts_positive", [5, 2, 1], [0, 2, 1, 0], 33),
    ("c3_one_count_zero", [6, 2, 0], [1, 0, 0, 1], 34),
]
# direct calls of balanced_softmax_loss where a batch label's count is 0 (PFLlib counts with drop_last=True)
ROD_TARGET_ZERO = [("c3_target_class_count_zero", [6, 2, 0], [2, 0, 1, 0], 35)]
# FedNTD loss cases: (name, number of classes, labels, seed)
NTD_CASES = [
    ("c2", 2, [0, 1, 0, 0], 41),
    ("c3", 3, [0, 2, 1, 0], 42),
    ("c4", 4, [3, 0, 1, 1], 43),
]
NTD_TAUS = [1.0, 3.0]  # PFLlib / FedNTD config default; NTD_Loss class default
NTD_BETAS = [1.0]  # FedNTD config (PFLlib's shared default is 0.0, which reduces FedNTD to FedAvg)
# rounds: client 0 has 8 samples (2 batches), client 1 has 4 (1 batch); 3 classes
ROUND_CASES = [
    ("c3_round_class2_missing_on_client0", [0, 1, 0, 0, 1, 0, 1, 0], [2, 1, 2, 2], 51),
    ("c3_round_all_present", [0, 1, 2, 0, 0, 1, 0, 2], [1, 1, 2, 0], 52),
]
D_IN, D_FEAT = 3, 4
# CCVR: (name, per-client class counts, feature dim, seed)
CCVR_CASES = [
    ("c3_d3_two_clients", [[3, 2, 0], [1, 3, 2]], 3, 61),
    ("c3_d3_class_missing_and_singleton", [[3, 0, 1], [2, 0, 0]], 3, 62),
]
CCVR_CALIB = [(32, 0.1), (4, 0.1)]  # (batch_size, lr): FL-bench default batch size 32 (one batch here), and 4


# ----------------------------------------------------------------------------------------------- stubs
def flbench_stubs() -> dict[str, types.ModuleType]:
    wanted = {
        "ray": {"ray": {"remote": _Anything, "put": _Anything}, "ray.actor": {"ActorHandle": _Anything}},
        "hydra": {"hydra": {}, "hydra.core": {}, "hydra.core.hydra_config": {"HydraConfig": _Anything}},
        "omegaconf": {"omegaconf": {"DictConfig": _Anything, "OmegaConf": _Anything}},
        "rich": {
            "rich": {},
            "rich.console": {"Console": _Anything},
            "rich.pretty": {"pprint": print},
            "rich.progress": {"track": lambda it, *a, **k: it},
        },
        "pynvml": {"pynvml": {}},
    }
    out = {}
    for top, mods in wanted.items():
        if importlib.util.find_spec(top) is None:
            out.update({name: _module(name, **attrs) for name, attrs in mods.items()})
    return out


# ----------------------------------------------------------------------------------------------- PFLlib drivers
class Recorder:
    """Wraps a loss function; keeps each returned value (float) in order."""

    def __init__(self, fn):
        self.fn, self.values = fn, []

    def __call__(self, *args, **kwargs):
        out = self.fn(*args, **kwargs)
        self.values.append(out.item())
        return out


def pfllib_args(model, algorithm, num_clients, lr, num_classes, **extra):
    return SimpleNamespace(
        model=model, algorithm=algorithm, dataset="stub", device="cpu", save_folder_name="unused",
        num_classes=num_classes, batch_size=BATCH, local_learning_rate=lr, local_epochs=1, few_shot=0,
        learning_rate_decay=False, learning_rate_decay_gamma=0.99, global_rounds=1, num_clients=num_clients,
        join_ratio=1.0, random_join_ratio=False, time_select=False, goal="test", time_threthold=10000,
        top_cnt=100, auto_break=False, eval_gap=1, client_drop_rate=0.0, train_slow_rate=0.0,
        send_slow_rate=0.0, dlg_eval=False, dlg_gap=100, batch_num_per_client=2, num_new_clients=0,
        fine_tuning_epoch_new=0, **extra,
    )  # fmt: skip


def pfllib_server(server_module: str, server_cls: str, client_sets, args):
    """Build a PFLlib server (call inside ``isolated``); read_client_data is stubbed to return ``client_sets``."""
    clientbase = importlib.import_module("flcore.clients.clientbase")
    serverbase = importlib.import_module("flcore.servers.serverbase")
    smod = importlib.import_module(server_module)

    def read_client_data(dataset, idx, is_train=True, few_shot=0):
        return client_sets[idx]

    clientbase.read_client_data = read_client_data
    serverbase.read_client_data = read_client_data
    with quiet():
        return getattr(smod, server_cls)(args, 0)


def linear(d_in, d_out, W, b) -> nn.Linear:
    m = nn.Linear(d_in, d_out)
    with torch.no_grad():
        m.weight.copy_(t64(W))
        m.bias.copy_(t64(b))
    return m


def params_of(model: nn.Module) -> dict:
    return {k: fl(v) for k, v in model.state_dict().items()}


def round_inputs(labels0, labels1, seed):
    rng = np.random.RandomState(seed)
    C = 3
    return {
        "labels": [list(labels0), list(labels1)],
        "x": [rng.normal(0.0, 1.0, size=(len(labels0), D_IN)), rng.normal(0.0, 1.0, size=(len(labels1), D_IN))],
        "base_W0": rng.normal(0.0, 0.5, size=(D_FEAT, D_IN)),
        "base_b0": rng.normal(0.0, 0.1, size=D_FEAT),
        "head_W0": rng.normal(0.0, 0.5, size=(C, D_FEAT)),
        "head_b0": rng.normal(0.0, 0.1, size=C),
        "test_x": rng.normal(0.0, 1.0, size=(6, D_IN)),
        "test_y": [0, 1, 2, 0, 1, 2],
    }


def round_inputs_json(inp, with_test=True) -> dict:
    out = {k: (v if k in ("labels", "test_y") else [fl(u) for u in v] if k == "x" else fl(v)) for k, v in inp.items()}
    return out if with_test else {k: v for k, v in out.items() if not k.startswith("test")}


def round_model(models, inp):
    return models.BaseHeadSplit(
        linear(D_IN, D_FEAT, inp["base_W0"], inp["base_b0"]), linear(D_FEAT, 3, inp["head_W0"], inp["head_b0"])
    )


def run_server_round(server, loaders):
    """One round as in their Server.train(), minus evaluation: select, send, local train, receive, aggregate."""
    np.random.seed(0)
    random.seed(0)
    server.selected_clients = server.select_clients()
    server.send_models()
    for client in server.clients:
        client.load_train_data = lambda batch_size=None, _b=loaders[client.id]: FixedLoader(_b)
    for client in server.selected_clients:
        client.train()
    server.receive_models()
    server.aggregate_parameters()


# ----------------------------------------------------------------------------------------------- FL-bench drivers
def ccvr_inputs(counts_per_client, d, seed):
    rng = np.random.RandomState(seed)
    C = len(counts_per_client[0])
    offsets = rng.normal(0.0, 2.0, size=(C, d))
    clients = []
    for counts in counts_per_client:
        y = np.repeat(np.arange(C), counts)
        feats = offsets[y] + rng.normal(0.0, 1.0, size=(len(y), d))
        clients.append({"counts": list(counts), "features": feats, "labels": y.tolist()})
    return {
        "clients": clients,
        "classifier_W0": rng.normal(0.0, 0.5, size=(C, d)),
        "classifier_b0": rng.normal(0.0, 0.1, size=C),
        "virtual_per_class": 4,
        "virtual_noise": rng.normal(0.0, 1.0, size=(4 * C, d)),
    }


def flbench_ccvr(root: Path, stubs, inp, C, d, calib, train_clients=(0, 1)):
    """Run FL-bench's CCVR: client statistics (CCVRClient.get_classwise_feature_means_and_covs, through their
    FLbenchTrainer serial exec), server aggregation (compute_classes_mean_cov), the recalibration
    (calibrate_classifier, given fixed virtual features) and their sampler (seeded)."""
    with isolated(root, stubs):
        ccvr_s = importlib.import_module("src.server.ccvr")
        ccvr_c = importlib.import_module("src.client.ccvr")
        models = importlib.import_module("src.utils.models")
        trainer_mod = importlib.import_module("src.utils.trainer")
        constants = importlib.import_module("src.utils.constants")

        class Tiny(models.DecoupledModel):
            def __init__(self):
                super().__init__()
                self.base = nn.Identity()  # the inputs are the features
                self.classifier = linear(d, C, inp["classifier_W0"], inp["classifier_b0"])

        ds_name = f"label_skew_stub_c{C}"
        ccvr_s.NUM_CLASSES[ds_name] = C  # their constants.NUM_CLASSES dict, plus a key for this stub dataset
        loaders = {}
        for cid, c in zip(train_clients, inp["clients"]):
            x, y = t64(c["features"]), torch.tensor(c["labels"], dtype=torch.int64)
            loaders[cid] = batches_of(x, y)
        worker = ccvr_c.CCVRClient.__new__(ccvr_c.CCVRClient)
        worker.model, worker.device = Tiny(), CPU
        worker.dataset = SimpleNamespace(classes=[str(i) for i in range(C)])
        worker.set_parameters = lambda package: setattr(worker, "trainloader", FixedLoader(loaders[package["id"]]))

        server = ccvr_s.CCVRServer.__new__(ccvr_s.CCVRServer)
        server.device = CPU
        server.train_clients = list(train_clients)
        server.package = lambda client_id: {"id": client_id}
        server.args = SimpleNamespace(
            dataset=SimpleNamespace(name=ds_name),
            ccvr=SimpleNamespace(sample_per_class=inp["virtual_per_class"]),
            common=SimpleNamespace(batch_size=calib[0]),
            optimizer=SimpleNamespace(lr=calib[1]),
        )
        server.trainer = trainer_mod.FLbenchTrainer(server, lambda **kw: worker, constants.MODE.SERIAL, 1, {})
        server.model = Tiny()
        server.public_model_param_names = [k for k, _ in server.model.named_parameters()]
        server.public_model_params = OrderedDict((k, p.data.clone()) for k, p in server.model.named_parameters())
        packages = server.trainer.exec("get_classwise_feature_means_and_covs", server.train_clients)

        try:
            means, covs = server.compute_classes_mean_cov()
        except Exception as err:  # recorded (client ids used as list indices)
            return {"error": f"{type(err).__name__}: {err}"}

        # their sampler, seeded as fix_random_seed(42) would leave numpy's global state
        np.random.seed(42)
        vx, vy = server.generate_virtual_representation(means, covs)

        # the recalibration, given fixed virtual features instead of random samples
        fixed = {}
        present = [c for c in range(C) if means[c] is not None and covs[c] is not None]
        k = inp["virtual_per_class"]
        fx = torch.cat(
            [means[c].detach() + t64(inp["virtual_noise"][i * k : (i + 1) * k]) for i, c in enumerate(present)]
        )
        fy = torch.cat([torch.full((k,), c, dtype=torch.int64) for c in present])
        fixed["x"], fixed["y"] = fx, fy

        def fixed_virtual(classes_mean, classes_cov):
            return fx.clone(), fy.clone()

        server.generate_virtual_representation = fixed_virtual
        real_loader = ccvr_s.DataLoader

        def ordered_loader(dataset, batch_size=1, shuffle=False, **kw):  # their shuffle=True, made fixed-order
            return real_loader(dataset, batch_size=batch_size, shuffle=False, **kw)

        ccvr_s.DataLoader = ordered_loader
        try:
            server.calibrate_classifier()
        finally:
            ccvr_s.DataLoader = real_loader
        return {
            "client_stats": [
                {"means": [fl(m) for m in p["means"]], "covs": [fl(c) for c in p["covs"]], "counts": p["counts"]}
                for p in packages.values()
            ],
            "global_means": [fl(m) for m in means],
            "global_covs": [fl(c) for c in covs],
            "sampler_seed42": {"x": fl(vx), "y": vy.tolist(), "dtype": str(vx.dtype)},
            "fixed_virtual": {"x": fl(fx), "y": fy.tolist()},
            "classifier_after": {k: fl(v) for k, v in server.public_model_params.items() if "classifier" in k},
        }


def pooled_cov(feats: np.ndarray, ddof: int):
    """NOT their code: covariance of the pooled features of one class (for comparison)."""
    if len(feats) <= ddof:
        return None
    return fl(np.cov(feats.T, ddof=ddof).reshape(feats.shape[1], feats.shape[1]))


def ccvr_identity(inp, C: int) -> list:
    """NOT their code: pooled unbiased covariance minus sum_k (N_kc - 1) / (N_c - 1) * S_unbiased_kc / N_kc, the
    value their server formula gives when fed client covariances divided by N_kc (see the notes)."""
    out = []
    for c in range(C):
        per = [np.asarray(cl["features"])[np.asarray(cl["labels"]) == c] for cl in inp["clients"]]
        n = sum(len(f) for f in per)
        if n <= 1:
            out.append(None)
            continue
        val = np.cov(np.concatenate(per).T, ddof=1)
        for f in per:
            if len(f) > 1:
                val = val - (len(f) - 1) / (n - 1) * np.cov(f.T, ddof=1) / len(f)
        out.append(fl(val))
    return out


# ----------------------------------------------------------------------------------------------- main
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pfllib", type=Path, default=MIRROR / "TsingZ0+PFLlib" / "repo")
    ap.add_argument("--fedntd", type=Path, default=MIRROR / "Lee-Gihun+FedNTD" / "repo")
    ap.add_argument("--flbench", type=Path, default=MIRROR / "KarhouTam+FL-bench" / "repo")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    a = ap.parse_args(argv)

    torch.set_default_dtype(torch.float64)
    warnings.filterwarnings("ignore")
    stubs = ref1._stubs_for_missing()
    fstubs = flbench_stubs()
    tmp = Path(tempfile.mkdtemp(prefix="label_skew_ref2_"))
    src = {
        "pfllib": extract(a.pfllib, "HEAD", PFLLIB_FILES, tmp / "pfllib"),
        "fedntd": extract(a.fedntd, "HEAD", FEDNTD_FILES, tmp / "fedntd"),
        "flbench": extract(a.flbench, "HEAD", FLBENCH_FILES, tmp / "flbench"),
    }
    psys = tmp / "pfllib" / "system"

    # ================================================================ FedRoD (PFLlib)
    rod = {
        "method": "FedRoD",
        "repository": "TsingZ0/PFLlib",
        "source": src["pfllib"],
        "paths": ["system/flcore/clients/clientrod.py", "system/flcore/servers/serverrod.py"],
        "formula": {
            "generic": "loss_g = CE(g + log(n), y), g = model.head(model.base(x)), n = client's class counts "
            "(balanced softmax); one SGD step of self.optimizer on base + generic head",
            "personal": "loss_p = CE(g.detach() + p, y), p = self.head(rep.detach()), with rep and g from the SAME "
            "forward as loss_g (computed before the generic step); one SGD step of opt_head on the personal head only",
            "eval": "prediction logits = g.detach() + p (generic head + personal head), argmax",
            "server": "FedAvg of the whole self.model (base + generic head), weights = train_samples / total; "
            "personal head (client.head) never leaves the client",
        },
        "where": {
            "personal head = deepcopy(model.head) at client construction": "system/flcore/clients/clientrod.py:15",
            "opt_head: SGD, same lr": "system/flcore/clients/clientrod.py:16",
            "counts from load_train_data (drop_last=True, shuffled)": "system/flcore/clients/clientrod.py:22-26",
            "generic step": "system/flcore/clients/clientrod.py:48-53",
            "personal step": "system/flcore/clients/clientrod.py:55-59",
            "eval output": "system/flcore/clients/clientrod.py:88-91",
            "balanced_softmax_loss (log at :154)": "system/flcore/clients/clientrod.py:142-156",
            "aggregation (weights, FedAvg)": "system/flcore/servers/serverbase.py:124-150",
            "loader drop_last=True": "system/flcore/clients/clientbase.py:59",
        },
        "defaults": {
            "local_learning_rate": 0.005,
            "batch_size": 10,
            "local_epochs": 1,
            "defaults_where": "system/main.py:399-407",
            "method_specific": "none (no FedRoD argument in system/main.py)",
        },
        "notes": [
            "A class with count 0 gets log(0) = -inf added to its logit: softmax weight 0, gradient 0 in that "
            "column (no nan) when it is not the label. If a batch LABEL has count 0 the loss is inf (the direct "
            "cases 'target_zero' below); this can happen in PFLlib because counts are taken once with a shuffled "
            "drop_last=True loader, so samples of the dropped partial batch are not counted but are trained on.",
            "Counts are float (torch.zeros default dtype) and unnormalised: log(n_c), not log(n_c / N) (the "
            "difference is a per-row constant, which cross-entropy ignores).",
            "No learning-rate or loss weighting between the two heads; both steps per batch, generic first.",
            "The personal head's input is rep.detach() and g is detached, so loss_p changes only the personal head.",
            "Cases: model = BaseHeadSplit(Identity, fixed-output module holding g), personal head = fixed-output "
            "module holding p (its .data set after construction); 1 batch, lr 1.0; grad_g = d loss_g / d g, "
            "grad_p = d loss_p / d p. Losses read by recording wrappers around balanced_softmax_loss / client.loss.",
            "Rounds: 2 clients (8 and 4 samples), base Linear(3,4), heads Linear(4,3), plain SGD lr 0.1, fixed "
            "batch order; select/send/train/receive/aggregate as in FedROD.train() (evaluation not run there).",
        ],
        "cases": [],
        "direct_cases": [],
        "rounds": [],
    }
    with isolated(psys, stubs):
        clientrod = importlib.import_module("flcore.clients.clientrod")
        models = importlib.import_module("flcore.trainmodel.models")
        bsm_orig = clientrod.balanced_softmax_loss
        for name, counts, labels, seed in ROD_CASES + ROD_TARGET_ZERO:
            rng = np.random.RandomState(seed)
            C = len(counts)
            g, p = t64(rng.normal(0.0, 2.0, size=(BATCH, C))), t64(rng.normal(0.0, 2.0, size=(BATCH, C)))
            y = torch.tensor(labels, dtype=torch.int64)
            gl = g.clone().requires_grad_(True)
            direct = bsm_orig(y, gl, t64(counts))
            direct.backward()
            entry = {"case": name, "counts": counts, "labels": labels, "g": fl(g)}
            rod["direct_cases"].append(entry | {"loss_g": float(direct), "grad_g": fl(gl.grad)})
            if (name, counts, labels, seed) in ROD_TARGET_ZERO:
                continue
            part_y = labels_from_counts(counts)
            server = pfllib_server(
                "flcore.servers.serverrod",
                "FedROD",
                [list(zip(dummy_inputs(len(part_y)), part_y))],
                pfllib_args(models.BaseHeadSplit(nn.Identity(), ParamOutput(g)), "FedROD", 1, 1.0, C),
            )
            client = server.clients[0]
            with torch.no_grad():
                client.head.value.copy_(p)
            batch = [(dummy_inputs(BATCH), y)]
            client.load_train_data = lambda batch_size=None, _b=batch: FixedLoader(_b)
            client.loss = RecordingCE()
            clientrod.balanced_softmax_loss = rec = Recorder(bsm_orig)
            try:
                client.train()
            finally:
                clientrod.balanced_softmax_loss = bsm_orig
            rod["cases"].append(
                entry
                | {
                    "p": fl(p),
                    "sample_per_class": fl(client.sample_per_class),
                    "loss_g": rec.values[0],
                    "grad_g": fl(client.model.head.value.grad),
                    "loss_p": client.loss.values[0],
                    "grad_p": fl(client.head.value.grad),
                    "g_plus_p_not_their_code": fl(g + p),  # clientrod.py:91 at evaluation
                }
            )

        for name, labels0, labels1, seed in ROUND_CASES:
            inp = round_inputs(labels0, labels1, seed)
            xs = [t64(x) for x in inp["x"]]
            ys = [torch.tensor(v, dtype=torch.int64) for v in inp["labels"]]
            sets = [list(zip(x, y)) for x, y in zip(xs, ys)]
            loaders = [batches_of(x, y) for x, y in zip(xs, ys)]
            server = pfllib_server(
                "flcore.servers.serverrod", "FedROD", sets, pfllib_args(round_model(models, inp), "FedROD", 2, LR, 3)
            )
            recs = {}
            for c in server.clients:
                c.loss = RecordingCE()
            clientrod.balanced_softmax_loss = Recorder(bsm_orig)
            try:
                rec_all = clientrod.balanced_softmax_loss
                order = []
                for c in server.clients:
                    orig_train = c.train

                    def train(_c=c, _t=orig_train, order=order, rec_all=rec_all, recs=recs):
                        order.append(_c.id)
                        start = len(rec_all.values)
                        _t()
                        recs[_c.id] = rec_all.values[start:]

                    c.train = train
                run_server_round(server, loaders)
            finally:
                clientrod.balanced_softmax_loss = bsm_orig
            tx = t64(inp["test_x"])
            per_client = []
            for c in server.clients:
                with torch.no_grad():
                    rep = c.model.base(tx)
                    out = c.model.head(rep) + c.head(rep)  # NOT their code: mirrors clientrod.py:88-91
                test_batch = [(tx, torch.tensor(inp["test_y"]))]
                c.load_test_data = lambda batch_size=None, _b=test_batch: FixedLoader(_b)
                acc, num, auc = c.test_metrics()
                per_client.append(
                    {
                        "id": c.id,
                        "sample_per_class": fl(c.sample_per_class),
                        "batch_losses_g": recs[c.id],
                        "batch_losses_p": c.loss.values,
                        "model_after": params_of(c.model),
                        "personal_head_after": params_of(c.head),
                        "eval_logits_test_x": fl(out),
                        "their_test_metrics_acc": [acc, num],
                    }
                )
            rod["rounds"].append(
                {
                    "case": name,
                    "lr": LR,
                    "inputs": round_inputs_json(inp),
                    "batches": "client k: rows 0-3 then 4-7 of x[k] (fixed order)",
                    "train_order": order,
                    "clients": per_client,
                    "uploaded_weights": [float(w) for w in server.uploaded_weights],
                    "uploaded_ids": list(server.uploaded_ids),
                    "global_after": params_of(server.global_model),
                }
            )

    # ================================================================ FedNTD (PFLlib) + authors' NTD_Loss
    ntd = {
        "method": "FedNTD",
        "repository": "TsingZ0/PFLlib",
        "source": src["pfllib"],
        "paths": ["system/flcore/clients/clientntd.py", "system/flcore/servers/serverntd.py"],
        "formula": (
            "loss = CE(z, y) + beta * tau**2 * KLDiv_batchmean(log_softmax(z_nt / tau), softmax(zg_nt / tau)), "
            "z_nt / zg_nt = local / global logits with the label column removed (refine_as_not_true), "
            "global logits under no_grad; KLDiv_batchmean = sum over batch and classes of q*(log q - log p) / B"
        ),
        "where": {
            "beta, tau from args": "system/flcore/clients/clientntd.py:14-15",
            "KLDivLoss(reduction='batchmean')": "system/flcore/clients/clientntd.py:18",
            "loss": "system/flcore/clients/clientntd.py:40-43",
            "global model = server's global_model object, eval(), requires_grad_(False)": (
                "system/flcore/clients/clientntd.py:56-60"
            ),
            "_ntd_loss (tau**2 at :75)": "system/flcore/clients/clientntd.py:63-77",
            "refine_as_not_true": "system/flcore/clients/clientntd.py:81-89",
            "aggregation: uniform 1/num_join_clients (overrides add_parameters)": (
                "system/flcore/servers/serverntd.py:69-71"
            ),
        },
        "defaults": {
            "tau": 1.0,
            "tau_where": "system/main.py:469 (shared with MOON / FedCAC / FedLC)",
            "beta": 0.0,
            "beta_where": "system/main.py:446 (shared default; with beta 0 FedNTD is FedAvg)",
            "paper_and_authors_config": "tau 1, beta 1 (Lee-Gihun/FedNTD config/fedntd.json:15); NTD_Loss class "
            "defaults tau=3, beta=1 (algorithms/fedntd/criterion.py:13)",
            "local_learning_rate": 0.005,
            "batch_size": 10,
            "local_epochs": 1,
            "defaults_where": "system/main.py:399-407",
        },
        "notes": [
            "With 2 classes the not-true logits have one column: log_softmax = 0, softmax = 1, so the KL term is "
            "exactly 0 and the gradient is the CE gradient (cases 'c2').",
            "Aggregation is UNIFORM over the clients (serverntd.py:71, / self.num_join_clients), unlike FedAvg's "
            "sample-weighted average used by the other PFLlib methods; uploaded_weights are computed but unused.",
            "Loss cases: client.model = fixed-output module holding z, client.global_model set directly to a "
            "fixed-output module holding zg, eval(), requires_grad_(False) (what set_parameters does); lr 1.0, 1 batch.",
            "Rounds: 2 clients (8 and 4 samples), BaseHeadSplit(Linear(3,4), Linear(4,3)), beta 1, tau 1, SGD lr 0.1; "
            "local starts equal to global, so the KL term and its gradient are 0 on the first batch.",
        ],
        "cases": [],
        "rounds": [],
    }
    ntd_orig = {
        "method": "FedNTD (authors' NTD_Loss)",
        "repository": "Lee-Gihun/FedNTD",
        "source": src["fedntd"],
        "paths": ["algorithms/fedntd/criterion.py", "algorithms/fedntd/utils.py"],
        "formula": "same as PFLlib: CE + beta * tau**2 * KLDiv_batchmean over the not-true classes (criterion.py:42)",
        "where": {
            "NTD_Loss": "algorithms/fedntd/criterion.py:10-44",
            "refine_as_not_true": "algorithms/fedntd/utils.py:6-14",
        },
        "notes": [
            "An earlier commit (043269e, 2022-11-29) had no tau**2 factor; HEAD (57789c8 onward) has it.",
            "Imported via a stub package object for algorithms.fedntd (its __init__ imports the trainer/server).",
        ],
        "cases": [],
    }
    with isolated(psys, stubs):
        importlib.import_module("flcore.clients.clientntd")
        models = importlib.import_module("flcore.trainmodel.models")
        for name, C, labels, seed in NTD_CASES:
            rng = np.random.RandomState(seed)
            z, zg = t64(rng.normal(0.0, 2.0, size=(BATCH, C))), t64(rng.normal(0.0, 2.0, size=(BATCH, C)))
            y = torch.tensor(labels, dtype=torch.int64)
            for tau in NTD_TAUS:
                for beta in NTD_BETAS:
                    server = pfllib_server(
                        "flcore.servers.serverntd",
                        "FedNTD",
                        [list(zip(dummy_inputs(BATCH), y))],
                        pfllib_args(ParamOutput(z), "FedNTD", 1, 1.0, C, tau=tau, beta=beta),
                    )
                    client = server.clients[0]
                    client.global_model = ParamOutput(zg).eval().requires_grad_(False)
                    batch = [(dummy_inputs(BATCH), y)]
                    client.load_train_data = lambda batch_size=None, _b=batch: FixedLoader(_b)
                    client.loss = RecordingCE()
                    client._ntd_loss = rec = Recorder(client._ntd_loss)
                    client.train()
                    ce, nt = client.loss.values[0], rec.values[0]
                    ntd["cases"].append(
                        {
                            "case": name,
                            "tau": tau,
                            "beta": beta,
                            "labels": labels,
                            "z": fl(z),
                            "zg": fl(zg),
                            "ce": ce,
                            "ntd": nt,
                            "loss": ce + beta * nt,
                            "grad_z": fl(client.model.value.grad),
                        }
                    )

        for name, labels0, labels1, seed in ROUND_CASES:
            inp = round_inputs(labels0, labels1, seed)
            xs = [t64(x) for x in inp["x"]]
            ys = [torch.tensor(v, dtype=torch.int64) for v in inp["labels"]]
            sets = [list(zip(x, y)) for x, y in zip(xs, ys)]
            loaders = [batches_of(x, y) for x, y in zip(xs, ys)]
            args = pfllib_args(round_model(models, inp), "FedNTD", 2, LR, 3, tau=1.0, beta=1.0)
            server = pfllib_server("flcore.servers.serverntd", "FedNTD", sets, args)
            recs = {}
            for c in server.clients:
                c.loss = RecordingCE()
                c._ntd_loss = recs[c.id] = Recorder(c._ntd_loss)
            global_before = params_of(server.global_model)
            run_server_round(server, loaders)
            ntd["rounds"].append(
                {
                    "case": name,
                    "lr": LR,
                    "tau": 1.0,
                    "beta": 1.0,
                    "inputs": round_inputs_json(inp, with_test=False),
                    "batches": "client k: rows 0-3 then 4-7 of x[k] (fixed order)",
                    "global_before": global_before,
                    "clients": [
                        {
                            "id": c.id,
                            "batch_ce": c.loss.values,
                            "batch_ntd": recs[c.id].values,
                            "model_after": params_of(c.model),
                        }
                        for c in server.clients
                    ],
                    "uploaded_weights_unused": [float(w) for w in server.uploaded_weights],
                    "global_after": params_of(server.global_model),
                }
            )

    froot = tmp / "fedntd"
    pkg = types.ModuleType("algorithms")
    pkg.__path__ = [str(froot / "algorithms")]
    sub = types.ModuleType("algorithms.fedntd")
    sub.__path__ = [str(froot / "algorithms" / "fedntd")]
    with isolated(froot, stubs | {"algorithms": pkg, "algorithms.fedntd": sub}):
        crit_mod = importlib.import_module("algorithms.fedntd.criterion")
        for case in ntd["cases"]:
            C = len(case["z"][0])
            z = t64(case["z"]).requires_grad_(True)
            crit = crit_mod.NTD_Loss(num_classes=C, tau=case["tau"], beta=case["beta"])
            loss = crit(z, torch.tensor(case["labels"]), t64(case["zg"]))
            loss.backward()
            ntd_orig["cases"].append(
                {k: case[k] for k in ("case", "tau", "beta", "labels")}
                | {
                    "loss": float(loss),
                    "ntd": float(crit._ntd_loss(z, t64(case["zg"]), torch.tensor(case["labels"]))),
                    "grad_z": fl(z.grad),
                }
            )

    # ================================================================ CCVR (FL-bench)
    ccvr = {
        "method": "CCVR",
        "repository": "KarhouTam/FL-bench",
        "source": src["flbench"],
        "paths": ["src/client/ccvr.py", "src/server/ccvr.py"],
        "formula": {
            "client": "per class c: mu_kc = mean of features, S_kc = cov with correction=0 (divide by N_kc), "
            "N_kc = count; a class absent on the client: zero mean and zero covariance",
            "global_mean": "mu_c = sum_k (N_kc / N_c) mu_kc, for N_c > 0 (else None)",
            "global_cov": "Sigma_c = sum_k (N_kc - 1)/(N_c - 1) S_kc + sum_k N_kc/(N_c - 1) mu_kc mu_kc^T "
            "- N_c/(N_c - 1) mu_c mu_c^T, only for N_c > 1 (else None: no virtual samples for that class)",
            "virtual": "np.random.multivariate_normal(mu_c, Sigma_c, sample_per_class) per class with both mu_c and "
            "Sigma_c, cast to float32",
            "recalibration": "load the global params, then ONE pass over the virtual set (DataLoader shuffle=True, "
            "batch_size = common.batch_size), SGD(classifier params, lr = optimizer.lr), CE on classifier(x)",
        },
        "where": {
            "client statistics (cov correction=0 at :34)": "src/client/ccvr.py:12-45",
            "features = model.get_last_features (base output, detached, dropout off)": "src/utils/models.py:69-91",
            "global mean": "src/server/ccvr.py:42-51",
            "global covariance": "src/server/ccvr.py:52-69",
            "sampler (global numpy RNG)": "src/server/ccvr.py:73-98",
            "recalibration": "src/server/ccvr.py:100-137",
            "used only for evaluation: params restored after testing": "src/server/ccvr.py:25-29",
            "seed: fix_random_seed(common.seed) seeds numpy/torch/random once at server start": (
                "src/server/fedavg.py:57, src/utils/functional.py:18-32"
            ),
        },
        "defaults": {
            "sample_per_class": 200,
            "sample_per_class_where": "src/server/ccvr.py:22",
            "recalibration_lr = optimizer.lr": 0.01,
            "recalibration_batch_size = common.batch_size": 32,
            "seed": 42,
            "defaults_where": "config/defaults.yaml:48 (lr), :82 (batch_size), :78 (seed)",
            "recalibration_epochs": "1 (a single pass, src/server/ccvr.py:127-132; not configurable)",
            "optimizer": "plain torch.optim.SGD(lr) regardless of optimizer.momentum/weight_decay (ccvr.py:122-124)",
        },
        "notes": [
            "Denominators: the CLIENT covariance divides by N_kc (correction=0) but the SERVER formula weights it by "
            "(N_kc - 1)/(N_c - 1), which is the paper's pooling formula for UNBIASED client covariances. So the result "
            "is not the pooled unbiased covariance: Sigma_c = pooled_unbiased - sum_k (N_kc - 1)/(N_kc (N_c - 1)) "
            "S_unbiased_kc. Both are recorded (pooled_* are NOT their code: np.cov of the concatenated features).",
            "A client with N_kc = 1 contributes a zero covariance (correction=0 of one sample) with weight 0.",
            "Class with N_c = 1 has a mean but no covariance: no virtual samples, so it is absent from recalibration.",
            "compute_classes_mean_cov indexes the per-client lists by client id (features_covs[k] for k in "
            "train_clients, ccvr.py:54-65): correct only when train_clients is a permutation of 0..K-1; the case "
            "'train_clients_0_2' records the IndexError.",
            "The recalibration is run at every client-test time and the pre-calibration global params are restored "
            "afterwards (ccvr.py:25-29): the recalibrated classifier is evaluated but never trained on further.",
            "Virtual features are float32 in their code; the fixed virtual features given here are float64 "
            "(mu_c + fixed noise), and the shuffle of their DataLoader is replaced by a fixed order.",
            "sampler_seed42: their generate_virtual_representation after np.random.seed(42) (numpy "
            f"{np.__version__}; multivariate_normal output depends on the numpy version).",
            "Client statistics run through their FLbenchTrainer serial exec and CCVRClient (constructed with "
            "__new__; set_parameters stubbed to select the client's fixed loader); the server is a CCVRServer "
            "constructed with __new__ (model = Identity base + Linear classifier), NUM_CLASSES given a stub key.",
        ],
        "cases": [],
    }
    froot = tmp / "flbench"
    for name, counts, d, seed in CCVR_CASES:
        C = len(counts[0])
        inp = ccvr_inputs(counts, d, seed)
        for calib in CCVR_CALIB:
            out = flbench_ccvr(froot, fstubs, inp, C, d, calib)
            feats = [
                np.concatenate([cl["features"][np.array(cl["labels"]) == c] for cl in inp["clients"]]) for c in range(C)
            ]
            ccvr["cases"].append(
                {
                    "case": name,
                    "batch_size": calib[0],
                    "lr": calib[1],
                    "inputs": {
                        "clients": [
                            {"counts": cl["counts"], "labels": cl["labels"], "features": fl(cl["features"])}
                            for cl in inp["clients"]
                        ],
                        "classifier_W0": fl(inp["classifier_W0"]),
                        "classifier_b0": fl(inp["classifier_b0"]),
                        "sample_per_class": inp["virtual_per_class"],
                    },
                    "client_batches": "batches of 4 rows of each client's features in order",
                }
                | out
                | {
                    "pooled_unbiased_cov_not_their_code": [pooled_cov(f, 1) for f in feats],
                    "pooled_biased_cov_not_their_code": [pooled_cov(f, 0) if len(f) else None for f in feats],
                    "identity_cov_not_their_code": ccvr_identity(inp, C),
                }
            )
    bad = flbench_ccvr(froot, fstubs, ccvr_inputs(*CCVR_CASES[0][1:]), 3, 3, CCVR_CALIB[0], train_clients=(0, 2))
    ccvr["cases"].append({"case": "train_clients_0_2", "train_clients": [0, 2]} | bad)

    # ================================================================ cross-checks
    def maxdiff(u, v):
        fu = np.asarray(u, dtype=np.float64).ravel()
        fv = np.asarray(v, dtype=np.float64).ravel()
        return float(np.max(np.abs(fu - fv)))

    checks = []
    for c1, c2 in zip(ntd["cases"], ntd_orig["cases"]):
        checks.append(
            {
                "what": f"FedNTD PFLlib vs Lee-Gihun NTD_Loss, {c1['case']}, tau={c1['tau']}, beta={c1['beta']}",
                "loss": abs(c1["loss"] - c2["loss"]),
                "grad_z": maxdiff(c1["grad_z"], c2["grad_z"]),
            }
        )
    direct = {c["case"]: c for c in rod["direct_cases"]}
    for c in rod["cases"]:
        checks.append(
            {
                "what": f"FedRoD balanced_softmax_loss direct vs through clientROD.train(), {c['case']}",
                "loss_g": abs(c["loss_g"] - direct[c["case"]]["loss_g"]),
                "grad_g": maxdiff(c["grad_g"], direct[c["case"]]["grad_g"]),
            }
        )
    for c in ccvr["cases"]:
        if "global_covs" in c:
            for k, (g, pu) in enumerate(zip(c["global_covs"], c["pooled_unbiased_cov_not_their_code"])):
                if g is not None and pu is not None:
                    checks.append(
                        {
                            "what": f"CCVR {c['case']} bs={c['batch_size']} class {k}: their Sigma_c vs pooled "
                            "unbiased covariance (nonzero: see notes), and vs identity_cov",
                            "max_abs_diff": maxdiff(g, pu),
                            "vs_identity_max_abs_diff": maxdiff(g, c["identity_cov_not_their_code"][k]),
                        }
                    )

    out = {
        "generated_by": "tools/label_skew_reference_part2.py",
        "torch": torch.__version__,
        "numpy": np.__version__,
        "python": sys.version.split()[0],
        "dtype": "float64 (torch default dtype set to float64; inputs float64); CCVR sampler output float32",
        "float_encoding": "JSON numbers are Python float reprs (round-trip exact); non-finite values are strings",
        "stubbed_modules": sorted(set(stubs) | set(fstubs)),
        "rerun": "/work/main/.venv/bin/python tools/label_skew_reference_part2.py --pfllib DIR --fedntd DIR --flbench DIR",
        "not_run": [
            "KarhouTam/FL-bench src/client/fedrod.py: another FedRoD with a different personal branch: "
            "loss = BSM(g, y; counts**gamma) + CE(p, y) with p = personalized_classifier(z) ALONE (not g + p), no "
            "detach (the body gets both gradients), one optimizer; eval uses p alone (eval_per=1) or g",
        ],
        "conventions": {
            "batch_size": BATCH,
            "loss": "mean over the batch (CrossEntropyLoss default); KLDiv 'batchmean'",
            "grad": "d loss / d tensor for the single batch of the case",
            "W": "Linear weight, shape (out, in); state_dict keys as in the references' models",
            "round": "2 clients, fixed batches of 4 in fixed order, 1 local epoch, plain SGD lr 0.1",
            "seeds": "numpy.random.RandomState(seed) per case; see *_CASES in the script",
        },
        "references": {"pfllib_fedrod": rod, "pfllib_fedntd": ntd, "fedntd_authors": ntd_orig, "flbench_ccvr": ccvr},
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
