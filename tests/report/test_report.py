"""mpicd report: cells are whole configs minus operational keys, incomplete runs are excluded,
scores come from the last rounds or the best validation round, paired comparisons get t-intervals.

Synthetic results files are written with h5py in the documented layout, with hand-chosen
numbers; every expected mean, sd, difference and interval below is worked out by hand.
"""

import copy
import csv
import math

import h5py
import numpy as np
import pytest
import yaml

from mpicd.mpi.accounting import KINDS
from mpicd.report import (
    OPERATIONAL,
    ReportError,
    collect,
    group,
    render,
    skew_table,
    summarize,
    t_quantile,
    versus,
    write_csv,
)

from conftest import QUICKSTART, mpicd_cli, mpicd_run

BASE = {
    "clients": 2,
    "rounds": 3,
    "seed": 0,
    "device": "auto",
    "output": "results/run.h5",
    "data": {"name": "toy", "path": None, "images_per_class": 50, "skew": 0.6},
    "model": {"name": "mlp", "feature_dim": 8, "hidden": 4},
    "train": {"optimizer": "adam", "lr": 0.001, "batch_size": 32, "eval_batch_size": 512},
    "algorithm": {"name": "codistill", "lambda": 1.0, "k": "all"},
}


def config(**dotted):
    """BASE with dotted overrides, e.g. config(**{"algorithm.lambda": 0.5})."""
    tree = copy.deepcopy(BASE)
    for key, value in dotted.items():
        *parents, leaf = key.split(".")
        node = tree
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return tree


def write(
    path,
    cfg,
    minority,
    *,
    completed=None,
    val=None,
    sent=800,
    recv=400,
    balanced=None,
    recall=None,
    class_names=None,
    personal=None,
):
    """A results file in mpicd's layout. ``minority``: per round, a score (both clients equal) or a
    per-client list; balanced_acc = minority + 0.1 (or ``balanced``, given like ``minority``) and
    test_acc = minority + 0.2 everywhere. ``recall``: (rounds, clients, classes) values of
    /metrics/recall; ``class_names``: the attr, if given. ``personal``: /metrics/personal_acc, given
    like ``minority``; without it the file is one written before personal_acc existed."""
    m = np.array([[v, v] if np.isscalar(v) else v for v in minority], dtype=float)
    b = m + 0.1 if balanced is None else np.array([[v, v] if np.isscalar(v) else v for v in balanced], dtype=float)
    rounds, clients = cfg["rounds"], m.shape[1]
    done = len(m) if completed is None else completed
    with h5py.File(path, "w") as f:
        f.attrs.update(
            {
                "config": yaml.safe_dump(cfg, sort_keys=False),
                "algorithm": cfg["algorithm"]["name"],
                "dataset": cfg["data"]["name"],
                "clients": clients,
                "rounds": rounds,
                "seed": cfg["seed"],
                "skew": cfg["data"]["skew"],
                "images_per_class": cfg["data"]["images_per_class"],
                "completed_rounds": done,
            }
        )

        def metric(name, values):
            d = f.create_dataset(
                f"metrics/{name}",
                (rounds, clients),
                dtype=values.dtype,
                fillvalue=np.nan if values.dtype.kind == "f" else -1,
            )
            d[: len(values)] = values

        metric("minority_acc", m)
        metric("balanced_acc", b)
        metric("test_acc", m + 0.2)
        metric("bytes_sent", np.full(m.shape, sent, dtype=np.int64))
        metric("bytes_recv", np.full(m.shape, recv, dtype=np.int64))
        if val is not None:
            metric("val_minority_acc", np.array([[v, v] if np.isscalar(v) else v for v in val], dtype=float))
        if personal is not None:
            metric("personal_acc", np.array([[v, v] if np.isscalar(v) else v for v in personal], dtype=float))
        for name, each in (("bytes_sent", sent), ("bytes_recv", recv)):
            d = f.create_dataset(f"comm/{name}", (rounds, clients, len(KINDS)), dtype="i8", fillvalue=0)
            d[:, :, 0] = each
            d.attrs["kinds"] = np.array(KINDS, dtype=h5py.string_dtype())
        f.create_dataset("comm/teacher", (rounds, clients), dtype="i8", fillvalue=-1)
        f.create_dataset("comm/outside_rounds", data=np.zeros((clients, 2), dtype=np.int64))
        f.create_dataset("partition/expertise", data=np.arange(clients) % 2)
        if recall is not None:
            values = np.array(recall, dtype=float)
            d = f.create_dataset("metrics/recall", (rounds, *values.shape[1:]), dtype="f8", fillvalue=np.nan)
            d[: len(values)] = values
        if class_names is not None:
            f.attrs["class_names"] = class_names
    return path


def final(score):
    """Three rounds ending at ``score`` (the earlier rounds are far off, so a wrong window shows)."""
    return [0.0, 0.1, score]


