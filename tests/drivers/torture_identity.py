"""Run as pid 1 of a sandbox (``unshare --pid --fork --mount-proc``): tests/support/torture.py's Attempt
kills only what it saw in its job's session, by identity. Prints one JSON object of what it saw.

The "job" is a session of its own (as mpiexec is started): a shell that starts ``sleep`` and
then execs another command line, so the pid seen first as the shell must still be killed after its
exec. A canary outside the job must survive, even with a record in ``seen`` naming its pid with
another start time (what a pid reused since it was seen looks like).
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "support"))

import proc_identity  # noqa: E402
import torture  # noqa: E402


def main() -> dict:
    assert os.getpid() == 1, "not the first process of a PID-namespace sandbox: refusing to act"
    canary = subprocess.Popen(["sleep", "300"])
    attempt = torture.Attempt.__new__(torture.Attempt)  # no mpiexec: a stand-in job in its own session
    attempt.seen = {}
    attempt.proc = subprocess.Popen(["bash", "-c", "sleep 300 & sleep 0.5; exec sleep 301"], start_new_session=True)
    try:
        time.sleep(0.2)
        attempt.session()  # seen now as bash, which execs `sleep 301` 0.3 s later
        before = {e["pid"]: e["cmdline"] for e in attempt.seen.values()}
        time.sleep(0.8)
        start = proc_identity.start_time(canary.pid)
        # the canary's pid as if it had been a job's process seen before (another start time)
        attempt.seen[(canary.pid, start - 1)] = {"pid": canary.pid, "start": start - 1, "cmdline": ["sleep", "300"]}
        attempt.kill_job()
        try:
            attempt.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass  # not killed: leader_rc None says so
        left = attempt.leftovers(grace=5)
        session = [pid for pid in map(int, filter(str.isdigit, os.listdir("/proc"))) if proc_identity.alive(pid)
                   and os.getsid(pid) == attempt.proc.pid]  # fmt: skip
        return {
            "before": {str(k): v for k, v in before.items()},
            "leader_rc": attempt.proc.returncode,
            "left": left,
            "session_alive": session,
            "canary_alive": canary.poll() is None,
        }
    finally:
        for proc in (canary, attempt.proc):
            proc.kill()


if __name__ == "__main__":
    print(json.dumps(main()))
