"""``mpicd run`` in this process, then every rank saves its clients' models as the run left them.

    mpiexec -n N .venv/bin/python tools/final_models.py OUT_DIR CONFIG [key=value ...]

writes OUT_DIR/run.h5 (the results file) and OUT_DIR/model_client<I>.pt (client I's state_dict
after the last round: for FedAvg the averaged model every peer receives). The input of the
membership attack on FedAvg's model (tools/privacy_audit.py). Why not the checkpoints: a run never
checkpoints its last round and a complete run removes the others (mpicd.run.resume). Training is
mpicd's own code path; this only records each Client this rank builds (a wrapper around
Client.__init__ that changes nothing it does) and saves its model once ``mpicd run`` returned 0
(one client per rank or several, ``clients_per_rank``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mpicd.cli import main  # noqa: E402
from mpicd.run.client import Client  # noqa: E402


def drive(out: Path, args: list[str]) -> int:
    clients: dict[int, Client] = {}
    original = Client.__init__

    def init(self, *rest, **kwargs):
        original(self, *rest, **kwargs)
        clients[self.index] = self

    Client.__init__ = init
    code = main(["run", *args, "--out", str(out / "run.h5"), "--overwrite"])
    if code == 0:
        for index, client in sorted(clients.items()):
            state = {k: v.detach().cpu().clone() for k, v in client.model.state_dict().items()}
            torch.save(state, out / f"model_client{index}.pt")
    return code


if __name__ == "__main__":
    raise SystemExit(drive(Path(sys.argv[1]), sys.argv[2:]))