def run_cli(*args):
    result = mpicd_cli("report", *map(str, args))
    return result


# ----------------------------------------------------------------------------- cells


def test_operational_keys_are_one_documented_constant():
    assert set(OPERATIONAL) == {
        "seed",
        "output",
        "device",
        "train.eval_batch_size",
        "checkpoint",
        "debug",
        "timeout",
        "eval",
        "clients_per_rank",  # how the clients are laid out on ranks: the same results (mpicd.mpi.assignment)
        "privacy.key_dir",  # where a site keeps its secret keys (the keys themselves are no config)
    }


def test_runs_differing_only_in_operational_keys_share_a_cell(tmp_path):
    a = write(tmp_path / "a.h5", config(seed=0), final(0.7))
    b = write(
        tmp_path / "b.h5",
        config(
            seed=1,
            output="elsewhere.h5",
            device="cpu",
            **{
                "train.eval_batch_size": 64,
                "checkpoint.every": 5,
                "eval.every": 2,
                "debug.trace": True,
                "timeout.seconds": 9,
            },
        ),
        final(0.9),
    )
    cells = group(summarize(p) for p in (a, b))
    (runs,) = cells.values()
    assert [r.scores["minority_acc"] for r in runs] == pytest.approx([0.7, 0.9])


def test_runs_differing_in_hyper_parameters_are_separate_cells_with_their_keys_shown(tmp_path):
    paths = [write(tmp_path / f"l1-{s}.h5", config(seed=s), final(v)) for s, v in enumerate([0.8, 0.7, 0.9])]
    paths += [
        write(tmp_path / f"l05-{s}.h5", config(seed=s, **{"algorithm.lambda": 0.5}), final(v))
        for s, v in enumerate([0.5, 0.7])
    ]
    paths += [
        write(tmp_path / "lenet.h5", config(**{"model.name": "lenet"}), final(0.3)),
        write(tmp_path / "lr.h5", config(**{"train.lr": 0.01}), final(0.4)),
    ]
    cells = group(summarize(p) for p in paths)
    assert len(cells) == 4
    text = render(cells)
    # header: method + every key that differs; λ=0.5 cell: mean 0.6, sd sqrt(2 * 0.1² / 1) = 0.141
    assert "| method | algorithm.lambda | model.name | train.lr | seeds | minority_acc |" in text
    # the files have no /metrics/personal_acc (written before it): no column for it, as before it existed
    assert "| codistill | 0.5 | mlp | 0.001 | 2 | 0.600 ± 0.141 | 0.700 ± 0.141 | 0.800 ± 0.141 | 600 |" in text
    assert "personal_acc" not in text
    assert "| codistill | 1 | mlp | 0.001 | 3 | 0.800 ± 0.100 |" in text
    assert "| codistill | 1 | lenet | 0.001 | 1 | 0.300 |" in text
    assert "| codistill | 1 | mlp | 0.01 | 1 | 0.400 |" in text
    assert "| codistill (lambda=0.5) | 0.600 ± 0.141 |" in text  # the skew view labels the rows too
    assert "model.name=lenet" in text and "train.lr=0.01" in text  # ... and titles its blocks


def test_method_specific_keys_are_not_columns_unless_they_vary_within_a_method(tmp_path):
    fedavg = config(algorithm={"name": "fedavg"})
    paths = [write(tmp_path / "c.h5", config(), final(0.8)), write(tmp_path / "f.h5", fedavg, final(0.6))]
    text = render(group(summarize(p) for p in paths))
    assert "| method | seeds | minority_acc |" in text and "| fedavg | 1 | 0.600 |" in text
    paths.append(write(tmp_path / "c05.h5", config(**{"algorithm.lambda": 0.5}), final(0.7)))
    text = render(group(summarize(p) for p in paths))
    assert "| method | algorithm.lambda | seeds |" in text and "| fedavg | – | 1 | 0.600 |" in text


def test_same_cell_and_seed_twice_is_an_error_naming_both_files(tmp_path):
    a = write(tmp_path / "first.h5", config(seed=3), final(0.5))
    b = write(tmp_path / "second.h5", config(seed=3, output="other.h5"), final(0.6))
    with pytest.raises(ReportError, match=r"first\.h5 and .*second\.h5.*seed 3"):
        group(summarize(p) for p in (a, b))
    result = run_cli(a, b)
    assert result.returncode == 2 and "first.h5" in result.stderr and "second.h5" in result.stderr
    c = write(tmp_path / "third.h5", config(seed=3, **{"algorithm.k": 5}), final(0.6))
    assert len(group(summarize(p) for p in (a, c))) == 2  # same seed, other k: two cells, no error


