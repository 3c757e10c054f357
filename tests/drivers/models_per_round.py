"""``mpicd run`` in-process, saving each rank's model after every round's training (the model that
round evaluates) as OUT/model_r<R>_rank<K>.pt, so that tests can recompute scores independently.

    mpiexec -n N python tests/drivers/models_per_round.py OUT_DIR CONFIG OVERRIDES...   (writes OUT_DIR/run.h5)
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from mpicd.cli import main
from mpicd.mpi.comm import Comm
from mpicd.mpi.placement import abort_on_exception
from mpicd.run.client import Client


def drive(out: Path, args: list[str]) -> None:
    original = Client.train_round

    def train_round(self, round_index, *rest, **kwargs):
        loss = original(self, round_index, *rest, **kwargs)
        state = {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()}
        torch.save(state, out / f"model_r{round_index}_rank{self.comm.rank}.pt")
        return loss

    Client.train_round = train_round
    comm = Comm()
    with abort_on_exception(comm.mpi):
        code = main(["run", *args, "--out", str(out / "run.h5")])
        if code != 0:
            raise RuntimeError(f"mpicd run exited with {code}")


if __name__ == "__main__":
    drive(Path(sys.argv[1]), sys.argv[2:])
