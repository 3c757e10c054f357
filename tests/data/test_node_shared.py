"""The dataset read once per node: one rank loads, the node's ranks share it read-only
through an MPI shared-memory window, bit for bit what a private load gives, errors and exit included."""

import numpy as np
import pytest

from mpicd.results.reader import Results

from conftest import DRIVERS, PNEUMONIA, QUICKSTART, ROOT, is_timing, mpiexec


def workload() -> tuple[str, list[str]]:
    """Real X-rays, every image, when present; else the built-in tabular data."""
    if PNEUMONIA.is_file():
        return str(ROOT / "configs" / "pneumoniamnist.yaml"), [f"data.path={PNEUMONIA}", "data.images_per_class=null"]
    return str(QUICKSTART), []


@pytest.mark.parametrize("ranks", [1, 3])
def test_shared_arrays_equal_a_private_load_and_are_read_only(ranks):
    """Every array equal byte for byte, every other field equal, read-only, in one shared mapping
    of the same file on every rank; the metadata bcast counted; released and freed at exit; a
    missing data.path raises the private load's ConfigError on every rank (tests/drivers/nodeshare.py)."""
    config, overrides = workload()
    result = mpiexec(ranks, str(DRIVERS / "nodeshare.py"), "check", config, *overrides, timeout=180)
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    assert sorted(line for line in result.stdout.split() if line.isdigit()) == [str(r) for r in range(ranks)]
    assert "not writable" not in result.stderr  # torch's warning about read-only arrays is silenced


@pytest.mark.parametrize("ranks", [1, 3])
def test_missing_data_exits_2_with_one_message(ranks, tmp_path):
    result = mpiexec(
        ranks,
        "-m",
        "mpicd",
        "run",
        str(ROOT / "configs" / "pneumoniamnist.yaml"),
        f"clients={ranks}",
        f"data.path={tmp_path / 'absent.npz'}",
        "--out",
        str(tmp_path / "r.h5"),
        timeout=120,
    )
    assert result.returncode == 2, f"{result.stdout}\n{result.stderr}"
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.startswith("mpicd:")]
    assert lines == [
        (
            f"mpicd: config error: data.path: file '{tmp_path / 'absent.npz'}' does not exist "
            "(expected a MedMNIST .npz file)"
        )
    ], lines
    assert not (tmp_path / "r.h5").exists()


def test_mpicd_run_with_sharing_equals_a_private_run(tmp_path):
    """``mpicd run`` (shared data) and the round loop on a private load, 3 ranks, same job: the same
    metrics and bytes per round, kind by kind; the shared run also counts the metadata outside rounds."""
    config, overrides = workload()
    overrides = [*overrides, "rounds=2", *(["data.images_per_class=40"] if PNEUMONIA.is_file() else [])]
    result = mpiexec(3, str(DRIVERS / "nodeshare.py"), "run", config, str(tmp_path), *overrides, timeout=240)
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    private, shared = Results(tmp_path / "private.h5"), Results(tmp_path / "shared.h5")
    assert private.completed_rounds == shared.completed_rounds == 2
    assert set(private.metrics) == set(shared.metrics)
    for name in private.metrics:
        if not is_timing(name):
            np.testing.assert_array_equal(private.metrics[name], shared.metrics[name], err_msg=name)
    np.testing.assert_array_equal(private.bytes_sent_by_kind, shared.bytes_sent_by_kind)
    np.testing.assert_array_equal(private.bytes_recv_by_kind, shared.bytes_recv_by_kind)
    assert private.bytes_sent_by_kind.sum() > 0
    assert shared.outside_rounds[0, 0] > private.outside_rounds[0, 0]  # rank 0 sent the metadata
    assert (shared.outside_rounds[1:, 1] > private.outside_rounds[1:, 1]).all()  # the others received it


def test_too_little_shared_memory_is_a_config_error(tmp_path):
    """The window's backing folder (/dev/shm) must hold the dataset, or a message instead of SIGBUS."""
    import shutil

    from mpicd.config.sections import ConfigError
    from mpicd.data.node_shared import check_room

    free = shutil.disk_usage(tmp_path).free
    check_room(free // 2, str(tmp_path))
    check_room(10 * free, str(tmp_path / "absent"))  # no such folder: Open MPI puts it elsewhere
    with pytest.raises(ConfigError, match=r"data\.path: the dataset needs .* MiB of shared memory .*--shm-size"):
        check_room(free + 2**30, str(tmp_path))


def test_an_image_folder_is_shared_with_its_preprocessing_and_warnings(tmp_path):
    """The image-folder format read once per node: RGB arrays, the ``preprocessing`` text and the
    ``warnings`` tuple (a test image that is also a training image) equal on every rank to a private load."""
    from PIL import Image

    from fixtures_data import write_imagefolder

    write_imagefolder(tmp_path / "scans", {"train": {"a": 12, "b": 12}, "test": {"a": 3, "b": 3}})
    Image.new("RGB", (12, 10), (200, 10, 10)).save(tmp_path / "scans" / "train" / "b" / "red.png")
    (tmp_path / "scans" / "test" / "a" / "dup.png").write_bytes((tmp_path / "scans/train/a/000.png").read_bytes())
    config = tmp_path / "scans.yaml"
    config.write_text(f"clients: 3\nrounds: 1\ndata:\n  name: imagefolder\n  path: {tmp_path / 'scans'}\n")
    result = mpiexec(3, str(DRIVERS / "nodeshare.py"), "check", str(config), timeout=180)
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    assert sorted(line for line in result.stdout.split() if line.isdigit()) == ["0", "1", "2"]