def test_skew_view_keeps_mean_sd_over_seeds_and_sd_across_skews(tmp_path):
    values = {("codistill", 0.6): [0.8, 0.7, 0.9], ("local", 0.6): [0.5, 0.6, 0.4], ("codistill", 0.2): [0.9, 0.9, 0.9]}
    paths = [
        write(
            tmp_path / f"{a}-{s}-{seed}.h5",
            config(seed=seed, algorithm={"name": a} if a == "local" else BASE["algorithm"], **{"data.skew": s}),
            final(v),
        )
        for (a, s), vs in values.items()
        for seed, v in enumerate(vs)
    ]
    table = skew_table(group(summarize(p) for p in paths))
    assert "minority_acc on toy, 2 clients, 50 images/class" in table
    assert "| method | s=0.2 | s=0.6 | sd across skews |" in table
    # sd across skews of the means 0.9 and 0.8: |0.9 - 0.8| / sqrt(2) = 0.0707
    assert "| codistill | 0.900 ± 0.000 | 0.800 ± 0.100 | 0.071 |" in table
    assert "| local | – | 0.500 ± 0.100 | – |" in table


# ----------------------------------------------------------------------------- incomplete runs


def test_incomplete_runs_are_listed_and_excluded_unless_asked(tmp_path):
    done = write(tmp_path / "done.h5", config(seed=0), final(0.8))
    crashed = write(tmp_path / "crashed.h5", config(seed=1, rounds=100), [0.2] * 36 + [0.4], completed=37)
    runs, notes = collect([done, crashed])
    assert [r.path.name for r in runs] == ["done.h5"] and notes == [f"excluded: {crashed} (37/100 rounds)"]
    runs, notes = collect([done, crashed], include_incomplete=True)
    assert [r.scores["minority_acc"] for r in runs] == pytest.approx([0.8, 0.4])
    assert "37/100" in notes[0]
    result = run_cli(done, crashed)
    assert result.returncode == 0, result.stderr
    assert f"excluded: {crashed} (37/100 rounds)" in result.stdout and "1 runs in 1 cells" in result.stdout
    alone = run_cli(crashed)
    assert alone.returncode == 2 and "crashed.h5" in alone.stderr and "--include-incomplete" in alone.stderr


# ----------------------------------------------------------------------------- selection


def test_last_n_rounds_are_averaged(tmp_path):
    # per round, mean over clients: (0.2+0.4)/2 = 0.3, (0.5+0.7)/2 = 0.6, (0.8+1.0)/2 = 0.9
    p = write(tmp_path / "r.h5", config(), [[0.2, 0.4], [0.5, 0.7], [0.8, 1.0]])
    assert summarize(p, last=1).scores["minority_acc"] == pytest.approx(0.9)
    assert summarize(p, last=2).scores["minority_acc"] == pytest.approx(0.75)
    assert summarize(p, last=9).scores["minority_acc"] == pytest.approx(0.6)
    assert summarize(p, last=2).scores["balanced_acc"] == pytest.approx(0.85)


def test_best_val_picks_the_earliest_round_of_highest_validation_minority_accuracy(tmp_path):
    # val means: 0.5, (0.75+0.75)/2 = 0.75, (1.0+0.5)/2 = 0.75 -> a tie, the earlier round (index 1) wins;
    # the test metric peaks at the last round, so choosing on test would give 0.9
    p = write(
        tmp_path / "v.h5", config(), [[0.2, 0.4], [0.5, 0.7], [0.8, 1.0]], val=[[0.5, 0.5], [0.75, 0.75], [1.0, 0.5]]
    )
    run = summarize(p, select="best-val")
    assert run.selected_round == 1
    expected = {"minority_acc": 0.6, "balanced_acc": 0.7, "test_acc": 0.8, "personal_acc": math.nan}  # no such column
    assert run.scores == pytest.approx(expected, nan_ok=True)
    result = run_cli(p, "--select", "best-val")
    assert result.returncode == 0, result.stderr
    assert "highest validation minority accuracy" in result.stdout and "ties -> the earliest round" in result.stdout
    assert "| codistill | 0.600 |" in result.stdout


def test_best_val_without_validation_metrics_names_the_file(tmp_path):
    p = write(tmp_path / "old.h5", config(), final(0.5))
    with pytest.raises(ReportError, match=r"old\.h5.*val_minority_acc"):
        summarize(p, select="best-val")
    result = run_cli(p, "--select", "best-val")
    assert result.returncode == 2 and "old.h5" in result.stderr
    both = run_cli(p, "--select", "best-val", "--last", "3")
    assert both.returncode == 2 and "--last" in both.stderr


# ----------------------------------------------------------------------------- paired comparison


def test_t_quantiles_match_the_tables():
    known = {
        (0.975, 1): 12.706,
        (0.975, 2): 4.303,
        (0.975, 4): 2.776,
        (0.975, 9): 2.262,
        (0.975, 30): 2.042,
        (0.975, 120): 1.980,
        (0.95, 10): 1.812,
        (0.995, 5): 4.032,
    }
    for (p, df), value in known.items():
        assert t_quantile(p, df) == pytest.approx(value, abs=5e-4), (p, df)
    assert t_quantile(0.975, 10000) == pytest.approx(1.9602, abs=1e-4)  # close to the normal 1.95996


