"""What differs across nodes, on a throw-away two-node cluster of namespaces (the session fixture
``netns2``, tests/support/netns_cluster.py): node1 and node2 have their own hostname, /tmp, /dev/shm and
address on a private bridge, their own slurmd; results go to the shared file system (/var/tmp).

Each test launches as a user would: ``sbatch -N 2`` (srun --mpi=pmix inside the job) or Open MPI's
``mpirun --hostfile`` started on node1 (its daemons reach node2 through the cluster's rsh agent).
Expected values come from the layout asked for (which rank on which host, local ranks by hand), from
a one-node ``mpiexec`` run of the same config, or from runs launched alone.

Where bit-for-bit equality with another layout is asserted, torch's threads are pinned to 1 per
rank in both (``--cpus-per-task=1`` / SLURM_CPUS_PER_TASK=1): losses change with the thread count
(tests/sweep/test_pack.py), and the core split differs between 2 ranks and 4 on a node.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from mpicd.mpi import launch
from mpicd.results.reader import Results
from mpicd.run import checkpoint
from mpicd.sweep.grid import load_sweep

from conftest import DRIVERS, QUICKSTART, ROOT, is_timing, mpi_env, mpiexec

pytestmark = pytest.mark.multinode

ROUNDS = 40  # enough that a USR1 sent after the second round's checkpoint lands mid-run
JOB_TIMEOUT = 240
LOST_NODE_SECONDS = 30  # a lost node ends the job within this, from the kill (issue 65: 17 s once, 35 s at worst)
MID_RUN = "after the ranks had started: not a launch problem"  # slurm/launch.sh, a job that lost a rank or node
PINNED = ["--cpus-per-task=1"]


def gpu_of(local_rank: int) -> str:
    """The device a rank of this local rank should get: GPUs by local rank, round robin."""
    gpus = torch.cuda.device_count()
    return f"cuda:{local_rank % gpus}" if gpus else "cpu"


def job_env(cluster, **more) -> dict:
    """The environment of a job on the cluster: its site key on the shared file system, as a site's
    would be (each node's /tmp is its own; mpicd.core.sitekey)."""
    site = {"MPICD_SITE_KEY": str(cluster.root / "site" / "site.key")}
    env = {**mpi_env(), **cluster.env, "PYTHONUNBUFFERED": "1", **site, **more}
    return {k: v for k, v in env.items() if not (k.startswith("SLURM_") and k != "SLURM_CONF") or k in more}


def sbatch(cluster, *args: str, env: dict, wait: bool = True, timeout: float = JOB_TIMEOUT) -> tuple[int, str]:
    """Submit from the project folder (root namespace, like a login node); (exit status, job id)."""
    command = ["sbatch", "--parsable", *(["--wait"] if wait else []), *args]
    try:
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as err:
        pytest.fail(f"{' '.join(command)} did not finish in {timeout} s\n{err.stdout}\n{err.stderr}\n{cluster.logs()}")
    job = done.stdout.strip().split(";")[0].splitlines()[0] if done.stdout.strip() else ""
    assert job.isdigit(), f"sbatch did not submit: {done.stdout}\n{done.stderr}\n{cluster.logs()}"
    return done.returncode, job


def mpirun(cluster, node: str, slots: dict[str, int], *args: str, env: dict, wait: bool = True, timeout=JOB_TIMEOUT):
    """``mpirun --hostfile`` of ``python ARGS`` started on ``node``; the CompletedProcess, or the Popen."""
    command = cluster.on(
        node,
        *launch.command(
            sum(slots.values()),
            [sys.executable, *args],
            launcher="mpirun",
            oversubscribe=False,
            unbound=True,
            hostfile=str(cluster.hostfile(slots)),
            export=[k for k in ("PYTHONUNBUFFERED", "SLURM_CPUS_PER_TASK") if k in env],
        ),
        cwd=ROOT,
    )
    if not wait:
        return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as err:
        pytest.fail(f"mpirun on {slots} did not finish in {timeout} s\n{err.stdout}\n{err.stderr}")


def placement(path: Path) -> list[tuple]:
    p = Results(path).placement
    return [
        (p["host"][r], int(p["local_rank"][r]), p["device"][r], int(p["threads"][r])) for r in range(len(p["host"]))
    ]


# Differs with the layout by design: the bytes sent outside the rounds (and so per channel) include
# the node-shared dataset's metadata, broadcast by each node's lowest rank to the others of its node
# (nodeshare).
LAYOUT_DEPENDENT = {"comm/outside_rounds", "comm/channel_bytes"}


def same_file(a: Path, b: Path) -> None:
    """Every dataset of both results files equal, measured seconds, placement and LAYOUT_DEPENDENT aside."""
    names: dict[Path, list[str]] = {}
    for path in (a, b):
        with h5py.File(path, "r") as f:
            found = []
            f.visititems(lambda n, o: found.append(n) if isinstance(o, h5py.Dataset) else None)
            names[path] = sorted(
                n for n in found if not is_timing(n) and not n.startswith("placement/") and n not in LAYOUT_DEPENDENT
            )
    assert names[a] == names[b]
    with h5py.File(a, "r") as fa, h5py.File(b, "r") as fb:
        assert fa.attrs["completed_rounds"] == fb.attrs["completed_rounds"]
        for name in names[a]:
            np.testing.assert_array_equal(fa[name][()], fb[name][()], err_msg=name)


def valid_rows(path: Path, rows: int) -> None:
    with h5py.File(path, "r") as f:
        for name in ("train_loss", "test_acc", "minority_acc"):
            assert np.isfinite(f["metrics"][name][:rows]).all(), name


def wait_for(condition, timeout: float, what: str, pause: float = 0.2, detail=None) -> None:
    """Poll condition until it holds; on a timeout the message carries detail() (e.g. the job's log)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}\n{detail() if detail else ''}")
        time.sleep(pause)


def job_detail(cluster, job: str, log: Path):
    """What a timed-out wait on a job shows: its log, Slurm's view of the job, and why nodes are down."""

    def detail() -> str:
        text = log.read_text() if log.is_file() else "(no log)"
        shown = cluster.run("scontrol", "show", "job", job).stdout
        logs = "".join(
            f"\n--- {p.name} (last 40 lines)\n" + "\n".join(p.read_text(errors="replace").splitlines()[-40:])
            for p in sorted(cluster.root.glob("slurm*.log"))
        )
        return f"{text}\n--- scontrol show job\n{shown}\n--- sinfo -R\n{cluster.run('sinfo', '-R').stdout}{logs}"

    return detail


def job_state(cluster, job: str) -> str:
    found = re.search(r"JobState=(\S+)", cluster.run("scontrol", "show", "job", job).stdout)
    return found.group(1) if found else "GONE"


def job_ended(cluster, job: str) -> bool:
    """No longer running: its batch script has exited (COMPLETING counts: Slurm may still be waiting
    for an unreachable node to confirm, until SlurmdTimeout marks it down)."""
    return job_state(cluster, job) not in ("PENDING", "CONFIGURING", "RUNNING")


def leftovers(cluster) -> dict[str, list[str]]:
    """Processes left inside each node's namespaces (their holder and slurmd aside)."""
    found = {}
    for node in cluster.names:
        lines = []
        for pid in cluster.processes(node):
            try:
                lines.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:120])
            except OSError:
                continue
        if lines:
            found[node] = lines
    return found


