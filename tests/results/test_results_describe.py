"""A self-describing results file: every axis an HDF5 dimension scale (netCDF-4 semantics, so xarray
opens a group with named dims and coordinates), every dataset with units and a description taken
from the one declaration in mpicd/results/columns.py (layout()), whichever writer wrote it."""

import textwrap

import h5py
import numpy as np
import pytest

from mpicd.mpi.accounting import KINDS
from mpicd.mpi.channels import CHANNELS
from mpicd.results.columns import DIMENSIONS, is_scale, layout
from mpicd.results.reader import Results
from mpicd.results.verify import verify

from conftest import DRIVERS, QUICKSTART, mpicd_run, mpiexec

xr = pytest.importorskip("xarray")
pytest.importorskip("h5netcdf")

ROUNDS, CLIENTS = 3, 2
GROUPS = ("metrics", "comm", "diag", "partition", "placement")


@pytest.fixture(scope="module")
def run_file(tmp_path_factory):
    out = tmp_path_factory.mktemp("describe") / "run.h5"
    mpicd_run(CLIENTS, QUICKSTART, out, f"clients={CLIENTS}", f"rounds={ROUNDS}")
    return out


@pytest.fixture(scope="module")
def writers(tmp_path_factory):
    """tests/drivers/results_writer.py: the same rows through the mpio and the serial writer (3 ranks)."""
    folder = tmp_path_factory.mktemp("writers")
    result = mpiexec(3, str(DRIVERS / "results_writer.py"), str(folder), timeout=120)
    assert result.returncode == 0, result.stderr
    return folder


def open_group(path, group):
    return xr.open_dataset(path, engine="h5netcdf", group=group)


def class_names(path):
    with h5py.File(path, "r") as f:
        return [n.decode() if isinstance(n, bytes) else str(n) for n in f.attrs["class_names"]]


def test_metrics_group_has_named_dims_and_coordinates(run_file):
    assert class_names(run_file) == ["malignant", "benign"]  # the quickstart's breast-cancer classes
    with open_group(run_file, "metrics") as ds:
        assert dict(ds.sizes) == {"round": ROUNDS, "client": CLIENTS, "class": 2}
        assert ds["round"].values.tolist() == [1, 2, 3]
        assert ds["client"].values.tolist() == [0, 1]
        assert ds["class"].values.tolist() == ["malignant", "benign"]
        assert ds["minority_acc"].dims == ("round", "client")
        assert ds["recall"].dims == ("round", "client", "class")
        assert ds["write_seconds"].dims == ("round", "client")
        declared = {d.path.split("/", 1)[1] for d in layout(2) if d.path.startswith("metrics/")}
        assert set(ds.data_vars) == declared
        for name, var in ds.variables.items():
            assert "units" in var.attrs and var.attrs.get("description"), name
        assert ds["comm_seconds"].attrs["units"] == "seconds" and ds["test_acc"].attrs["units"] == "1"
        # the values are the file's, as Results reads them
        res = Results(run_file)
        np.testing.assert_array_equal(ds["minority_acc"].values, res.metrics["minority_acc"])
        np.testing.assert_array_equal(ds["recall"].sel(**{"class": "benign"}).values, res.metrics["recall"][:, :, 1])


def test_comm_group_has_kind_direction_and_channel(run_file):
    with open_group(run_file, "comm") as ds:
        sizes = {"round": ROUNDS, "client": CLIENTS, "kind": len(KINDS), "direction": 2, "channel": len(CHANNELS)}
        assert dict(ds.sizes) == sizes
        assert tuple(ds["kind"].values.tolist()) == KINDS
        assert tuple(ds["channel"].values.tolist()) == tuple(CHANNELS)
        assert ds["channel_bytes"].dims == ("client", "channel", "direction")
        assert ds["direction"].values.tolist() == ["sent", "received"]
        assert ds["bytes_sent"].dims == ("round", "client", "kind")
        assert ds["teacher"].dims == ("round", "client") and ds["teacher"].attrs["units"] == "client index"
        assert ds["outside_rounds"].dims == ("client", "direction")
        for name, var in ds.variables.items():
            assert "units" in var.attrs and var.attrs.get("description"), name
        assert ds["bytes_recv"].attrs["units"] == "bytes"
        total = ds["bytes_sent"].sum("kind").values
        np.testing.assert_array_equal(total, Results(run_file).metrics["bytes_sent"])


@pytest.mark.parametrize("group", ["diag", "partition", "placement"])
def test_the_other_groups_open_with_named_dims(run_file, group):
    with open_group(run_file, group) as ds:
        assert not [d for d in ds.sizes if str(d).startswith("phony_dim")], dict(ds.sizes)
        assert ds["client"].values.tolist() == [0, 1]
        for name, var in ds.variables.items():
            assert "units" in var.attrs and var.attrs.get("description"), name
    if group == "partition":
        with open_group(run_file, group) as ds:
            assert ds["train_counts"].dims == ("client", "class")
            assert ds["class"].values.tolist() == ["malignant", "benign"]


def dims_of(path):
    """{dataset: (labels, scale names, scale values)} of every data set, and the scale datasets."""
    found, scales = {}, {}
    with h5py.File(path, "r") as f:

        def visit(name, obj):
            if not isinstance(obj, h5py.Dataset):
                return
            if is_scale(obj):
                scales[name] = obj[()].tolist()
                return
            attached = [[s.name.rsplit("/", 1)[1] for s in d.values()] for d in obj.dims]
            found[name] = (
                tuple(d.label for d in obj.dims),
                attached,
                obj.attrs.get("units"),
                obj.attrs.get("description"),
            )

        f.visititems(visit)
    return found, scales