def test_t_quantiles_match_scipy_where_installed():
    stats = pytest.importorskip("scipy.stats")
    for df in range(1, 61):
        for p in (0.9, 0.975, 0.995):
            assert t_quantile(p, df) == pytest.approx(stats.t.ppf(p, df), rel=1e-9)


@pytest.fixture
def paired(tmp_path):
    local = {"name": "local"}
    fedavg = {"name": "fedavg"}
    runs = {  # (algorithm, skew): {seed: minority accuracy}
        ("codistill", 0.6): {0: 0.80, 1: 0.75, 2: 0.90, 3: 0.70, 4: 0.85, 7: 0.99},  # seed 7 has no local partner
        ("local", 0.6): {4: 0.70, 3: 0.65, 2: 0.75, 1: 0.70, 0: 0.70},
        ("fedavg", 0.6): {0: 0.50, 1: 0.50, 2: 0.45},
        ("codistill", 0.2): {0: 0.70, 1: 0.85, 2: 0.60},
        ("local", 0.2): {0: 0.75, 1: 0.70, 2: 0.65},
    }
    algo = {"codistill": BASE["algorithm"], "local": local, "fedavg": fedavg}
    return [
        write(tmp_path / f"{a}-{s}-{seed}.h5", config(seed=seed, algorithm=algo[a], **{"data.skew": s}), final(v))
        for (a, s), by_seed in runs.items()
        for seed, v in by_seed.items()
    ]


def test_versus_pairs_by_seed_with_a_t_interval_and_a_verdict(paired):
    cells = group(summarize(p) for p in paired)
    found = {(p.cell.method, p.cell.get("data.skew")): p for p in versus(cells, "local")}
    assert set(found) == {("codistill", 0.6), ("fedavg", 0.6), ("codistill", 0.2)}
    # codistill s=0.6: diffs 0.10, 0.05, 0.15, 0.05, 0.15: mean 0.10, sd sqrt(4 * 0.05² / 4) = 0.05,
    # half-width t(0.975, 4) * 0.05 / sqrt(5) = 2.776445 * 0.0223607 = 0.062083
    win = found["codistill", 0.6]
    assert sorted(win.diffs) == pytest.approx([0.05, 0.05, 0.10, 0.15, 0.15])
    assert win.interval == pytest.approx((0.10 - 0.062083, 0.10 + 0.062083), abs=1e-5)
    assert win.verdict == "wins"
    # fedavg s=0.6 (seeds 0-2 only): diffs -0.2, -0.2, -0.3: mean -0.23333, sd sqrt((2 * 0.03333² + 0.06667²) / 2)
    # = 0.057735, half-width t(0.975, 2) * 0.057735 / sqrt(3) = 4.302653 * 0.033333 = 0.143422
    lose = found["fedavg", 0.6]
    assert len(lose.diffs) == 3 and lose.mean == pytest.approx(-0.233333, abs=1e-6)
    assert lose.interval == pytest.approx((-0.233333 - 0.143422, -0.233333 + 0.143422), abs=1e-5)
    assert lose.verdict == "loses"
    # codistill s=0.2: diffs -0.05, 0.15, -0.05: mean 0.016667, sd sqrt((2 * 0.066667² + 0.133333²) / 2)
    # = 0.115470, half-width 4.302653 * 0.115470 / sqrt(3) = 0.286844: the interval contains 0
    tie = found["codistill", 0.2]
    assert tie.mean == pytest.approx(0.016667, abs=1e-6) and tie.verdict == "ties"
    assert tie.interval == pytest.approx((0.016667 - 0.286844, 0.016667 + 0.286844), abs=1e-5)


def test_versus_table_from_the_command_line(paired):
    result = run_cli(*paired, "--versus", "local")
    assert result.returncode == 0, result.stderr
    assert "| codistill | local | 0.6 | 5 | +0.100 | [+0.038, +0.162] | wins |" in result.stdout
    assert "| fedavg | local | 0.6 | 3 | -0.233 | [-0.377, -0.090] | loses |" in result.stdout
    assert "| codistill | local | 0.2 | 3 | +0.017 | [-0.270, +0.304] | ties |" in result.stdout
    missing = run_cli(*paired, "--versus", "fedprox")
    assert missing.returncode == 2 and "fedprox" in missing.stderr


