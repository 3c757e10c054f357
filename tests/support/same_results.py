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
