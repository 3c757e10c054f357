"""``mpicd ARGS`` in this process, then print which heavy torch subsystems it imported (test_optim)."""

import os
import sys

from mpicd.cli import main

rc = main(sys.argv[1:])
import torch  # noqa: E402  (after the run: only to read the flags it set)

loaded = {name: int(name in sys.modules) for name in ("torch._dynamo", "torch._inductor", "sympy")}
rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", "0")))
print(
    f"modules[{rank}]: "
    + " ".join(f"{k}={v}" for k, v in loaded.items())
    + f" deterministic={int(torch.are_deterministic_algorithms_enabled())}",
    flush=True,
)
sys.exit(rc)