def test_versus_metric_compares_balanced_accuracy_and_versus_only_prints_just_the_comparison(tmp_path):
    # minority accuracy says codistill wins (+0.1 on every seed); balanced accuracy says it loses:
    # balanced diffs -0.02, -0.04, -0.06: mean -0.04, sd 0.02, half-width t(0.975, 2) * 0.02 / sqrt(3)
    # = 4.302653 * 0.011547 = 0.049683 -> [-0.089683, +0.009683]: ties; and -0.01, -0.03, -0.05 on a
    # second skew: mean -0.03, same half-width -> [-0.079683, +0.019683]: ties as well
    runs = {  # (algorithm, skew, seed): (minority, balanced)
        ("codistill", 0.6, 0): (0.8, 0.70),
        ("codistill", 0.6, 1): (0.8, 0.70),
        ("codistill", 0.6, 2): (0.8, 0.70),
        ("local", 0.6, 0): (0.7, 0.72),
        ("local", 0.6, 1): (0.7, 0.74),
        ("local", 0.6, 2): (0.7, 0.76),
        ("codistill", 0.8, 0): (0.8, 0.50),
        ("codistill", 0.8, 1): (0.8, 0.50),
        ("codistill", 0.8, 2): (0.8, 0.50),
        ("local", 0.8, 0): (0.7, 0.51),
        ("local", 0.8, 1): (0.7, 0.53),
        ("local", 0.8, 2): (0.7, 0.55),
    }
    algo = {"codistill": BASE["algorithm"], "local": {"name": "local"}}
    files = [
        write(
            tmp_path / f"{a}-{s}-{seed}.h5",
            config(seed=seed, algorithm=algo[a], **{"data.skew": s}),
            final(m),
            balanced=[0.0, 0.0, b],
        )
        for (a, s, seed), (m, b) in runs.items()
    ]
    path = tmp_path / "balanced.csv"
    result = run_cli(*files, "--versus", "local", "--versus-metric", "balanced_acc", "--versus-csv", path)
    assert result.returncode == 0, result.stderr
    assert "| codistill | local | 0.6 | 3 | -0.040 | [-0.090, +0.010] | ties |" in result.stdout
    assert "| codistill | local | 0.8 | 3 | -0.030 | [-0.080, +0.020] | ties |" in result.stdout
    with open(path, newline="") as f:
        rows = {r["data.skew"]: r for r in csv.DictReader(f)}
    assert rows["0.6"]["metric"] == "balanced_acc"
    assert float(rows["0.6"]["mean_diff"]) == pytest.approx(-0.04, abs=1e-9)
    assert float(rows["0.6"]["ci_low"]) == pytest.approx(-0.04 - 0.049683, abs=1e-5)
    assert float(rows["0.8"]["ci_high"]) == pytest.approx(-0.03 + 0.049683, abs=1e-5)
    minority = run_cli(*files, "--versus", "local")  # the default metric: the other answer
    assert "| codistill | local | 0.6 | 3 | +0.100 |" in minority.stdout and "| wins |" in minority.stdout
    assert "| method | data.skew | seeds |" in minority.stdout  # the cell table is there by default
    only = run_cli(*files, "--versus", "local", "--versus-metric", "balanced_acc", "--versus-only")
    assert only.returncode == 0, only.stderr
    assert "| codistill | local | 0.8 | 3 | -0.030 |" in only.stdout
    assert "| method | data.skew | seeds |" not in only.stdout and "sd across skews" not in only.stdout
    assert "12 runs in 4 cells" in only.stdout  # what was read is still said
    for alone in (("--versus-only",), ("--versus-metric", "balanced_acc")):
        bad = run_cli(*files, *alone)
        assert bad.returncode == 2 and "needs --versus" in bad.stderr, alone
    wrong = run_cli(*files, "--versus", "local", "--versus-metric", "val_acc")
    assert wrong.returncode == 2 and "--versus-metric" in wrong.stderr


def test_personal_acc_is_a_score_in_the_tables_the_csv_and_versus(tmp_path):
    """personal_acc, where the file has it: scored by the same rule (last round, mean over clients),
    a column of the cell table and the CSV, and a --versus-metric. Per-client values (0.9, 0.7) at
    the last round: mean 0.8; seeds 0 and 1 of codistill 0.8 and 0.6 against local's 0.5 and 0.4:
    differences 0.3 and 0.2, mean +0.250."""
    values = {
        ("codistill", 0): [0.9, 0.7],
        ("codistill", 1): [0.6, 0.6],
        ("local", 0): [0.5, 0.5],
        ("local", 1): [0.4, 0.4],
    }
    algo = {"codistill": BASE["algorithm"], "local": {"name": "local"}}
    files = [
        write(tmp_path / f"{a}-{seed}.h5", config(seed=seed, algorithm=algo[a]), final(0.5), personal=[0, 0, v])
        for (a, seed), v in values.items()
    ]
    assert summarize(files[0]).scores["personal_acc"] == pytest.approx(0.8, abs=1e-12)
    out = tmp_path / "cells.csv"
    result = run_cli(*files, "--versus", "local", "--versus-metric", "personal_acc", "--csv", out)
    assert result.returncode == 0, result.stderr
    assert "| method | seeds | minority_acc | balanced_acc | test_acc | personal_acc |" in result.stdout
    # personal_acc (0.8 + 0.6) / 2 = 0.7, sd sqrt(2 * 0.1^2 / 1) = 0.141; local (0.5 + 0.4) / 2, sd 0.071
    assert "| codistill | 2 | 0.500 ± 0.000 | 0.600 ± 0.000 | 0.700 ± 0.000 | 0.700 ± 0.141 | 600 |" in result.stdout
    assert "| local | 2 | 0.500 ± 0.000 | 0.600 ± 0.000 | 0.700 ± 0.000 | 0.450 ± 0.071 | 600 |" in result.stdout
    assert "personal_acc: each method minus local" in result.stdout
    assert "| codistill | local | 2 | +0.250 |" in result.stdout
    rows = {r["method"]: r for r in csv.DictReader(out.open())}
    assert float(rows["codistill"]["personal_acc_mean"]) == pytest.approx(0.7, abs=1e-12)
    assert float(rows["local"]["personal_acc_mean"]) == pytest.approx(0.45, abs=1e-12)


