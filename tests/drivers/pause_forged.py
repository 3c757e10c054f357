"""Run as pid 1 of a sandbox (``unshare --pid --fork --mount-proc``), with ``study/run.sh``
among its arguments: study/pause.sh against a genuine, a stale and a self-naming study
record. argv: STATE_FOLDER study/run.sh. Prints one JSON object of what it saw.

The "study" is ``bash -c 'sleep 300' study/run.sh`` started as a session of its own (as
run.sh makes itself), recorded as run.sh records itself; a canary outside it must never stop.
"""

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "support"))

import proc_identity  # noqa: E402


def pause(state: Path, action: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "STUDY_STATE": str(state)}
    return subprocess.run(
        ["bash", "study/pause.sh", action], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )


def record(state: Path, pgid: int, start: int, session: int) -> None:
    (state / "study.pgid").write_text(f"{pgid}\n")
    (state / "study.proof").write_text(f"{pgid} {start} {session}\n")


NEW_GROUP = "import os; os.setpgid(0, 0); os.execvp('bash', ['bash', 'study/pause.sh', 'stop'])"


def selfish(state: Path, then: str) -> dict:
    """A session leader that records itself as the study (its cmdline names run.sh), then runs ``then``."""
    script = (
        f'echo $$ > {state}/study.pgid; echo "$$ $(sed "s/.*) //" /proc/$$/stat | cut -d" " -f20) $$"'
        f" > {state}/study.proof; {then}"
    )
    try:
        done = subprocess.run(
            ["bash", "-c", script, "study/run.sh"],
            cwd=ROOT,
            env={**os.environ, "STUDY_STATE": str(state)},
            capture_output=True,
            text=True,
            timeout=20,
            start_new_session=True,
        )
    except subprocess.TimeoutExpired:  # it stopped its own caller (killed by run)
        return {"rc": None, "err": "timed out: pause.sh stopped its caller"}
    return {"rc": done.returncode, "err": done.stderr}


def settle(pid: int, stopped: bool, timeout: float = 5) -> bool:
    deadline = time.monotonic() + timeout
    while (proc_identity.state(pid) == "T") != stopped and time.monotonic() < deadline:
        time.sleep(0.02)
    return proc_identity.state(pid) == "T"


def main(state: Path) -> dict:
    assert os.getpid() == 1, "not the first process of a PID-namespace sandbox: refusing to act"
    os.setpgid(0, 0)
    canary = subprocess.Popen(["sleep", "300"])
    study = subprocess.Popen(["bash", "-c", "sleep 300; :", "study/run.sh"], start_new_session=True)
    impostor = subprocess.Popen(["sleep", "301"], start_new_session=True)  # a session leader, not run.sh
    time.sleep(0.3)
    facts: dict = {}
    try:
        start = proc_identity.start_time(study.pid)
        record(state, study.pid, start + 1, study.pid)  # stale: a reused pid started at another time
        done = pause(state, "stop")
        facts["stale"] = {"rc": done.returncode, "err": done.stderr, "stopped": settle(study.pid, True)}
        # a caller whose own group and session the record names: it records itself, then becomes pause.sh
        facts["own"] = selfish(state, "exec bash study/pause.sh stop")
        facts["own"]["canary_stopped"] = settle(canary.pid, True)
        # the same record, pause.sh run from a group of its own in that session (the leader stays)
        facts["own_session"] = selfish(state, f"{sys.executable} -c {shlex.quote(NEW_GROUP)}; exit $?")
        record(state, 4000, start, 4000)  # a leader gone (no pid 4000 in this sandbox)
        done = pause(state, "stop")
        facts["gone"] = {"rc": done.returncode, "err": done.stderr}
        record(state, study.pid, start, impostor.pid)  # the study's pid and start, another session
        done = pause(state, "stop")
        facts["other_session"] = {"rc": done.returncode, "err": done.stderr, "stopped": settle(study.pid, True, 1)}
        record(state, impostor.pid, proc_identity.start_time(impostor.pid), impostor.pid)  # proven, but not run.sh
        done = pause(state, "stop")
        facts["not_run_sh"] = {"rc": done.returncode, "err": done.stderr, "stopped": settle(impostor.pid, True, 1)}
        record(state, study.pid, start, study.pid)  # genuine
        done = pause(state, "stop")
        facts["genuine_stop"] = {"rc": done.returncode, "err": done.stderr, "stopped": settle(study.pid, True)}
        done = pause(state, "cont")
        facts["genuine_cont"] = {"rc": done.returncode, "err": done.stderr, "stopped": settle(study.pid, False)}
        facts["canary_alive"] = canary.poll() is None and proc_identity.state(canary.pid) != "T"
        return facts
    finally:
        for proc in (canary, study, impostor):
            proc.kill()


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]))))
