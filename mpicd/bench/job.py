"""The MPI job ``mpicd bench`` launches (``python -m mpicd.bench SPEC``): per repeat the anatomy runs on
every rank, then rank 0's single-process parts while the others sleep; then the network sweep.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

from mpi4py import MPI  # before torch, as mpicd run imports them
import torch

from mpicd.bench.bare import BareClient
from mpicd.bench.net import idle, sweep
from mpicd.bench.projection import model_sizes
from mpicd.config.loading import load_config
from mpicd.mpi.comm import Comm
from mpicd.mpi.placement import abort_on_exception, choose_device, cpu_threads, place
from mpicd.run.loop import run_rounds
from mpicd.run.plan import prepare


def _mpicd_run(comm, config: str, overrides: list[str], out: Path, threads: int | None = None) -> None:
    """One run through mpicd's round loop, as ``mpicd run`` drives it, on ``comm``'s ranks
    (``threads``: torch's threads instead of the placement's, as the bench was asked)."""
    plan = prepare(load_config(config, overrides))
    placement = place(comm.mpi, plan.config.device)
    if threads is not None:
        torch.set_num_threads(threads)
        placement = dataclasses.replace(placement, threads=threads)
    run_rounds(plan, comm, placement, out, log=lambda line: None)


def _alone(spec: dict, repeat: int, out: Path) -> dict:
    """Rank 0's single-process parts of one repeat, in alternating order; raw seconds per round."""
    threads = spec["threads"] or cpu_threads(1)  # default: what mpicd gives one rank alone here
    one = [*spec["overrides"], "clients=1", "algorithm=local"]
    n = spec["ranks"]
    found = {"threads": threads}

    def device(cfg) -> str:
        return choose_device(cfg.device, 0, torch.cuda.device_count() if cfg.device != "cpu" else 0)

    def mpicd() -> None:
        _mpicd_run(Comm(MPI.COMM_SELF), spec["config"], one, out / f"single_{repeat}.h5", threads)

    def bare() -> None:
        plan = prepare(load_config(spec["config"], one))
        torch.set_num_threads(threads)
        client = BareClient(plan, 0, device(plan.config))
        seconds = []
        for _ in range(spec["rounds"]):
            seconds.append(client.train())
            client.evaluate()
        found["bare"], found["images"] = seconds, len(client.y)

    def serial() -> None:
        plan = prepare(load_config(spec["config"], [*spec["overrides"], f"clients={n}", "algorithm=local"]))
        torch.set_num_threads(threads)
        clients = [BareClient(plan, i, device(plan.config)) for i in range(n)]
        seconds = []
        for _ in range(spec["rounds"]):
            started = time.perf_counter()
            for client in clients:
                client.train()
                client.evaluate()
            seconds.append(time.perf_counter() - started)
        found["serial"] = seconds

    def resnet() -> None:
        _mpicd_run(
            Comm(MPI.COMM_SELF),
            spec["config"],
            [*one, "model.name=resnet18", f"rounds={spec['resnet_rounds']}"],
            out / f"resnet_{repeat}.h5",
            threads,
        )

    steps = [bare, mpicd, serial, resnet]
    for step in steps if repeat % 2 == 0 else steps[::-1]:
        step()
    return found


def worker(spec_path: str) -> int:
    """The MPI job: per repeat the anatomy runs (all ranks), then rank 0's single-process parts while
    the others sleep; then the network sweep. Rank 0 writes the raw figures to ``<out>/worker.json``."""
    spec = json.loads(Path(spec_path).read_text())
    out, world = Path(spec["out"]), MPI.COMM_WORLD
    common = [*spec["overrides"], f"clients={world.Get_size()}"]
    raw: dict = {"alone": []}
    with abort_on_exception(world):
        for repeat in range(spec["repeats"]):
            shift = repeat % len(spec["algorithms"])
            for name in spec["algorithms"][shift:] + spec["algorithms"][:shift]:
                _mpicd_run(Comm(world), spec["config"], [*common, f"algorithm={name}"], out / f"{name}_{repeat}.h5")
            if world.Get_rank() == 0:
                raw["alone"].append(_alone(spec, repeat, out))
                world.Ibarrier().Wait()
            else:
                idle(world)
        raw["network"] = sweep(world, spec["sizes"], spec["repeats"], spec["net_budget"], spec["net_most"])
        if world.Get_rank() == 0:
            raw["models"] = model_sizes(prepare(load_config(spec["config"], common)))
            raw["torch"] = str(torch.__version__)
            raw["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
            (out / "worker.json").write_text(json.dumps(raw))
    return 0