def test_a_file_older_than_personal_acc_still_reports(tmp_path):
    """No /metrics/personal_acc: NaN in its scores, "–" in the table, empty in the CSV; every other
    score and --versus on them as before; --versus-metric personal_acc names the file instead."""
    old = write(tmp_path / "old.h5", config(), final(0.8))
    new = write(tmp_path / "new.h5", config(seed=1), final(0.6), personal=[0, 0, 0.9])
    local = [write(tmp_path / f"local-{s}.h5", config(seed=s, algorithm={"name": "local"}), final(0.5)) for s in (0, 1)]
    summary = summarize(old)
    assert np.isnan(summary.scores["personal_acc"]) and summary.scores["minority_acc"] == pytest.approx(0.8)
    assert np.isnan(summary.curves["personal_acc"]).all() and len(summary.curves["personal_acc"]) == 3
    out = tmp_path / "cells.csv"
    result = run_cli(old, new, *local, "--versus", "local", "--csv", out)
    assert result.returncode == 0, result.stderr
    assert "| codistill | 2 | 0.700 ± 0.141 | 0.800 ± 0.141 | 0.900 ± 0.141 | – |" in result.stdout  # one lacks it
    assert "| codistill | local | 2 | +0.200 |" in result.stdout  # minority accuracy: compared as before
    rows = {r["method"]: r for r in csv.DictReader(out.open())}
    assert rows["codistill"]["personal_acc_mean"] == "" and rows["codistill"]["personal_acc_sd"] == ""
    assert float(rows["codistill"]["minority_acc_mean"]) == pytest.approx(0.7, abs=1e-12)
    refused = run_cli(old, new, *local, "--versus", "local", "--versus-metric", "personal_acc")
    assert refused.returncode == 2 and "has no personal_acc" in refused.stderr
    assert "old.h5" in refused.stderr or "local-0.h5" in refused.stderr
    alone = run_cli(new, "--csv", tmp_path / "new.csv")  # a new file alone: its value
    assert alone.returncode == 0 and "| codistill | 1 | 0.600 | 0.700 | 0.800 | 0.900 |" in alone.stdout


