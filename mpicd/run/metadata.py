"""What a run records about itself besides its rounds: the results file's attributes (software versions,
the model, privacy settings, backend determinism settings) and each client's placement row (host,
device, threads, CPU model)."""

from __future__ import annotations

import platform
from dataclasses import asdict

import numpy as np
import torch
import yaml

from mpicd import __version__
from mpicd.algorithms import Sizes
from mpicd.models.networks import num_parameters
from mpicd.privacy import ADJACENCY
from mpicd.run.client import Client
from mpicd.run.plan import Plan


NOISE_ATTR = {
    "secret": "secret: drawn from a key per client that never left its rank",
    "seeded": "seeded: NOT PRIVATE, drawn from the run's seed, which any peer can redraw (privacy.noise)",
}
"""The attr ``privacy_noise`` by privacy.noise: what a release's Poisson sample and noise were drawn from."""


def software_versions() -> dict:
    import h5py
    import mpi4py
    from mpi4py import MPI

    return {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "torch": str(torch.__version__),
        "h5py": h5py.__version__,
        "hdf5": h5py.version.hdf5_version,
        "h5py_mpi": bool(h5py.get_config().mpi),
        "mpi4py": mpi4py.__version__,
        "mpi": MPI.Get_library_version().splitlines()[0].strip(),
    }


def results_attrs(plan: Plan, client: Client) -> dict:
    dataset = plan.dataset
    return {
        "config": yaml.safe_dump(plan.resolved_config, sort_keys=False),
        "mpicd_version": __version__,
        "versions": yaml.safe_dump(software_versions(), sort_keys=False),
        "algorithm": plan.algorithm_cls.name,
        "dataset": dataset.name,
        "clients": plan.config.clients,
        "rounds": plan.config.rounds,
        "seed": plan.config.seed,
        "skew": plan.config.data.skew,
        "images_per_class": plan.partition.base_per_class,
        "num_parameters": num_parameters(client.model),
        "feature_dim": client.model.feature_dim,
        "num_classes": dataset.num_classes,
        "class_names": list(dataset.class_names),
        "label_map": getattr(dataset, "label_map_text", "none (the file's own labels)"),
        "data_md5": getattr(dataset, "md5", None) or "none",
        "eval_split": dataset.eval_split,
        "val_split": getattr(dataset, "val_split", "none"),
        "normalization": yaml.safe_dump(getattr(dataset, "normalization", None), sort_keys=False),
        "preprocessing": getattr(dataset, "preprocessing", None) or "none",
        "backends": yaml.safe_dump(backend_settings(), sort_keys=False),
        "payload_sizes": yaml.safe_dump(asdict(Sizes.of(client.model, plan.config.clients)), sort_keys=False),
        **privacy_attrs(plan),
    }


def privacy_attrs(plan: Plan) -> dict:
    """With privacy: what the accountant was given (sigma derived or not, the release's multiplier)."""
    if plan.privacy is None:
        return {}
    s = plan.privacy
    return {
        "privacy_noise_multiplier": s.sigma,
        "privacy_release_multiplier": s.sigma if plan.algorithm_cls.dpsgd else s.multiplier,
        "privacy_sample_rate": "1 / ceil(n / train.batch_size) (DP-SGD)" if plan.algorithm_cls.dpsgd else s.q,
        "privacy_clip": s.clip,
        "privacy_delta": s.delta,
        "privacy_accountant": "dp-accounting PLD, Poisson-subsampled Gaussian, per client (add/remove-one's PLD, "
        "the zero-out adjacency's for these releases: mpicd.privacy)",
        "privacy_adjacency": ADJACENCY,
        "privacy_noise": NOISE_ATTR[s.noise],
        **plan.algorithm_cls.release_attrs(s),  # a further release's own (CCVR's statistics)
    }


def backend_settings() -> dict:
    """The kernel choices that can change results on a GPU, as this rank ran them."""
    cudnn = torch.backends.cudnn
    return {
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "cudnn_available": bool(cudnn.is_available()),
        "cudnn_version": cudnn.version() if cudnn.is_available() else None,
        "cudnn_enabled": bool(cudnn.enabled),
        "cudnn_benchmark": bool(cudnn.benchmark),
        "cudnn_deterministic": bool(cudnn.deterministic),
        "cudnn_allow_tf32": bool(cudnn.allow_tf32),
        "cuda_matmul_allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
    }


def placement_row(placement) -> dict:
    import socket

    return {
        "host": socket.gethostname(),
        "local_rank": placement.local_rank,
        "device": placement.device,
        "threads": placement.threads,
        "cpu": cpu_model(),
    }


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo; else what platform knows): results are bit-identical
    only between runs on the same CPU model with the same threads and library versions."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "cpu model"):
                    return " ".join(value.split())
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"
