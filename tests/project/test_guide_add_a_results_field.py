"""The guide docs/how-to/add-a-results-field.md carried out as written, in a copy of the package: its
edits (each shown in the guide, each old snippet still in the code), its example test, a real
two-rank run whose /metrics/train_samples must be what the run's own partition says, `mpicd
verify` on that file, and an older file (without the dataset) read, and refused by --resume."""

import shutil
import subprocess
import sys

import h5py
import numpy as np

from mpicd.mpi import launch

from conftest import mpi_env
from guide_example import apply_edits, copy_of_the_package, write_example_files

GUIDE = "docs/how-to/add-a-results-field.md"
EDITS = [  # what the guide tells the reader to change in existing files: (file, old, new)
    (
        "mpicd/run/client.py",
        "    total: float\n    ce: float\n    extra: float\n",
        "    total: float\n    ce: float\n    extra: float\n"
        "    samples: int = 0  # training images the local epochs went through (0: it did not train)\n",
    ),
    (
        "mpicd/run/client.py",
        "        seen = max(seen, 1)\n"
        "        return EpochLoss((total_ce + total_extra) / seen, total_ce / seen, total_extra / seen)\n",
        "        samples, seen = seen, max(seen, 1)\n"
        "        return EpochLoss((total_ce + total_extra) / seen, total_ce / seen, total_extra / seen, samples)\n",
    ),
    (
        "mpicd/run/client.py",
        "        return EpochLoss(ce + extra, ce, extra)\n",
        "        return EpochLoss(ce + extra, ce, extra, seen)\n",
    ),
    (
        "mpicd/results/columns.py",
        "               \"The epoch's sample-weighted mean of the algorithm's extra loss term.\"),\n",
        "               \"The epoch's sample-weighted mean of the algorithm's extra loss term.\"),\n"
        '        Column("metrics/train_samples", "i8", (), lambda row: row.loss.samples, "images",\n'
        '               "Training images the client\'s local epochs went through in the round (train.local_epochs "\n'
        "               \"times its training images; DP-SGD: its Poisson-sampled batches'); "
        '0 if it sat the round out or "\n'
        '               "its epochs stopped at a non-finite loss."),\n',
    ),
]
LOCAL_EPOCHS = 2


def run(command, cwd, timeout=120):
    result = subprocess.run(command, cwd=cwd, env=mpi_env(), capture_output=True, text=True, timeout=timeout)
    return result, f"{command}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"


def test_the_guides_results_field_is_written_verified_and_older_files_are_refused(tmp_path):
    copy = copy_of_the_package(tmp_path)
    files = write_example_files(GUIDE, copy)
    assert files == ["tests/run/test_train_samples.py"], GUIDE
    apply_edits(GUIDE, copy, EDITS)

    tested, why = run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", files[0]], copy)
    assert tested.returncode == 0 and "2 passed" in tested.stdout, why  # the example's own test

    out = tmp_path / "r.h5"
    args = ["configs/quickstart.yaml", "clients=2", "rounds=2", f"train.local_epochs={LOCAL_EPOCHS}"]
    mpicd = [sys.executable, "-m", "mpicd", "run", *args, "--out"]
    done, why = run(launch.command(2, [*mpicd, str(out)], launcher="mpirun"), copy)
    assert done.returncode == 0, why
    with h5py.File(out, "r") as f:
        assert "metrics/train_samples" in f, "the run did not use the copy's package"
        samples = f["metrics/train_samples"]
        counts = f["partition/train_counts"][()]
        assert f.attrs["completed_rounds"] == 2 and samples.dtype == np.int64
        assert samples.attrs["units"] == "images" and "local epochs" in samples.attrs["description"]
        assert [d.label for d in samples.dims] == ["round", "client"]
        np.testing.assert_array_equal(samples[()], np.tile(LOCAL_EPOCHS * counts.sum(axis=1), (2, 1)))
    assert counts.sum(axis=1).min() > 0  # every client trained on something: the values are not all 0

    # an older file: the same run without the dataset, stopped after round 1
    older = tmp_path / "older.h5"
    shutil.copy(out, older)
    with h5py.File(older, "r+") as f:
        del f["metrics/train_samples"]
        f.attrs.modify("completed_rounds", 1)
    checks = (
        "import sys\n"
        "from mpicd.cli import main\n"
        "from mpicd.results import Results\n"
        "from mpicd.results.columns import layout_table\n"
        "assert '| `/metrics/train_samples` | round × client | int64 | images |' in layout_table()\n"
        "old = Results(sys.argv[2])\n"
        "assert 'train_samples' not in old.metrics and old.metrics['train_loss'].shape == (1, 2)\n"
        "sys.exit(main(['verify', sys.argv[1]]))\n"
    )
    verified, why = run([sys.executable, "-c", checks, str(out), str(older)], copy)
    assert verified.returncode == 0 and f"{out}: ok" in verified.stdout, why
    refused, why = run(launch.command(2, [*mpicd, str(older), "--resume"], launcher="mpirun"), copy)
    assert refused.returncode != 0, why
    assert "lacks /metrics/train_samples" in refused.stdout + refused.stderr, why