def test_h5py_sees_labelled_dims_on_every_dataset(run_file):
    found, scales = dims_of(run_file)
    declared = {d.path: d for d in layout(2)}
    assert set(found) == set(declared)
    for name, (labels, attached, units, description) in found.items():
        assert labels == declared[name].all_dims and all(labels), name
        assert attached == [[label] for label in labels], name  # each axis: its group's scale of that name
        assert units is not None and description == declared[name].description, name
    groups = {(name.split("/")[0], name.split("/")[1]) for name in scales}
    assert {dim for _, dim in groups} == set(DIMENSIONS) - {"release"}  # release: a private run's file only
    assert scales["metrics/round"] == [1, 2, 3] and scales["metrics/class"] == [b"malignant", b"benign"]


def test_serial_writer_gives_the_same_dims(writers):
    mpio, serial = dims_of(writers / "mpio.h5"), dims_of(writers / "serial.h5")
    assert mpio == serial
    found, scales = mpio
    assert set(found) == {d.path for d in layout(2)}
    assert scales["comm/kind"] == [k.encode() for k in KINDS] and scales["metrics/client"] == [0, 1, 2]
    assert scales["metrics/class"] == [b"0", b"1"]  # no class_names attr: the class indices
    for writer in ("mpio", "serial"):
        with open_group(writers / f"{writer}.h5", "metrics") as ds:
            assert dict(ds.sizes) == {"round": 3, "client": 3, "class": 2}
            np.testing.assert_array_equal(ds["train_loss"].values[:2], [[0, 1, 2], [0.1, 1.1, 2.1]])


def test_readers_skip_the_scales(run_file):
    res = Results(run_file)
    assert not set(res.metrics) & set(DIMENSIONS) and not set(res.partition) & set(DIMENSIONS)
    assert not set(res.placement) & set(DIMENSIONS)
    assert all(v.shape[:2] == (ROUNDS, CLIENTS) for v in res.metrics.values())
    assert res.to_frame()["metric"].nunique() == sum(
        2 if v.ndim == 3 else 1 for v in res.metrics.values()
    )  # the quickstart's two classes
    verdict = verify(run_file)
    assert verdict.ok, verdict.text()


RESUME = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    import numpy as np
    from mpicd.mpi.comm import KINDS, Comm, Traffic
    from mpicd.mpi.placement import abort_on_exception
    from mpicd.results.columns import RoundRow
    from mpicd.results.writer import Contents, ResultsWriter
    from mpicd.run.client import EpochLoss, Scores

    comm = Comm()
    rank, size = comm.rank, comm.size

    def writer(path, parallel, resume_at=None):
        contents = Contents(
            rounds=3, num_classes=2,
            attrs={"config": f"clients: {size}\\n", "algorithm": "test", "class_names": ["a", "bb"]},
            train_counts=np.ones((size, 2)), test_counts=np.ones((size, 2)), expertise=np.arange(size) % 2,
        )
        placement = {"host": "h", "local_rank": rank, "device": "cpu", "threads": 1}
        return ResultsWriter(path, comm, contents, placement, parallel=parallel, resume_at=resume_at)

    def row(r):
        traffic = Traffic(dict(zip(KINDS, (r, 0, 0, 0))), dict(zip(KINDS, (0, 8, 0, 0))), 0.5)
        s = Scores(recall=np.array([r, rank], float), acc=0.5, balanced_acc=0.25, minority_acc=0.1, personal_acc=0.2)
        return RoundRow(loss=EpochLoss(total=1.0, ce=1.0, extra=0.0), test=s, val=s, traffic=traffic,
                        compute_seconds=1.0, teacher=-1)

    with abort_on_exception(comm.mpi):
        for parallel in (True, False):
            path = Path(sys.argv[1]) / f"{'mpio' if parallel else 'serial'}.h5"
            w = writer(path, parallel)
            for r in range(3):
                w.write_round(r, {rank: row(r)})
            w.close()
            w = writer(path, parallel, resume_at=1)  # rows 1 and 2 back to fill values
            w.write_round(1, {rank: row(1)})
            w.close()
    """
)


def test_resume_keeps_the_scales_and_clears_only_data(tmp_path):
    (tmp_path / "resume.py").write_text(RESUME)
    result = mpiexec(2, str(tmp_path / "resume.py"), str(tmp_path), timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert dims_of(tmp_path / "mpio.h5") == dims_of(tmp_path / "serial.h5")
    for writer in ("mpio", "serial"):
        path = tmp_path / f"{writer}.h5"
        found, scales = dims_of(path)
        assert set(found) == {d.path for d in layout(2)}
        assert scales["metrics/round"] == [1, 2, 3] and scales["partition/class"] == [b"a", b"bb"]
        res = Results(path)
        assert res.completed_rounds == 2 and list(res.attrs["resumed_at"]) == [1]
        with h5py.File(path, "r") as f:
            assert np.isnan(f["metrics/train_loss"][2]).all() and (f["comm/teacher"][2] == -1).all()
        with open_group(path, "metrics") as ds:
            assert ds["class"].values.tolist() == ["a", "bb"]
            np.testing.assert_array_equal(ds["recall"].values[1], [[1, 0], [1, 1]])
        past = [p for p in verify(path).problems if "past completed_rounds" in p]
        assert not past, past


def test_units_and_descriptions_are_declared_for_every_dataset():
    for d in layout(5):
        assert d.description.endswith(".") and d.description[0].isupper(), d.path
        assert isinstance(d.units, str), d.path
        assert set(d.all_dims) <= set(DIMENSIONS), d.path
    assert len({d.path for d in layout(5)}) == len(layout(5))
