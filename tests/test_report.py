"""mpicd report: cells grouped by everything but the seed, mean ± sd over seeds, skew tables."""

import numpy as np
import pytest

from mpicd.comm import KINDS, Comm, Traffic
from mpicd.report import Cell, group, plot, render, skew_table, summarize
from mpicd.results import ResultsWriter, RoundRow

from conftest import QUICKSTART, mpicd_cli, mpicd_run


def write_run(path, algorithm, skew, seed, minority, rounds=2):
    """A one-client results file whose final-round minority accuracy is ``minority``."""
    writer = ResultsWriter(path, Comm(), rounds=rounds, num_classes=2, parallel=False, attrs={
        "config": "{}", "algorithm": algorithm, "dataset": "toy", "skew": skew, "clients": 1,
        "images_per_class": 50, "seed": seed}, train_counts=np.ones((1, 2)), test_counts=np.ones((1, 2)),
        expertise=np.zeros(1))
    for r in range(rounds):
        traffic = Traffic(dict.fromkeys(KINDS, 0), dict.fromkeys(KINDS, 0), 0.0)
        traffic.bytes_sent["p2p"] = traffic.bytes_recv["p2p"] = 800
        writer.write_round(r, RoundRow(train_loss=1.0, test_acc=0.5, balanced_acc=0.5, minority_acc=minority - (r < rounds - 1),
                                       recall=np.array([1.0, minority]), traffic=traffic, compute_seconds=0.0, teacher=-1))
    writer.close()
    return path


pytestmark = pytest.mark.filterwarnings("ignore:serial writer requested")


@pytest.fixture
def runs(tmp_path):
    values = {("codistill", 0.6): [0.8, 0.7, 0.9], ("local", 0.6): [0.5, 0.6, 0.4], ("codistill", 0.2): [0.9, 0.9, 0.9]}
    return [write_run(tmp_path / f"{a}-{s}-{seed}.h5", a, s, seed, v)
            for (a, s), vs in values.items() for seed, v in enumerate(vs)]


def test_cells_hold_mean_and_sd_over_seeds(runs):
    cells = group(summarize(p) for p in runs)
    assert len(cells) == 3
    cell = cells[Cell("codistill", "toy", 0.6, 1, 50)]
    scores = [r.scores["minority_acc"] for r in cell]
    assert sorted(scores) == pytest.approx([0.7, 0.8, 0.9])
    table = skew_table(cells)
    assert "0.800 ± 0.100" in table and "0.500 ± 0.100" in table and "0.900 ± 0.000" in table
    assert "| local | – | 0.500 ± 0.100 | – |" in table
    assert "800" in render(cells, last=1)


def test_plot_is_a_png(runs, tmp_path):
    plot(group(summarize(p) for p in runs), tmp_path / "skew.png")
    assert (tmp_path / "skew.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_last_n_rounds_are_averaged(runs):
    assert summarize(runs[0], last=2).scores["minority_acc"] == pytest.approx(0.8 - 0.5)


def test_duplicate_seed_in_a_cell_is_an_error(tmp_path):
    a = write_run(tmp_path / "a.h5", "local", 0.6, 0, 0.5)
    b = write_run(tmp_path / "b.h5", "local", 0.6, 0, 0.6)
    with pytest.raises(ValueError, match="same seed"):
        group(summarize(p) for p in (a, b))


def test_report_command_on_real_runs(tmp_path):
    for seed in (0, 1):
        mpicd_run(2, QUICKSTART, tmp_path / f"s{seed}.h5", "clients=2", "rounds=2", f"seed={seed}")
    result = mpicd_cli("report", str(tmp_path / "s0.h5"), str(tmp_path / "s1.h5"))
    assert result.returncode == 0, result.stderr
    assert "| codistill |" in result.stdout and "±" in result.stdout and "breast_cancer" in result.stdout
    missing = mpicd_cli("report", str(tmp_path / "nope.h5"))
    assert missing.returncode == 2 and "nope.h5" in missing.stderr
