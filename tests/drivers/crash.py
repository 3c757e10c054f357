"""Run under mpiexec: rank 1 raises in round 2 of a co-distillation run (argv: results file)."""

import sys

from mpicd.algorithms import REGISTRY
from mpicd.algorithms.codistill import CoDistillation
from mpicd.cli import main


class CrashingCoDistillation(CoDistillation):
    name = "crashing"

    def before_epoch(self, round_index):
        if round_index == 2 and self.ctx.index == 1:
            raise RuntimeError("injected failure on rank 1 in round 2")
        super().before_epoch(round_index)


REGISTRY[CrashingCoDistillation.name] = CrashingCoDistillation
config = sys.argv[1]
sys.exit(main(["run", config, "algorithm.name=crashing", "rounds=6", "--out", sys.argv[2]]))