@pytest.fixture(scope="module")
def shared(netns2) -> Path:
    """A folder on the shared file system (the nodes' /tmp is their own)."""
    folder = netns2.root / "work"
    folder.mkdir(exist_ok=True)
    return folder


@pytest.fixture(scope="module")
def one_node(shared) -> Path:
    """The quick start, ROUNDS rounds, 4 ranks on this one machine (no cluster), 1 thread per rank."""
    out = shared / "one-node.h5"
    runs = [["run", str(QUICKSTART), f"rounds={ROUNDS}", "--out", str(out)]]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SLURM_CPUS_PER_TASK", "1")
        done = mpiexec(4, str(DRIVERS / "runs.py"), json.dumps(runs), timeout=JOB_TIMEOUT)
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def test_srun_two_nodes_places_ranks_by_node_and_writes_the_one_node_file(netns2, shared, one_node):
    """sbatch -N 2 --ntasks-per-node=2: ranks 0-1 on node1, 2-3 on node2, local ranks 0,1 on each;
    the collective file written from both hosts equals the one-node run's."""
    out, log = shared / "srun2x2.h5", shared / "srun2x2.out"
    rc, _ = sbatch(
        netns2,
        "-N", "2", "--ntasks-per-node=2", *PINNED, f"--output={log}",
        "slurm/mpicd.sbatch", str(QUICKSTART), f"rounds={ROUNDS}", "--out", str(out),
        env=job_env(netns2),
    )  # fmt: skip
    text = log.read_text()
    assert rc == 0, text
    assert "launching srun --mpi=pmix" in text, text
    expected = [
        ("node1", 0, gpu_of(0), 1),
        ("node1", 1, gpu_of(1), 1),
        ("node2", 0, gpu_of(0), 1),
        ("node2", 1, gpu_of(1), 1),
    ]
    assert placement(out) == expected
    for rank, (host, local, device, threads) in enumerate(expected):
        assert f"mpicd: rank {rank} on {host}: local rank {local}, {device}, {threads} threads" in text, text
    same_file(out, one_node)


