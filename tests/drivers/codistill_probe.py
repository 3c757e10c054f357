"""Run under mpiexec: what co-distillation sends, receives and adds to the loss, for the tests to
recompute by hand. argv: OUT_DIR [PNEUMONIA_NPZ or -].

For each variant (quick-start data; PneumoniaMNIST too if given) a Client trains a few rounds
through the real hooks and ``Client.local_epochs``; every rank dumps to
``OUT/<variant>_rank<r>.npz``: its config and overrides, its training data as the algorithm sees
it, and per round its model state (``state_<round>/<name>``, after before_epoch), the indices it
averages per shared class (``subset_<round>_<class>``), what it received from each teacher
(``received_<round>_<teacher>``), the shared assignment (``teachers_<round>``) and, per
minibatch j, the labels, the features, the teacher used and the extra term returned
(``y_<round>_<j>``, ``f_<round>_<j>``, ``teacher_<round>_<j>``, ``term_<round>_<j>``: NaN = none).
"""

import sys
from pathlib import Path

import numpy as np
import torch

from mpicd.config.loading import load_config
from mpicd.mpi.comm import Comm
from mpicd.mpi.placement import abort_on_exception
from mpicd.run.client import Client
from mpicd.run.plan import prepare

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "configs" / "quickstart.yaml"
PNEUMONIA_CONFIG = ROOT / "configs" / "pneumoniamnist.yaml"

# name -> (config, overrides, rounds, rounds whose model state is dumped)
VARIANTS = {
    "round_all": (QUICKSTART, ["algorithm={name: codistill, lambda: 0.5}"], 2, None),
    # skew 0 and batches of 4: batches with none, some and only images of the teacher's class all occur
    "round_k5": (
        QUICKSTART,
        ["algorithm={name: codistill, lambda: 0.5, k: 5}", "train.batch_size=4", "data.skew=0.0"],
        2,
        None,
    ),
    "batch_k5": (
        QUICKSTART,
        ["algorithm={name: codistill, lambda: 2.0, k: 5, teacher_per: batch}", "train.batch_size=4"],
        3,
        None,
    ),
    "classes_all_k3": (QUICKSTART, ["algorithm={name: codistill, k: 3, classes: all}"], 2, None),
}

comm = Comm()
out = Path(sys.argv[1])
if len(sys.argv) > 2 and sys.argv[2] != "-":
    small = [f"data.path={sys.argv[2]}", "data.images_per_class=40"]
    VARIANTS["pneumonia_all"] = (PNEUMONIA_CONFIG, [*small, "algorithm={name: codistill, k: all}"], 2, None)
    VARIANTS["pneumonia_k5"] = (PNEUMONIA_CONFIG, [*small, "algorithm={name: codistill, k: 5}"], 2, None)
    # ResNet-18 has BatchNorm, so eval mode matters; its state (45 MB) is dumped for the last round only
    VARIANTS["pneumonia_resnet_k5"] = (
        PNEUMONIA_CONFIG,
        [
            f"data.path={sys.argv[2]}",
            "data.images_per_class=20",
            "model.name=resnet18",
            "algorithm={name: codistill, k: 5}",
        ],
        2,
        {1},
    )
torch.set_num_threads(1)


def probe(variant: str, config: Path, overrides: list[str], rounds: int, state_rounds) -> None:
    overrides = [f"clients={comm.size}", *overrides]
    client = Client(prepare(load_config(config, overrides)), comm, "cpu")
    alg = client.algorithm
    dump = {
        "config": np.array(str(config)),
        "overrides": np.array(overrides),
        "train_x": alg.ctx.train_x.cpu().numpy(),
        "train_y": alg.ctx.train_y.cpu().numpy(),
    }
    used = [-1]
    draw, extra = alg.batch_teacher, alg.extra_loss

    def batch_teacher() -> int:
        used[0] = draw()
        return used[0]

    def extra_loss(batch):
        used[0] = -1
        term = extra(batch)
        j = sum(key.startswith(f"y_{r}_") for key in dump)
        dump[f"y_{r}_{j}"] = batch.y.cpu().numpy()
        dump[f"f_{r}_{j}"] = batch.features.detach().cpu().numpy()
        dump[f"teacher_{r}_{j}"] = np.array(used[0])
        dump[f"term_{r}_{j}"] = np.array(np.nan if term is None else float(term.detach()))
        return term

    alg.batch_teacher, alg.extra_loss = batch_teacher, extra_loss
    for r in range(rounds):
        alg.before_epoch(r)
        dump[f"teachers_{r}"] = alg.teachers.copy()
        if state_rounds is None or r in state_rounds:
            for name, value in client.model.state_dict().items():
                dump[f"state_{r}/{name}"] = value.detach().cpu().numpy().copy()  # not a view: training goes on
        for c in alg.shared_classes:
            dump[f"subset_{r}_{c}"] = alg.subset(r, c).cpu().numpy()
        for t, means in alg.received.items():
            dump[f"received_{r}_{t}"] = means.cpu().numpy()
        client.local_epochs(r)
        alg.after_epoch(r)
    np.savez(out / f"{variant}_rank{comm.rank}.npz", **dump)


with abort_on_exception(comm.mpi):
    for variant, spec in VARIANTS.items():
        probe(variant, *spec)
    comm.mpi.Barrier()
    if comm.rank == 0:
        print("codistill probe done", flush=True)