def test_versus_metric_recall_of_a_class_by_name(tmp_path):
    """recall:<class>: the mean over clients of that class's recall, scored like the others (last round).

    malignant, codistill minus local by seed: (0.9 + 0.7) / 2 - 0.6 = 0.2, (0.8 + 0.6) / 2 - 0.55 = 0.15,
    (1.0 + 0.8) / 2 - 0.75 = 0.15: mean 0.166667, sd sqrt((0.033333² + 2 x 0.016667²) / 2) = 0.028868,
    half-width t(0.975, 2) x 0.028868 / sqrt(3) = 4.302653 x 0.016667 = 0.071711: wins. benign: 0.5 - 0.9
    on every seed: -0.4, sd 0: loses. Minority accuracy is 0.5 for both: +0.000, ties."""
    malignant = {("codistill", 0): (0.9, 0.7), ("codistill", 1): (0.8, 0.6), ("codistill", 2): (1.0, 0.8)}
    malignant |= {("local", 0): (0.6, 0.6), ("local", 1): (0.55, 0.55), ("local", 2): (0.75, 0.75)}
    benign = {"codistill": 0.5, "local": 0.9}
    algo = {"codistill": BASE["algorithm"], "local": {"name": "local"}}
    files = []
    for (a, seed), (m0, m1) in malignant.items():
        last = [[m0, benign[a]], [m1, benign[a]]]  # (client, class) in the last round; earlier rounds far off
        recall = [[[0.0, 0.0], [0.0, 0.0]], [[0.1, 0.1], [0.1, 0.1]], last]
        cfg = config(seed=seed, algorithm=algo[a])
        files.append(
            write(tmp_path / f"{a}-{seed}.h5", cfg, final(0.5), recall=recall, class_names=["malignant", "benign"])
        )
    result = run_cli(
        *files, "--versus", "local", "--versus-metric", "recall:malignant", "--versus-csv", tmp_path / "m.csv"
    )
    assert result.returncode == 0, result.stderr
    assert "recall:malignant: each method minus local" in result.stdout
    assert "| codistill | local | 3 | +0.167 | [+0.095, +0.238] | wins |" in result.stdout
    (row,) = csv.DictReader((tmp_path / "m.csv").open())
    assert row["metric"] == "recall:malignant" and float(row["mean_diff"]) == pytest.approx(0.166667, abs=1e-6)
    assert float(row["ci_low"]) == pytest.approx(0.166667 - 0.071711, abs=1e-5)
    benign_run = run_cli(*files, "--versus", "local", "--versus-metric", "recall:benign", "--versus-only")
    assert "| codistill | local | 3 | -0.400 | [-0.400, -0.400] | loses |" in benign_run.stdout
    minority = run_cli(*files, "--versus", "local", "--versus-only")
    assert "| codistill | local | 3 | +0.000 | [+0.000, +0.000] | ties |" in minority.stdout
    unknown = run_cli(*files, "--versus", "local", "--versus-metric", "recall:malignent")
    assert unknown.returncode == 2 and unknown.stderr.count("\n") == 1, unknown.stderr
    assert "has no class 'malignent' (its classes: malignant, benign)" in unknown.stderr
    for bad in ("recall:", "precision:malignant", "recall"):
        wrong = run_cli(*files, "--versus", "local", "--versus-metric", bad)
        assert wrong.returncode == 2 and "recall:CLASS" in wrong.stderr, bad


def test_recall_by_class_index_in_a_file_without_class_names(tmp_path):
    recall = [[[0.0, 0.2], [0.4, 0.6]], [[0.2, 0.4], [0.6, 1.0]]]  # last round: class 1 mean (0.4 + 1.0) / 2
    cfg = config(rounds=2)
    run = summarize(write(tmp_path / "old.h5", cfg, [0.1, 0.2], recall=recall))
    assert run.class_names == ("0", "1")
    assert run.scores["recall:1"] == pytest.approx(0.7) and run.scores["recall:0"] == pytest.approx(0.4)
    assert "recall:malignant" not in run.scores


# ----------------------------------------------------------------------------- CSV and plots


def test_versus_csv_from_the_command_line(paired, tmp_path):
    path = tmp_path / "paired.csv"
    result = run_cli(*paired, "--versus", "local", "--versus-csv", str(path))
    assert result.returncode == 0, result.stderr
    with open(path, newline="") as f:
        rows = {(r["method"], r["data.skew"]): r for r in csv.DictReader(f)}
    assert set(rows) == {("codistill", "0.6"), ("fedavg", "0.6"), ("codistill", "0.2")}
    # the hand-derived values of test_versus_pairs_by_seed_with_a_t_interval_and_a_verdict
    win = rows["codistill", "0.6"]
    assert win["versus"] == "local" and win["metric"] == "minority_acc"
    assert win["pairs"] == "5" and win["seeds"] == "0 1 2 3 4"  # seed 7 has no local partner
    assert float(win["mean_diff"]) == pytest.approx(0.10, abs=1e-9)
    assert float(win["ci_low"]) == pytest.approx(0.10 - 0.062083, abs=1e-5)
    assert float(win["ci_high"]) == pytest.approx(0.10 + 0.062083, abs=1e-5)
    assert win["verdict"] == "wins"
    lose = rows["fedavg", "0.6"]
    assert lose["pairs"] == "3" and lose["seeds"] == "0 1 2" and lose["verdict"] == "loses"
    assert float(lose["ci_high"]) == pytest.approx(-0.233333 + 0.143422, abs=1e-5)
    assert rows["codistill", "0.2"]["verdict"] == "ties"
    alone = run_cli(*paired, "--versus-csv", str(tmp_path / "x.csv"))
    assert alone.returncode == 2 and "--versus-csv needs --versus" in alone.stderr
    assert not (tmp_path / "x.csv").exists()


