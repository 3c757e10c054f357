"""A throw-away single-node Slurm for the tests: munged, slurmd and slurmctld in a temporary folder.

Uses Debian's ``slurmctld slurmd slurm-client munge`` (jobs/setup.sh installs them) and writes
nothing outside its folder: its own slurm.conf (SLURM_CONF), munge key and socket, spool, state,
pid and log files, and free TCP ports, so it neither needs nor touches /etc/slurm or a site's
daemons. The daemons run in the foreground as our children, so stopping them is by pid.

    python tests/support/slurm_cluster.py FOLDER     # start one by hand; prints the SLURM_CONF to export
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

BINARIES = ("munged", "slurmctld", "slurmd", "sinfo", "sbatch", "srun", "scancel", "squeue", "scontrol")
SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin", "/usr/bin"])


def missing_binaries() -> list[str]:
    return [name for name in BINARIES if shutil.which(name, path=SEARCH_PATH) is None]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SLURM_CONF = """\
ClusterName=mpicdtest
SlurmctldHost=localhost(127.0.0.1)
SlurmUser={user}
SlurmdUser={user}
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket},cred_expire=15
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=5
MinJobAge=5
SchedulerParameters=sched_interval=2,bf_interval=1
InactiveLimit=0
MailProg=/bin/true
NodeName=localhost NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName=test Nodes=localhost Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
"""


class SlurmCluster:
    """One controller, one node (``localhost``, ``cpus`` CPUs declared whatever the hardware has)."""

    def __init__(self, root: Path, cpus: int = 16):
        self.root = Path(root)
        self.cpus = cpus
        self.conf = self.root / "slurm.conf"
        self.munge_socket = self.root / "munge" / "munge.socket"
        self.daemons: dict[str, subprocess.Popen] = {}

    @property
    def env(self) -> dict:
        """What a client command (sinfo, sbatch, srun inside a job) needs to find this cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf), "PATH": SEARCH_PATH}

    def run(self, *command: str, timeout: float = 30, env: dict | None = None, **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(command, env=env or self.env, capture_output=True, text=True, timeout=timeout, **kwargs)

    def start(self, timeout: float = 60) -> "SlurmCluster":
        try:
            self._write_files()
            self._spawn(
                "munged",
                "munged",
                "--foreground",
                "--force",
                f"--socket={self.munge_socket}",
                f"--key-file={self.root / 'munge' / 'munge.key'}",
                f"--pid-file={self.root / 'munge' / 'munged.pid'}",
                f"--log-file={self.root / 'munge' / 'munged.log'}",
                f"--seed-file={self.root / 'munge' / 'munged.seed'}",
            )
            self._wait(lambda: self.munge_socket.exists(), timeout, "munged did not create its socket")
            self._spawn("slurmctld", "slurmctld", "-D", "-i", "-f", str(self.conf))
            self._spawn("slurmd", "slurmd", "-D", "-N", "localhost", "-f", str(self.conf))
            self._wait(self._node_idle, timeout, "the node did not become idle in sinfo")
        except BaseException:
            self.stop()
            raise
        return self

    def jobs(self) -> list[str]:
        """The ids of the jobs this cluster still holds (pending, running or completing)."""
        done = self.run("squeue", "--noheader", "--format=%i", timeout=15)
        return done.stdout.split() if done.returncode == 0 else []

    def cancel_all(self, timeout: float = 30) -> list[str]:
        """scancel every job of this cluster and wait until squeue lists none; the ids still there."""
        left = self.jobs()
        if left:
            self.run("scancel", *left, timeout=15)
            deadline = time.monotonic() + timeout
            while (left := self.jobs()) and time.monotonic() < deadline:
                time.sleep(0.5)
        return left

    def stop(self, timeout: float = 30) -> None:
        """Cancel every job (a failed test's job must not outlive its cluster), then SIGTERM each
        daemon we started (node, controller, munge) and wait for it; SIGKILL if it lingers."""
        if self.daemons.get("slurmctld") is not None and self.daemons["slurmctld"].poll() is None:
            try:
                self.cancel_all(timeout)
            except subprocess.TimeoutExpired:
                pass
        for name in ("slurmd", "slurmctld", "munged"):
            proc = self.daemons.pop(name, None)
            if proc is None or proc.poll() is not None:
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout)

    def logs(self) -> str:
        """The tail of every daemon log, for a failure message."""
        parts = []
        for path in (
            self.root / "munge" / "munged.log",
            self.root / "slurmctld.log",
            self.root / "slurmd.log",
            *sorted(self.root.glob("*.stderr")),
        ):
            if path.is_file():
                parts.append(f"--- {path.name}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-40:]))
        return "\n".join(parts)

    def _write_files(self) -> None:
        for sub in ("munge", "state", "spool"):
            (self.root / sub).mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(self.root / "munge", 0o700)
        key = self.root / "munge" / "munge.key"
        if not key.exists():
            key.write_bytes(secrets.token_bytes(1024))
        os.chmod(key, 0o400)
        if len(str(self.munge_socket)) > 100:
            raise RuntimeError(f"munge socket path too long for a UNIX socket: {self.munge_socket}")
        import pwd

        self.conf.write_text(
            SLURM_CONF.format(
                user=pwd.getpwuid(os.getuid()).pw_name,
                ctld_port=_free_port(),
                slurmd_port=_free_port(),
                munge_socket=self.munge_socket,
                root=self.root,
                cpus=self.cpus,
            )
        )

    def _spawn(self, name: str, *command: str) -> None:
        with open(self.root / f"{name}.stderr", "wb") as err:
            self.daemons[name] = subprocess.Popen(
                command,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=err,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def _node_idle(self) -> bool:
        for name, proc in self.daemons.items():
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with status {proc.returncode}")
        result = self.run("sinfo", "--noheader", "--nodes=localhost", "--format=%T", timeout=10)
        return result.returncode == 0 and result.stdout.split() == ["idle"]

    def _wait(self, ready, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} within {timeout} s\n{self.logs()}")
            time.sleep(0.25)


if __name__ == "__main__":

    def _exit(signum, frame):
        raise SystemExit(0)

    for stop_signal in (signal.SIGINT, signal.SIGTERM):
        signal.signal(stop_signal, _exit)
    cluster = SlurmCluster(Path(sys.argv[1]).resolve()).start()
    print(f"export SLURM_CONF={cluster.conf}   # Ctrl-C or SIGTERM stops the cluster", flush=True)
    try:
        signal.pause()
    finally:
        cluster.stop()
