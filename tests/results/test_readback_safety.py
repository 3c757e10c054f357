"""Files mpicd reads back cannot run code: a pickle planted as a checkpoint is refused by --resume
with one line naming it, and nothing in it executes; checkpoints round-trip numpy state as plain
tensors; temporary files are created exclusively, never through a link."""

from __future__ import annotations

import io
import os
import pickle
import stat

import numpy as np
import pytest
import torch

from mpicd.core import exclusive
from mpicd.core.paths import PathRefused
from mpicd.run import checkpoint

from conftest import QUICKSTART, mpiexec

RUN = ["clients=2", "rounds=6"]


class Planted:
    """Unpickled unsafely, it runs ``touch MARKER``."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_planted_pickle_in_the_checkpoint_folder_is_refused_and_never_runs(tmp_path):
    out = tmp_path / "run.h5"
    crashed = mpiexec(
        2, "-m", "mpicd", "run", str(QUICKSTART), *RUN, "debug.fail_rank=1", "debug.fail_round=3",
        "debug.fail_kind=exception", "--out", str(out), timeout=240,
    )  # fmt: skip
    assert crashed.returncode != 0, crashed.stdout
    folder = checkpoint.folder_for(out)
    planted = sorted(folder.glob("rank1.round*.pt"))
    assert planted, f"no checkpoint of client 1 to replace: {list(folder.iterdir())}"
    marker = tmp_path / "marker"
    for path in planted:  # whichever round the resume picks, client 1's file is the planted one
        torch.save({"run_id": path.name.split(".")[2], "model": Planted(marker)}, path)
    control = tmp_path / "control"  # the plant is live: the unsafe loader runs it
    torch.save(Planted(control), tmp_path / "control.pt")
    torch.load(tmp_path / "control.pt", weights_only=False)
    assert control.exists()

    resumed = mpiexec(2, "-m", "mpicd", "run", str(QUICKSTART), *RUN, "--out", str(out), "--resume", timeout=240)
    assert not marker.exists(), "the planted pickle ran"
    assert resumed.returncode == 2, (resumed.stdout, resumed.stderr)
    lines = [line for line in resumed.stderr.splitlines() if line.startswith("mpicd:")]
    assert len(lines) == 1 and "not a checkpoint mpicd wrote" in lines[0], resumed.stderr
    assert any(str(path) in lines[0] for path in planted), lines
    assert all(path.exists() for path in planted), "a user's file is never removed without their word"

    # the forger who can write the folder but not read the site key: a well-formed checkpoint, weights
    # zeroed, MACed under a key of their own, is refused by name before any of it is used
    forger = bytes(range(32))
    for path in planted:
        rank, completed, run_id, _ = path.name.replace("rank", "").replace("round", "").split(".")
        body = io.BytesIO()
        state = {"run_id": run_id, "model": {"weight": torch.zeros(3)}}
        torch.save(state, body)
        mac = checkpoint._mac(forger, int(rank), int(completed), run_id, body.getvalue())
        path.write_bytes(checkpoint.MAGIC + mac + len(body.getvalue()).to_bytes(8, "big") + body.getvalue())
    before = out.read_bytes()
    forged = mpiexec(2, "-m", "mpicd", "run", str(QUICKSTART), *RUN, "--out", str(out), "--resume", timeout=240)
    assert forged.returncode == 2, (forged.stdout, forged.stderr)
    lines = [line for line in forged.stderr.splitlines() if line.startswith("mpicd:")]
    assert len(lines) == 1 and "MAC does not verify under the site key" in lines[0], forged.stderr
    assert any(str(path) in lines[0] for path in planted) and "Traceback" not in forged.stderr
    assert out.read_bytes() == before, "a refused resume writes nothing"


def test_checkpoints_hold_plain_tensors_and_give_numpy_state_back_exactly(tmp_path):
    folder, run = tmp_path / "x.h5.ckpt", "0123456789abcdef"
    state = {
        "frozen": np.arange(5, dtype=np.float64) / 3,
        "counts": np.array([[1, 2], [3, 4]], dtype=np.int64),
        "scalar": np.float32(0.1),
        "nested": [(np.int64(7), "text", None, 2.5)],
        "tensor": torch.tensor([1.0, 2.0]),
    }
    path = checkpoint.save(folder, 0, 1, state, run)
    assert path.read_bytes()[:8] == checkpoint.MAGIC and stat.S_IMODE(folder.stat().st_mode) == 0o700
    folder.chmod(0o777)  # a folder others can write in: no checkpoint is written (nor read back) there
    with pytest.raises(PathRefused, match=r"x.h5.ckpt: the checkpoint folder is mode drwxrwxrwx"):
        checkpoint.save(folder, 0, 2, state, run)
    folder.chmod(0o700)
    torch.load(io.BytesIO(path.read_bytes()[48:]), weights_only=True)  # nothing but tensors and plain types inside
    back = checkpoint.load(folder, 0, 1, run, "cpu")
    np.testing.assert_array_equal(back["frozen"], np.arange(5, dtype=np.float64) / 3)
    assert back["frozen"].dtype == np.float64 and back["counts"].dtype == np.int64
    assert type(back["scalar"]) is np.float32 and back["scalar"] == np.float32(0.1)
    assert back["nested"] == [(7, "text", None, 2.5)] and type(back["nested"][0][0]) is np.int64
    assert torch.equal(back["tensor"], torch.tensor([1.0, 2.0])) and back["run_id"] == run


def test_a_checkpoint_refuses_at_saving_what_the_loader_would_refuse(tmp_path):
    folder, run = tmp_path / "x.h5.ckpt", "0123456789abcdef"
    for state in ({"stream": np.random.default_rng(0)}, {"object": Planted("x")}, {(1, 2): 3}):
        with pytest.raises(TypeError):
            checkpoint.save(folder, 0, 1, state, run)
    assert checkpoint.available(folder, 0, run) == [] and list(folder.iterdir()) == []
    model = torch.nn.Linear(2, 2).state_dict()  # an OrderedDict with the module versions torch reads
    checkpoint.save(folder, 0, 1, {"model": model}, run)
    back = checkpoint.load(folder, 0, 1, run, "cpu")
    assert type(back["model"]) is type(model) and back["model"]._metadata == model._metadata


@pytest.mark.parametrize(
    "content",
    [b"", b"torn", b"\0" * 4096, np.random.default_rng(0).bytes(4096), "half"],
    ids=["empty", "text", "zeros", "random", "half of a real one"],
)
def test_a_torn_or_garbled_checkpoint_is_ignored_not_refused(tmp_path, content):
    folder, run = tmp_path / "x.h5.ckpt", "0123456789abcdef"
    path = checkpoint.save(folder, 0, 1, {"tensor": torch.arange(1000)}, run)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2] if content == "half" else content)
    assert checkpoint.load(folder, 0, 1, run, "cpu") is None


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")  # torch's note on protocols past 2
@pytest.mark.parametrize("protocol", [0, 2, pickle.HIGHEST_PROTOCOL])
def test_a_raw_pickle_planted_as_a_checkpoint_is_refused_and_never_runs(tmp_path, protocol):
    folder, run, marker = tmp_path / "x.h5.ckpt", "0123456789abcdef", tmp_path / "marker"
    folder.mkdir()
    path = checkpoint.path_for(folder, 0, 1, run)
    path.write_bytes(pickle.dumps({"run_id": run, "model": Planted(marker)}, protocol=protocol))
    with pytest.raises(checkpoint.Refused, match="not a checkpoint mpicd wrote"):
        checkpoint.load(folder, 0, 1, run, "cpu")
    assert not marker.exists()


def test_a_checkpoint_moved_to_another_client_or_round_is_refused(tmp_path):
    folder, run = tmp_path / "x.h5.ckpt", "0123456789abcdef"
    for other_run, client, completed in ((run, 1, 1), (run, 0, 2)):  # another run's name: tests/run/test_startpoint
        checkpoint.save(folder, 0, 1, {"round": 1}, run)
        os.replace(checkpoint.path_for(folder, 0, 1, run), checkpoint.path_for(folder, client, completed, other_run))
        with pytest.raises(checkpoint.Refused, match="MAC does not verify"):
            checkpoint.load(folder, client, completed, other_run, "cpu")


def test_temporary_files_are_new_unpredictable_and_never_reached_through_a_link(tmp_path):
    target = tmp_path / "victim"
    target.write_bytes(b"untouched")
    one, two = exclusive.name(tmp_path, ".f.", ".tmp"), exclusive.name(tmp_path, ".f.", ".tmp")
    assert one != two and len(one.name) == len(".f.") + 16 + len(".tmp")
    one.symlink_to(target)
    with pytest.raises(FileExistsError):
        exclusive.open_new(one)
    two.write_bytes(b"there")
    with pytest.raises(FileExistsError):
        exclusive.open_new(two)
    assert target.read_bytes() == b"untouched" and two.read_bytes() == b"there"
    path, fh = exclusive.create(tmp_path, ".g.", ".probe")
    with fh:
        fh.write(b"ok")
    assert path.read_bytes() == b"ok"


def test_a_killed_writes_temporary_file_is_cleared_with_the_new_names(tmp_path):
    folder, run = tmp_path / "x.h5.ckpt", "0123456789abcdef"
    checkpoint.save(folder, 0, 1, {"round": 1}, run)
    left = exclusive.name(folder, f".rank0.round2.{run}.pt.123.", ".tmp")
    left.write_bytes(b"partial")
    checkpoint.discard(folder, 0, run)
    assert not left.exists() and checkpoint.available(folder, 0, run) == []


def test_the_output_probe_leaves_nothing_and_never_follows_a_link(tmp_path):
    from mpicd.results.writer import check_output_location

    target = tmp_path / "victim"
    target.write_bytes(b"untouched")
    planted = tmp_path / f".run.h5.{os.getpid()}.probe"  # the name it used to write, through the link
    planted.symlink_to(target)
    check_output_location(tmp_path / "run.h5", 0)
    assert sorted(tmp_path.iterdir()) == sorted([planted, target])
    assert target.read_bytes() == b"untouched"