def test_csv_has_one_row_per_cell(paired, tmp_path):
    cells = group(summarize(p) for p in paired)
    write_csv(cells, tmp_path / "cells.csv")
    with open(tmp_path / "cells.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 5
    row = next(r for r in rows if r["method"] == "fedavg")
    assert row["data.skew"] == "0.6" and row["clients"] == "2" and row["dataset"] == "toy"
    assert row["images_per_class"] == "50"
    assert row["seeds"] == "3" and row["seed_values"] == "0 1 2"
    # fedavg minority: 0.5, 0.5, 0.45: mean 0.48333, sd sqrt((2 * 0.016667² + 0.033333²) / 2) = 0.028868
    assert float(row["minority_acc_mean"]) == pytest.approx(0.483333, abs=1e-6)
    assert float(row["minority_acc_sd"]) == pytest.approx(0.028868, abs=1e-6)
    assert float(row["test_acc_mean"]) == pytest.approx(0.683333, abs=1e-6)
    assert float(row["bytes_per_round_rank"]) == (800 + 400) / 2


def test_plots_and_csv_from_the_command_line(paired, tmp_path):
    pytest.importorskip("matplotlib")
    out = {
        flag: tmp_path / f"{flag.strip('-')}.{'csv' if flag == '--csv' else 'png'}"
        for flag in ("--plot", "--plot-rounds", "--plot-bytes", "--csv")
    }
    result = run_cli(*paired, *(str(v) for kv in out.items() for v in kv))
    assert result.returncode == 0, result.stderr
    for flag, path in out.items():
        if flag == "--csv":
            assert path.read_text().startswith("method,")
        else:
            assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", flag
    assert "| codistill |" in result.stdout  # the markdown tables stay on stdout


# ----------------------------------------------------------------------------- end to end


def test_report_command_on_real_runs(tmp_path):
    files = [tmp_path / f"s{seed}.h5" for seed in (0, 1)]
    for seed, path in enumerate(files):
        mpicd_run(2, QUICKSTART, path, "clients=2", "rounds=3", f"seed={seed}")
    csv_path = tmp_path / "cells.csv"
    result = mpicd_cli("report", *map(str, files), "--csv", str(csv_path))
    assert result.returncode == 0, result.stderr
    assert "| codistill |" in result.stdout and "±" in result.stdout and "breast_cancer" in result.stdout
    assert "2 runs in 1 cells" in result.stdout and "excluded" not in result.stdout
    header, row = csv_path.read_text().splitlines()
    assert row.startswith("codistill,breast_cancer,")
    # best-val, recomputed naively from the raw datasets: per run, the first round whose mean over
    # clients of val_minority_acc is the largest; its test minority accuracy averaged over clients
    scores = []
    for path in files:
        with h5py.File(path, "r") as f:
            val, test = f["metrics/val_minority_acc"][()], f["metrics/minority_acc"][()]
        means = [sum(row) / len(row) for row in val.tolist()]
        best = next(i for i, v in enumerate(means) if v == max(means))
        scores.append(sum(test[best]) / len(test[best]))
    mean = sum(scores) / 2
    sd = math.sqrt(sum((s - mean) ** 2 for s in scores))  # ddof=1 with two seeds
    best = mpicd_cli("report", *map(str, files), "--select", "best-val")
    assert best.returncode == 0, best.stderr
    assert f"| codistill | {mean:.3f} ± {sd:.3f} | – |" in best.stdout
    missing = mpicd_cli("report", str(tmp_path / "nope.h5"))
    assert missing.returncode == 2 and "nope.h5" in missing.stderr


def test_split_train_scores_the_training_split_audit_and_refuses_files_without_it(tmp_path):
    audited, plain = tmp_path / "audited.h5", tmp_path / "plain.h5"
    mpicd_run(2, QUICKSTART, audited, "clients=2", "rounds=2", "eval.train_split=true")
    mpicd_run(2, QUICKSTART, plain, "clients=2", "rounds=2")
    with h5py.File(audited, "r") as f:  # expected: the last round's mean over clients, read raw
        train = {m: float(f[f"metrics/train_{m}"][1].mean()) for m in ("minority_acc", "balanced_acc", "acc")}
        test = float(f["metrics/minority_acc"][1].mean())
    assert train["minority_acc"] != test  # otherwise the test could not tell the splits apart
    for split, expected in (("train", train["minority_acc"]), ("test", test)):
        out = tmp_path / f"{split}.csv"
        result = mpicd_cli("report", str(audited), "--split", split, "--csv", str(out))
        assert result.returncode == 0, result.stderr
        (row,) = list(csv.DictReader(out.open()))
        assert float(row["minority_acc_mean"]) == pytest.approx(expected, abs=1e-9)
        assert ("TRAINING images" in result.stdout) == (split == "train")
    (row,) = list(csv.DictReader((tmp_path / "train.csv").open()))
    assert float(row["test_acc_mean"]) == pytest.approx(train["acc"], abs=1e-9)
    with h5py.File(audited, "r") as f:  # --split train: personal_acc read from train_personal_acc
        personal = float(f["metrics/train_personal_acc"][1].mean())
    assert float(row["personal_acc_mean"]) == pytest.approx(personal, abs=1e-9)
    refused = mpicd_cli("report", str(plain), "--split", "train")
    assert refused.returncode == 2 and "eval.train_split=true" in refused.stderr and "plain.h5" in refused.stderr