def test_mpirun_uneven_layout_places_and_splits_the_cores_per_node(netns2, shared):
    """mpirun --hostfile node1 slots=3, node2 slots=1, unpinned: threads are the machine's cores
    divided by the ranks on that node (at least 1), and the lone rank on node2 has local rank 0."""
    import os

    out = shared / "uneven.h5"
    env = {k: v for k, v in job_env(netns2).items() if k != "SLURM_CPUS_PER_TASK"}
    done = mpirun(
        netns2, "node1", {"node1": 3, "node2": 1}, "-m", "mpicd", "run", str(QUICKSTART), "rounds=1", "--out", str(out),
        env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    cores = os.cpu_count()
    assert placement(out) == [
        ("node1", 0, gpu_of(0), max(1, cores // 3)),
        ("node1", 1, gpu_of(1), max(1, cores // 3)),
        ("node1", 2, gpu_of(2), max(1, cores // 3)),
        ("node2", 0, gpu_of(0), cores),
    ]
    valid_rows(out, 1)


def test_the_dataset_is_read_once_per_node_and_equals_a_private_load(netns2, shared):
    """2 ranks on each node: two reads in all, one per node, by the node's lowest rank; the node's
    ranks map the same shared segment, and node1's and node2's are different segments (each node's
    own /dev/shm)."""
    log = shared / "reads.txt"
    for stale in (log, *(shared / f"reads.txt.rank{r}" for r in range(4))):
        stale.unlink(missing_ok=True)
    done = mpirun(
        netns2, "node1", {"node1": 2, "node2": 2}, str(DRIVERS / "nodeshare_nodes.py"), str(QUICKSTART), str(log),
        env=job_env(netns2),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(log.read_text().split("\n")[:-1]) == ["node1 0", "node2 2"]
    rows = sorted((shared / f"reads.txt.rank{r}").read_text().split()[1:] for r in range(4))
    assert [(r[0], r[1]) for r in rows] == [("0", "node1"), ("1", "node1"), ("2", "node2"), ("3", "node2")], rows
    segments = {host: {(d, i) for rank, h, d, i in rows if h == host} for host in ("node1", "node2")}
    assert all(len(s) == 1 and next(iter(s))[1] != "0" for s in segments.values()), segments
    assert segments["node1"] != segments["node2"], segments


def test_pack_with_groups_spanning_nodes_equals_each_run_alone(netns2, shared):
    """4 tasks on 2 nodes, distributed cyclically (ranks 0,2 on node1, 1,3 on node2), so both groups of
    2 span the nodes; each packed run equals the same run launched alone on one node."""
    sweep = shared / "sweep.yaml"
    sweep.write_text(
        f"config: {QUICKSTART}\noutput_dir: {shared / 'packed'}\ngrid:\n  clients: [2]\n  rounds: [3]\n  seed: [0, 1]\n"
    )
    log = shared / "pack.out"
    rc, _ = sbatch(
        netns2,
        "-N", "2", "--ntasks=4", "--ntasks-per-node=2", *PINNED, f"--output={log}", "slurm/pack.sbatch", str(sweep),
        env=job_env(netns2, MPICD_SRUN_ARGS="--mpi=pmix --kill-on-bad-exit=1 --distribution=cyclic"),
    )  # fmt: skip
    text = log.read_text()
    assert rc == 0, text
    assert "2 pending; 4 ranks = 2 groups of 2" in text, text
    runs = load_sweep(sweep)
    alone = [["run", str(r.config), *r.overrides, "--out", str(shared / f"alone-{r.index}.h5")] for r in runs]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SLURM_CPUS_PER_TASK", "1")
        done = mpiexec(2, str(DRIVERS / "runs.py"), json.dumps(alone), timeout=JOB_TIMEOUT)
    assert done.returncode == 0, done.stdout + done.stderr
    for run in runs:
        assert sorted(h for h, *_ in placement(run.output)) == ["node1", "node2"]  # the group spans the nodes
        same_file(run.output, shared / f"alone-{run.index}.h5")


def test_usr1_on_a_two_node_job_requeues_and_resumes_to_the_uninterrupted_file(netns2, shared, one_node):
    out, log = shared / "requeued.h5", shared / "requeued.out"
    _, job = sbatch(
        netns2,
        "-N", "2", "--ntasks-per-node=2", *PINNED, f"--output={log}",
        "slurm/mpicd.sbatch", str(QUICKSTART), f"rounds={ROUNDS}", "--out", str(out),
        env=job_env(netns2), wait=False,
    )  # fmt: skip
    folder = checkpoint.folder_for(out)
    wait_for(lambda: all(max(checkpoint.held(folder, r), default=-1) >= 2 for r in range(4)), JOB_TIMEOUT, "round 2")
    signalled = netns2.run("scancel", "--signal=USR1", "--batch", job)  # what --signal=B:USR1@120 does
    assert signalled.returncode == 0, signalled.stderr

    def finished() -> bool:  # requeued (held cred_expire + 1 s), run again and ended
        relaunched = log.read_text().count("mpicd: launching") >= 2
        return relaunched and job_state(netns2, job) in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "GONE")

    wait_for(
        finished, JOB_TIMEOUT, f"job {job} to be requeued and finish", pause=0.5, detail=job_detail(netns2, job, log)
    )
    text = log.read_text()
    assert job_state(netns2, job) in ("COMPLETED", "GONE"), text
    assert "requeueing job" in text and re.search(r"resuming at round \d+", text), text
    resumed = Results(out).attrs["resumed_at"]
    assert len(resumed) == 1 and 2 <= resumed[0] < ROUNDS, resumed
    same_file(out, one_node)


def test_a_checkpoint_written_on_two_nodes_resumes_on_one_node_of_four_ranks(netns2, shared, one_node):
    """mpirun 2 x 2, SIGUSR1 to mpirun (which passes it to the ranks: checkpoint, exit 75), then the
    same command with --resume as 4 ranks on node1 alone: the file equals the uninterrupted run's."""
    out = shared / "moved.h5"
    args = ["-m", "mpicd", "run", str(QUICKSTART), f"rounds={ROUNDS}", "--out", str(out), "--resume"]
    env = job_env(netns2, SLURM_CPUS_PER_TASK="1")
    first = mpirun(netns2, "node1", {"node1": 2, "node2": 2}, *args, env=env, wait=False)
    try:
        folder = checkpoint.folder_for(out)
        wait_for(
            lambda: all(max(checkpoint.held(folder, r), default=-1) >= 2 for r in range(4)), JOB_TIMEOUT, "round 2"
        )
        first.send_signal(signal.SIGUSR1)
        text, _ = first.communicate(timeout=JOB_TIMEOUT)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert first.returncode != 0 and Results(out).completed_rounds < ROUNDS, text
    assert sorted({h for h, *_ in placement(out)}) == ["node1", "node2"]
    second = mpirun(netns2, "node1", {"node1": 4}, *args, env=env)
    assert second.returncode == 0, second.stdout + second.stderr
    assert re.search(r"resuming at round \d+", second.stdout), second.stdout
    assert [h for h, *_ in placement(out)] == ["node1"] * 4
    same_file(out, one_node)


def lose_node2(netns2, shared, name: str, lose, *extra: str) -> tuple[str, Path, float]:
    """A long 2 x 2 job; at its third round ``lose()`` is done to node2. (job log, file, seconds to end)."""
    out, log = shared / f"{name}.h5", shared / f"{name}.out"
    _, job = sbatch(
        netns2,
        "-N", "2", "--ntasks-per-node=2", "--no-requeue", f"--output={log}",
        "slurm/mpicd.sbatch", str(QUICKSTART), "rounds=100000", *extra, "--out", str(out),
        env=job_env(netns2), wait=False,
    )  # fmt: skip
    wait_for(lambda: log.is_file() and re.search(r"round\s+3/", log.read_text()), JOB_TIMEOUT, "round 3")
    lost = time.monotonic()
    lose()
    try:
        wait_for(lambda: job_ended(netns2, job), 30, f"job {job} to end after node2 was lost")
    except AssertionError:
        netns2.run("scancel", job)
        raise
    return log.read_text(), out, time.monotonic() - lost


def assert_reported_as_lost(text: str, out: Path) -> None:
    hint = text.strip().splitlines()[-1]
    assert hint.startswith("mpicd: srun --mpi=pmix --kill-on-bad-exit=1 exited with status"), text
    assert MID_RUN in hint and "MPICD_SRUN_ARGS" not in hint and "PMI" not in hint, text
    rounds = Results(out).completed_rounds
    assert rounds >= 3, rounds
    valid_rows(out, rounds)


def test_a_node_whose_ranks_are_killed_ends_the_job_and_leaves_nothing(netns2, shared):
    def kill_node2_ranks():
        ranks = [pid for pid in netns2.processes("node2") if b"mpicd" in Path(f"/proc/{pid}/cmdline").read_bytes()]
        assert ranks, leftovers(netns2)
        for pid in ranks:
            os_kill(pid)

    text, out, seconds = lose_node2(netns2, shared, "killed", kill_node2_ranks)
    assert seconds < LOST_NODE_SECONDS, f"the job took {seconds:.1f} s to end after node2's ranks were killed"
    wait_for(lambda: not leftovers(netns2), 10, "the job's processes to be gone from every node")
    assert re.search(r"node2: tasks? 2-3: Killed|node2: task [23]: Killed", text), text
    assert_reported_as_lost(text, out)


def os_kill(pid: int) -> None:
    import os

    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def test_a_node_whose_link_goes_down_ends_the_job_and_leaves_nothing_once_back(netns2, shared):
    """node2's link to the bridge taken down at round 3: the ranks on node1 wait in a collective until
    the round watchdog (timeout.round_seconds=5) aborts them, and srun gives up on node2. node2's own
    processes cannot hear of it while it is cut off (as a real node behind a dead link); once the link
    is back Slurm ends them. Last in this file: node2 is out of service until then."""
    try:
        text, out, seconds = lose_node2(
            netns2, shared, "unlinked", lambda: netns2.link("node2", up=False), "timeout.round_seconds=5"
        )
        assert not leftovers(netns2).get("node1"), leftovers(netns2)
    finally:
        netns2.link("node2", up=True)
    assert "timeout.round_seconds=5" in text, text
    assert_reported_as_lost(text, out)
    wait_for(lambda: not leftovers(netns2), 90, "node2's leftovers to be ended once its link is back", pause=1)
    netns2.wait_idle(90)
