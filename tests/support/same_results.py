"""Two results files compared dataset by dataset: what must be equal bit for bit between two runs of
one experiment on different layouts or evaluation settings (timings, placement and per-rank MPI bytes
excepted)."""

import h5py
import numpy as np

from conftest import is_timing

NOT_COMPARED_ATTRS = {"startup_seconds", "run_id", "ranks", "client_rank", "resumed_at", "config"}


def compared(path) -> dict:
    found = {}
    with h5py.File(path, "r") as f:
        found.update({f"attr:{k}": v for k, v in f.attrs.items() if k not in NOT_COMPARED_ATTRS})

        def take(name, obj):
            if not isinstance(obj, h5py.Dataset) or is_timing(name):
                return
            if name.startswith(("placement/", "comm/bytes_mpi_", "comm/outside_rounds", "comm/channel_bytes")):
                return
            found[name] = obj[()]

        f.visititems(take)
    return found


def differences(a: dict, b: dict, rounding: bool = False) -> list[str]:
    """Names whose values differ; ``rounding``: floats may differ by float32 rounding."""
    if a.keys() != b.keys():
        return [f"keys: {sorted(set(a) ^ set(b))}"]
    wrong = []
    for key in a:
        x, y = a[key], b[key]
        floats = isinstance(x, np.ndarray) and x.dtype.kind == "f"
        if np.array_equal(x, y, equal_nan=floats):
            continue
        if rounding and floats and np.allclose(x, y, rtol=1e-5, atol=1e-6, equal_nan=True):
            continue
        wrong.append(key)
    return wrong


NOT_DIGESTED = {"attr:config_hash", "attr:versions", "attr:mpicd_version"}  # paths and versions, not results


def digest(path) -> str:
    """SHA-256 of everything :func:`compared` compares but the config hash (it holds the data's path) and
    the software versions: equal digests, equal results, bit for bit."""
    import hashlib

    h = hashlib.sha256()
    for name, value in sorted(compared(path).items()):
        if name in NOT_DIGESTED:
            continue
        value = np.asarray(value)
        h.update(f"{name}:{value.dtype.str}:{value.shape}:".encode())
        h.update(value.tobytes() if value.dtype != object else repr(value.tolist()).encode())
    return h.hexdigest()


def machine() -> dict:
    """What a digest holds for: the CPU model (as the results file records it) and the numeric libraries."""
    import platform

    import torch

    from mpicd.run.metadata import cpu_model

    return {"cpu": cpu_model(), "machine": platform.machine(), "torch": torch.__version__, "numpy": np.__version__}


if __name__ == "__main__":  # python tests/support/same_results.py FOLDER: the digests of FOLDER's files, as JSON
    import json
    import sys
    from pathlib import Path

    files = sorted(Path(sys.argv[1]).glob("*.h5"))
    print(json.dumps({"machine": machine(), "digests": {f.stem: digest(f) for f in files}}, indent=1))
