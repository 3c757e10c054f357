"""mpicd bench: the smoke run writes every figure (positive, finite, fractions in [0, 1]); the network
fit and the projection's formulas against hand-derived values. No assertion on how fast anything is."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT, mpi_env, mpicd_cli, require_pneumonia

ALGORITHMS = ("codistill", "fedavg", "fedproto", "feddistill", "fedamp", "local")
# P and B by hand. LeNet (1 channel, D = 200, C = 2): conv 1*6*25+6, conv 6*16*25+16, conv 16*120*9+120,
# Linear 120*200+200, head 200*2+2. ResNet-18 (1 channel, C = 2): torchvision's 11,689,512 with conv1
# 64*1*49 instead of 64*3*49 and fc 512*2+2 instead of 512*1000+1000; B: running mean and variance
# of its BatchNorm channels 64 + 4*64 + (4*128+128) + (4*256+256) + (4*512+512) = 4800.
LENET_P = 156 + 2416 + 17400 + 24200 + 402
RESNET_P = 11_689_512 - 64 * 3 * 49 + 64 * 1 * 49 - (512 * 1000 + 1000) + (512 * 2 + 2)
RESNET_B = 2 * (64 + 4 * 64 + 4 * 128 + 128 + 4 * 256 + 256 + 4 * 512 + 512)


def finite_positive(stat: dict) -> bool:
    keys = ("min", "median", "max")
    return (
        all(isinstance(stat[k], float) and math.isfinite(stat[k]) and stat[k] > 0 for k in keys)
        and stat["min"] <= stat["median"] <= stat["max"]
    )


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    require_pneumonia()
    out = tmp_path_factory.mktemp("bench") / "bench.json"
    try:
        done = subprocess.run(
            [sys.executable, "-m", "mpicd", "bench", "--quick", "--json", str(out)],
            cwd=ROOT,
            env=mpi_env(),
            capture_output=True,
            text=True,
            timeout=900,
        )
    except subprocess.TimeoutExpired as err:
        pytest.fail(f"mpicd bench --quick did not finish within 900 s\n{err.stdout}\n{err.stderr}")
    assert done.returncode == 0, f"mpicd bench --quick failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return json.loads(out.read_text()), done.stdout


def test_quick_bench_writes_every_key_with_sane_values(quick):
    r, stdout = quick
    for key in ("overhead_ratio", "comm_io_fraction", "speedup", "ideal", "startup_seconds", "projection"):
        assert key in r, key
    assert finite_positive(r["overhead_ratio"]) and finite_positive(r["speedup"])
    assert set(r["comm_io_fraction"]) == set(ALGORITHMS)
    for name, fraction in r["comm_io_fraction"].items():
        assert 0 <= fraction["min"] <= fraction["max"] <= 1, name
        # the least-waiting rank's seconds can only be below the mean over ranks, round by round
        own = r["comm_io_own_fraction"][name]["values"]
        assert all(0 <= o <= f + 1e-12 for o, f in zip(own, fraction["values"])), name
    cores = len(os.sched_getaffinity(0))
    assert r["ideal"] == min(2, cores) and r["settings"]["ranks"] == 2 and r["settings"]["repeats"] == 1
    o = r["overhead"]
    for key in ("mpicd_train_seconds", "bare_train_seconds", "mpicd_images_per_second", "bare_images_per_second"):
        assert finite_positive(o[key]), key
    assert o["images_per_round"] == 40 + 16  # 40 images of the expertise class, 40 * (1 - 0.6) of the other
    for name, parts in r["anatomy"].items():
        for part in ("train", "eval", "write", "total"):
            assert finite_positive(parts[part]), (name, part)
        # each repeat's total is its four parts
        parts_sum = np.sum([parts[p]["values"] for p in ("train", "comm", "eval", "write")], axis=0)
        np.testing.assert_allclose(parts_sum, parts["total"]["values"], rtol=1e-9)
    assert r["anatomy"]["local"]["comm"]["median"] == 0  # local never calls MPI inside a round
    for name in ("codistill", "fedavg", "fedamp"):
        assert r["anatomy"][name]["comm"]["median"] > 0, name
    s = r["startup_seconds"]
    assert s["ranks"] == 2 and finite_positive(s["total"])
    for name in ("mpi_init", "imports", "data", "placement", "launch"):
        assert finite_positive(s["phases"][name]), name
    phases = sum(st["median"] for name, st in s["phases"].items() if name != "model_build")
    assert phases + s["phases"]["model_build"]["median"] == pytest.approx(s["total"]["median"])
    net = r["network"]
    assert net["sizes"] == [8, 2**20] and net["ranks"] == 2
    for name in ("pingpong", "allreduce"):
        assert all(finite_positive(st) for st in net[name]["seconds"])
        assert math.isfinite(net[name]["latency_seconds"]) and net[name]["latency_seconds"] >= 0
        assert math.isfinite(net[name]["bandwidth_bytes_per_second"]) and net[name]["bandwidth_bytes_per_second"] > 0
    for line in ("overhead_ratio", "comm_io_fraction", "speedup", "projection"):
        assert line in stdout, line


def test_quick_bench_measures_the_write_at_two_rank_counts(quick):
    r, stdout = quick
    w = r["write_vs_ranks"]
    assert w["ranks"] == [2, 5] and w["rounds"] == 5
    # flushed every round, and auto: ceil(ranks / 4) rounds between flushes (1 at 2 ranks, 2 at 5)
    assert [e["flush_every"] for e in w["every_round"]] == [1, 1]
    assert [e["flush_every"] for e in w["auto"]] == [1, 2]
    for name in ("every_round", "auto"):
        for entry in w[name]:
            assert entry["rounds"] == 4  # the first of 5 rounds is the warm-up
            assert all(math.isfinite(entry[k]) and entry[k] > 0 for k in ("mean", "median")), (name, entry)
        assert w["growth"][name] == pytest.approx(w[name][1]["mean"] / w[name][0]["mean"])
    assert "results write per round vs ranks" in stdout


def test_projection_follows_its_stated_formulas(quick):
    r, _ = quick
    pr = r["projection"]
    assert pr["ranks"] == [4, 8, 16, 32, 64, 128, 256, 512, 1024]
    a, b, write = pr["latency_seconds"], pr["bandwidth_bytes_per_second"], pr["write_seconds"]
    lenet, resnet = pr["models"]["lenet"], pr["models"]["resnet18"]
    assert (lenet["P"], lenet["D"], lenet["B"], lenet["C"]) == (LENET_P, 200, 0, 2)
    assert (resnet["P"], resnet["D"], resnet["B"]) == (RESNET_P, 512, RESNET_B)
    for model in (lenet, resnet):
        assert model["compute_seconds"] > 0
        P, B, C, D = model["P"], model["B"], model["C"], model["D"]
        for i, n in enumerate(pr["ranks"]):
            steps = math.ceil(math.log2(n))
            progress = 2 * steps * a + 2 * (n - 1) / n * 32 / b  # the loop's Allreduce of 4 float64
            allreduce = {"fedavg": 4 * (P + B + 1), "fedproto": 4 * C * (D + 1), "feddistill": 4 * C * (C + 1)}
            for name, m in allreduce.items():
                want = 2 * steps * a + 2 * (n - 1) / n * m / b + progress
                assert model["algorithms"][name]["comm_seconds"][i] == pytest.approx(want), (name, n)
            fedamp = steps * a + (n - 1) * 4 * P / b + progress
            assert model["algorithms"]["fedamp"]["comm_seconds"][i] == pytest.approx(fedamp)
            assert model["algorithms"]["local"]["comm_seconds"][i] == pytest.approx(progress)
            codistill = model["algorithms"]["codistill"]["comm_seconds"][i] - progress - a
            assert 1 <= codistill / (4 * D / b) < n  # the busiest teacher serves between 1 and N-1 students
            for alg in model["algorithms"].values():
                assert alg["round_seconds"][i] == pytest.approx(
                    model["compute_seconds"] + alg["comm_seconds"][i] + write
                )
        assert model["fedamp_gathered_bytes"] == [4 * n * P for n in pr["ranks"]]
    for check in pr["check_at_measured_ranks"].values():  # the model at the measured rank count
        assert check["ranks"] == 2 and check["modelled_comm_seconds"] >= 0 and check["measured_comm_seconds"] >= 0


def test_fit_recovers_latency_and_bandwidth():
    from mpicd.bench.net import fit

    sizes = np.array([8, 64, 512, 4096, 32768, 262144, 2097152, 16777216])
    latency, bandwidth = fit(sizes, 3e-6 + sizes / 7e9)
    assert latency == pytest.approx(3e-6, rel=1e-9) and bandwidth == pytest.approx(7e9, rel=1e-9)
    latency, bandwidth = fit([8, 1000], [1e-3, 5e-4])  # noise with a negative slope: no infinite bandwidth
    assert math.isfinite(bandwidth) and bandwidth == pytest.approx(1000 / 5e-4)


def test_busiest_teacher_is_the_largest_student_count():
    from mpicd.algorithms.codistill import teacher_assignment
    from mpicd.bench.projection import busiest_teacher

    for n in (2, 5, 64):
        counts = []
        for r in range(32):
            t = teacher_assignment(0, r, n)
            counts.append(max(int((t == k).sum()) for k in range(n)))
        assert busiest_teacher(n) == pytest.approx(np.mean(counts))
    assert busiest_teacher(2) == 1  # two clients teach each other


@pytest.mark.parametrize(
    "args, named",
    [
        (["--ranks", "1"], "--ranks"),
        (["--rounds", "1"], "--rounds"),
        (["--repeats", "0"], "--repeats"),
        (["--config", "/nope.yaml"], "--config"),
        (["--data", "/nope.npz"], "--data"),
        (["--threads", "0"], "--threads"),
        (["--quick", "rounds=1"], "usage"),
    ],
)
def test_bad_options_exit_2_naming_the_option(args, named):
    result = mpicd_cli("bench", *args)
    assert result.returncode == 2 and named in result.stderr, result.stderr


# ----------------------------------------------------------------- clients per rank: evaluated once


def test_before_after_pairs_runs_with_the_pure_compute_and_ratios_by_hand():
    from mpicd.bench.clients import before_after, render

    def run(evaluated, round_seconds, wall, repeat):
        return {"algorithm": "fedavg", "clients": 8, "ranks": 2, "evaluated": evaluated, "wall_seconds": wall,
                "round_seconds": round_seconds, "startup_seconds": 1.0, "seconds_per_round": round_seconds,
                "pure_compute_per_round": 0.1, "memory_pss_bytes": 2**30, "repeat": repeat}  # fmt: skip

    def pure(seconds, repeat):
        return {"algorithm": "fedavg", "clients": 8, "ranks": 2, "evaluated": "alone", "pure_round_seconds": seconds,
                "repeat": repeat}  # fmt: skip

    rows = [
        run("per_client", 2.0, 50.0, 0),  # repeat 0: speed-up 4, after/pure 1.25, before/pure 5, wall 4
        pure(0.4, 0),
        run("once", 0.5, 12.5, 0),
        run("once", 9.0, 99.0, 0) | {"ranks": 8},  # one rank per client: no pair
        run("once", 0.5, 12.0, 1),  # repeat 1: speed-up 6, after/pure 1.0, before/pure 6, wall 5
        pure(0.5, 1),
        run("per_client", 3.0, 60.0, 1),
        run("per_client", 1.0, 1.0, 2),  # repeat 2 lacks its pure compute: left out
        run("once", 1.0, 1.0, 2),
        {"algorithm": "codistill", "clients": 8, "ranks": 2, "evaluated": "once", "error": "out of memory"},
    ]
    (pair,) = before_after(rows)
    assert (pair["algorithm"], pair["clients"], pair["ranks"], pair["repeats"]) == ("fedavg", 8, 2, 2)
    assert pair["speedup_round"] == pytest.approx(5.0)  # the median of 4 and 6
    assert pair["after_over_pure"] == pytest.approx(1.125)  # of 1.25 and 1.0
    assert (pair["after_over_pure_min"], pair["after_over_pure_max"]) == pytest.approx((1.0, 1.25))
    assert pair["before_over_pure"] == pytest.approx(5.5)
    assert pair["speedup_wall"] == pytest.approx(4.5)
    text = render(None, rows)
    assert (
        "| fedavg | 8 | 2 | 2 | 2.500 | 0.500 | 5.00 | 0.450 | 1.12 (1.00–1.25) | 5.50 | 55.0 | 12.2 | 4.50 |" in text
    )
    assert "failed: out of memory" in text


def test_the_clients_sweep_runs_both_evaluations_and_times_what_differs(tmp_path):
    """4 quick-start clients on 2 ranks: each algorithm evaluated per client and once, and the pure
    compute alone counts one distinct model per rank for fedavg, every client's for codistill."""
    out = tmp_path / "clients.json"
    done = subprocess.run(
        [sys.executable, "-m", "mpicd.bench.clients", "--config", str(ROOT / "configs" / "quickstart.yaml"),
         "--clients", "4", "--rounds", "2", "--one-per-client-up-to", "0", "--json", str(out)],
        cwd=ROOT, env=mpi_env(), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    rows = json.loads(out.read_text())["sweep"]
    assert [(r["algorithm"], r["evaluated"]) for r in rows] == [
        ("fedavg", "per_client"), ("fedavg", "alone"), ("fedavg", "once"),
        ("codistill", "per_client"), ("codistill", "alone"), ("codistill", "once"),
    ]  # fmt: skip
    alone = {r["algorithm"]: r for r in rows if r["evaluated"] == "alone"}
    assert alone["fedavg"]["distinct_models"] == 2 and alone["codistill"]["distinct_models"] == 4
    for r in rows:
        assert "error" not in r, r
        seconds = r["pure_round_seconds"] if r["evaluated"] == "alone" else r["round_seconds"]
        assert math.isfinite(seconds) and seconds > 0
    assert done.stdout.count("| fedavg | 4 | 2 |") == 3  # two runs and their pair
    assert all(r["repeat"] == 0 for r in rows)
