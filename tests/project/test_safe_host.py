"""`netns_cluster down` on a state file it did not write kills nothing: each case runs in a sandbox
of its own PID, mount and network namespaces (tests/drivers/netns_forged.py), so that even a
regression reaches only the sandbox, and a canary outside any cluster must survive every case."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import DRIVERS

NEEDS = ("unshare", "nsenter", "ip")
pytestmark = pytest.mark.skipif(
    os.getuid() != 0 or any(shutil.which(b, path="/usr/sbin:/sbin:/usr/bin:/bin") is None for b in NEEDS),
    reason="the sandbox and network namespaces need root and util-linux/iproute2",
)


def sandboxed(scenario: str) -> dict:
    command = ["unshare", "--pid", "--fork", "--mount-proc", "--net", sys.executable, str(DRIVERS / "netns_forged.py")]
    done = subprocess.run([*command, scenario], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"the sandbox failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_forged_state_naming_harmless_processes_kills_nothing_and_says_so():
    facts = sandboxed("forged")
    assert facts["alive"] == {"canary": True, "holder": True, "daemon": True}, facts
    assert "stale cluster.json" in facts["up"] and " down " in facts["up"], facts["up"]
    reported = "\n".join(facts["reported"])
    assert "skipped holder-node1" in reported and "not inside /var/run/netns/mpicd-b0d5-node1" in reported, reported
    assert "skipped munged" in reported and "not one this cluster launches" in reported, reported
    assert "skipped link 'lo'" in reported and "skipped link 'eth0'" in reported, reported
    assert "skipped netns '../../../etc'" in reported, reported
    assert facts["rc"] == 0 and not facts["state_kept"], facts  # nothing of its own is left: the file goes


def test_a_holder_sharing_the_callers_mount_namespace_is_refused():
    facts = sandboxed("shares")
    assert facts["alive"] == {"canary": True, "holder": True}, facts
    reported = "\n".join(facts["reported"])
    assert "refused" in reported and "shares the mount namespace" in reported, reported
    assert facts["state_kept"], "a refused holder may be real: its record must stay"


def test_a_recorded_pid_whose_start_time_differs_is_skipped():
    facts = sandboxed("stale")
    assert facts["alive"] == {"canary": True, "holder": True, "inside": True}, facts
    reported = "\n".join(facts["reported"])
    assert "skipped holder-node1" in reported and "stale" in reported, reported


def test_a_proven_holder_is_stopped_with_what_runs_inside_it():
    """The control: with the right start time the same holder and its inside process go, so the
    cases above pass because of the proof, not because down no longer kills anything."""
    facts = sandboxed("genuine")
    assert facts["alive"] == {"canary": True, "holder": False, "inside": False}, facts
    assert facts["reported"] == [] and not facts["state_kept"] and not facts["netns_left"], facts


def test_pause_sh_signals_only_the_study_it_can_prove(tmp_path):
    """study/pause.sh, in a PID-namespace sandbox: a stale record and one naming the
    caller's own group signal nothing; the genuine study's group is stopped and continued."""
    command = ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, str(DRIVERS / "pause_forged.py")]
    done = subprocess.run([*command, str(tmp_path), "study/run.sh"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"the sandbox failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    assert facts["stale"]["rc"] == 1 and not facts["stale"]["stopped"], facts["stale"]
    assert "started at" in facts["stale"]["err"] and "nothing signalled" in facts["stale"]["err"], facts["stale"]
    assert facts["own"]["rc"] == 1 and "own group" in facts["own"]["err"], facts["own"]
    assert not facts["own"]["canary_stopped"], facts["own"]
    assert facts["genuine_stop"]["rc"] == 0 and facts["genuine_stop"]["stopped"], facts["genuine_stop"]
    assert facts["genuine_cont"]["rc"] == 0 and not facts["genuine_cont"]["stopped"], facts["genuine_cont"]
    assert facts["canary_alive"], facts
