"""Run as pid 1 of a sandbox (``unshare --pid --fork --mount-proc --net``): `netns_cluster down` on a
forged or stale ``cluster.json``. argv: SCENARIO. Prints one JSON object of what survived and what
down reported.

In the sandbox /proc and kill() reach only the sandbox's own processes and ``ip`` only its own
network namespace, so even a regression cannot touch the host. A canary (``sleep``, in the
sandbox's mount namespace, outside any cluster) must survive every scenario.

* ``forged``: the recorded holder and daemon are harmless processes, each in a mount namespace of its
  own with its real start time and command line recorded: the holder looks like one (sleep
  infinity) but is not inside the cluster's network namespace; the daemon's command line is not
  what the cluster launches; links named ``lo``/``eth0``. Run through the CLI.
* ``shares``: the holder passes every proof but shares the caller's mount namespace (sleep
  infinity inside the cluster's network namespace, started without ``unshare -m``).
* ``stale``: a holder exactly as the cluster makes one, with a process inside its namespace, but
  the recorded start time is not its own (a reused pid).
* ``genuine``: the same with the right start time: down must kill both (the control).
"""

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "support"))

import proc_identity  # noqa: E402
from netns_cluster import NetnsCluster  # noqa: E402

TAG = "b0d5"


def spawn(*argv: str) -> subprocess.Popen:
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL)


def settled(proc: subprocess.Popen, command: list[str], timeout: float = 10) -> dict:
    """The identity of ``proc`` once it shows ``command`` (it execs through nsenter/unshare)."""
    deadline = time.monotonic() + timeout
    while proc_identity.cmdline(proc.pid) != command:
        assert time.monotonic() < deadline, f"{proc.pid} never became {command}: {proc_identity.cmdline(proc.pid)}"
        time.sleep(0.02)
    return proc_identity.record(proc.pid)


def forge(folder: Path, state: dict) -> None:
    (folder / "cluster.json").write_text(json.dumps(state))
    os.chmod(folder / "cluster.json", 0o600)


def main(scenario: str) -> dict:
    assert os.getpid() == 1, "not the first process of a PID-namespace sandbox: refusing to act"
    canary = spawn("sleep", "300")
    folder = Path(tempfile.mkdtemp(prefix="forged-", dir="/var/tmp"))
    watched: dict[str, subprocess.Popen] = {"canary": canary}
    facts: dict = {}
    netns = f"mpicd-{TAG}-node1"
    subprocess.run(["ip", "netns", "add", netns], check=True)
    try:
        state = {"tag": TAG, "links": [], "netns": [], "holders": {}, "daemons": {}, "identities": {}}
        if scenario == "forged":
            holder = spawn("unshare", "-m", "--propagation", "private", "sleep", "infinity")
            daemon = spawn("unshare", "-m", "--propagation", "private", "sleep", "302")
            watched.update(holder=holder, daemon=daemon)
            state["holders"]["node1"] = holder.pid
            state["daemons"]["munged"] = daemon.pid
            state["identities"]["holder-node1"] = settled(holder, ["sleep", "infinity"])
            state["identities"]["munged"] = settled(daemon, ["sleep", "302"])
            state["links"] = ["lo", "eth0"]
            state["netns"] = ["../../../etc"]
            forge(folder, state)
            try:
                NetnsCluster(folder).up()
            except RuntimeError as err:
                facts["up"] = str(err)
            done = subprocess.run(
                [sys.executable, str(ROOT / "tests" / "support" / "netns_cluster.py"), "down", str(folder)],
                capture_output=True,
                text=True,
                timeout=60,
            )
            facts.update(rc=done.returncode, reported=done.stderr.splitlines())
        else:
            command = ["sleep", "infinity"]
            if scenario == "shares":
                holder = spawn("nsenter", f"--net=/var/run/netns/{netns}", *command)
            else:
                holder = spawn(
                    "nsenter", f"--net=/var/run/netns/{netns}", "unshare", "-u", "-m", "--propagation", "private",
                    *command,
                )  # fmt: skip
            watched["holder"] = holder
            identity = settled(holder, command)
            if scenario != "shares":
                inside = spawn("nsenter", "-t", str(holder.pid), "-m", "-n", "sleep", "303")
                settled(inside, ["sleep", "303"])
                watched["inside"] = inside
            if scenario == "stale":
                identity["start"] += 1
            state["holders"]["node1"] = holder.pid
            state["identities"]["holder-node1"] = identity
            state["netns"] = [netns]
            forge(folder, state)
            cluster = NetnsCluster(folder)
            facts["reported"] = cluster.down(timeout=5)
        time.sleep(0.2)
        for proc in watched.values():
            proc.poll()  # reap what down killed (we are their parent)
        facts["alive"] = {name: proc.poll() is None for name, proc in watched.items()}
        facts["state_kept"] = (folder / "cluster.json").exists()
        facts["netns_left"] = Path(f"/var/run/netns/{netns}").exists()
        return facts
    finally:
        for proc in watched.values():
            if proc.poll() is None:
                proc.kill()
        subprocess.run(["ip", "netns", "del", netns], capture_output=True)
        for path in folder.iterdir():
            path.unlink()
        folder.rmdir()


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
