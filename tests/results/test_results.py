"""The results file: collective (mpio) and serial writers give the same layout and values."""

import h5py
import numpy as np
import pytest

from mpicd.results.reader import Results

from conftest import DRIVERS, mpiexec


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    folder = tmp_path_factory.mktemp("writers")
    result = mpiexec(3, str(DRIVERS / "results_writer.py"), str(folder), timeout=120)
    assert result.returncode == 0, result.stderr
    return folder


def test_h5py_has_mpi_support():
    assert h5py.get_config().mpi, "h5py was built without MPI: jobs/setup.sh should build it parallel"


@pytest.mark.parametrize("writer", ["mpio", "serial"])
def test_every_rank_row_lands_in_its_cell(written, writer):
    res = Results(written / f"{writer}.h5")
    assert res.attrs["writer"] == writer and res.completed_rounds == 2
    np.testing.assert_array_equal(res.metrics["train_loss"], [[0, 1, 2], [0.1, 1.1, 2.1]])
    np.testing.assert_array_equal(res.metrics["bytes_sent"], [[0, 100, 200], [1, 101, 201]])
    np.testing.assert_array_equal(res.metrics["bytes_recv"], np.full((2, 3), 8))
    np.testing.assert_array_equal(res.metrics["recall"][1], [[1, 0], [1, 1], [1, 2]])
    np.testing.assert_array_equal(res.metrics["train_ce"], [[0, 1, 2], [0.25, 1.25, 2.25]])
    np.testing.assert_array_equal(res.metrics["train_extra"], np.full((2, 3), 0.25))
    np.testing.assert_array_equal(res.metrics["val_minority_acc"], [[0, 0.01, 0.02], [0, 0.01, 0.02]])
    np.testing.assert_array_equal(res.metrics["personal_acc"], [[0, 0, 0], [1, 1, 1]])
    np.testing.assert_array_equal(res.metrics["val_personal_acc"], [[0, 0.001, 0.002], [0, 0.001, 0.002]])
    np.testing.assert_array_equal(res.metrics["val_recall"][1], [[0, 1], [1, 1], [2, 1]])
    assert res.placement["host"] == ["node0", "node0", "node1"]
    assert res.placement["device"] == ["cpu"] * 3
    np.testing.assert_array_equal(res.placement["local_rank"], [0, 1, 0])
    np.testing.assert_array_equal(res.placement["threads"], [1, 2, 3])
    np.testing.assert_array_equal(res.teacher, [[1, 2, 0], [1, 2, 0]])
    assert res.kinds[:2] == ("p2p", "allreduce")
    np.testing.assert_array_equal(res.bytes_recv_by_kind[:, :, 1], np.full((2, 3), 8))
    np.testing.assert_array_equal(res.partition["train_counts"], np.arange(6).reshape(3, 2))
    np.testing.assert_array_equal(res.partition["expertise"], [0, 1, 0])
    assert (res.outside_rounds >= 0).all()
    with h5py.File(written / f"{writer}.h5") as f:  # the round not completed stays unwritten
        assert np.isnan(f["metrics/train_loss"][2]).all()


def test_serial_fallback_has_the_same_layout(written):
    def layout(path):
        with h5py.File(path) as f:
            items = {}
            f.visititems(
                lambda name, obj: items.__setitem__(
                    name, (obj.shape, obj.dtype.str) if isinstance(obj, h5py.Dataset) else "group"
                )
            )
            return items, set(f.attrs)

    assert layout(written / "mpio.h5") == layout(written / "serial.h5")
    mpio, serial = Results(written / "mpio.h5"), Results(written / "serial.h5")
    for name in mpio.metrics:
        if name == "write_seconds":  # measured by each writer itself: finite, positive, not equal
            assert (mpio.metrics[name] > 0).all() and (serial.metrics[name] > 0).all()
            continue
        np.testing.assert_array_equal(mpio.metrics[name], serial.metrics[name])
