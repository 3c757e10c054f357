"""A throw-away multi-node Slurm + Open MPI cluster on one Linux machine, out of namespaces (root only).

Each node is a network namespace with one veth on a private bridge (the only addresses ever used
are on the bridge's own subnet, which this module picks unused), a UTS namespace (its own
hostname), and a mount namespace with a tmpfs on /tmp and /dev/shm (node-local, as on compute
nodes; everything else, the project and the results, is the shared file system) and an /etc/hosts
naming the nodes. A ``sleep`` started with ``nsenter --net=/var/run/netns/NODE unshare -u -m
--propagation private`` holds a node's namespaces; its slurmd and any command run "on" the node
enter them with ``nsenter -t HOLDER -n -u -m`` (not ``ip netns exec``, which remounts /sys and
leaves slurmd without its cgroup mount). One slurmctld and one munged run in the root namespace;
the controller is ``SlurmctldHost=<this host>(<bridge address>)``; every node daemon has its own
spool, pid and log file (``%n``). ``rsh`` in the cluster folder runs a command on a named node,
which is what Open MPI's ``mpirun --mca plm_rsh_agent`` needs to start its daemons there.

Everything made is recorded in ``cluster.json`` in the cluster folder, and ``down`` removes it all:
the processes inside the nodes' namespaces and the daemons (by pid), the namespaces, the veths
and the bridge. Nothing outside the folder, the namespaces and the bridge is touched.

    sudo python jobs/netns_cluster.py up 2 [FOLDER]   # prints the environment to export
    sudo python jobs/netns_cluster.py down [FOLDER]
    sudo python jobs/netns_cluster.py exec node1 hostname [FOLDER given by $MPICD_NETNS]

The default FOLDER is /var/tmp/mpicd-netns (it must not be under /tmp, which is node-local).
"""

from __future__ import annotations

import ipaddress
import json
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

DEFAULT_FOLDER = Path("/var/tmp/mpicd-netns")
SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin", "/usr/bin", "/bin"])
BINARIES = ("ip", "nsenter", "unshare", "munged", "slurmctld", "slurmd", "sinfo", "sbatch", "srun", "mpirun")
CANDIDATE_SUBNETS = [f"10.{a}.{b}.0/24" for a in (213, 217, 229) for b in range(7, 250, 11)]

SLURM_CONF = """\
ClusterName=mpicdnetns
FirstJobId={first_job}
SlurmctldHost={controller}({bridge_address})
SlurmUser={user}
SlurmdUser={user}
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket},cred_expire=15
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd-%n.log
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
SlurmdTimeout=20
KillWait=5
MinJobAge=5
SchedulerParameters=sched_interval=2,bf_interval=1
InactiveLimit=0
MailProg=/bin/true
{nodes}
PartitionName=test Nodes={node_list} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
"""

RSH = """\
#!/bin/sh
# Open MPI's plm_rsh_agent for the namespace cluster in {root}: `rsh NODE COMMAND...` runs COMMAND
# (joined into one shell command, as ssh does) inside NODE's network, UTS and mount namespaces.
node=$1; shift
case "$node" in
{cases}
  *) echo "rsh: no node $node in {root}" >&2; exit 255 ;;
esac
exec nsenter -F -t "$pid" -n -u -m -- /bin/sh -c "$*"
"""


def missing_binaries() -> list[str]:
    return [name for name in BINARIES if shutil.which(name, path=SEARCH_PATH) is None]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, env={"PATH": SEARCH_PATH})
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done


def unused_subnet() -> str:
    """The first candidate /24 that overlaps no address or route of this (root) namespace."""
    used = []
    for args in (("-4", "-o", "addr", "show"), ("-4", "route", "show", "table", "all")):
        for line in _ip(*args).stdout.splitlines():
            for word in line.split():
                try:
                    used.append(ipaddress.ip_network(word, strict=False))
                except ValueError:
                    continue
    for candidate in CANDIDATE_SUBNETS:
        net = ipaddress.ip_network(candidate)
        if not any(net.overlaps(u) for u in used if u.prefixlen > 0):
            return candidate
    raise RuntimeError("no unused private /24 among the candidates")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie of ours counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][0] != "Z"
    except OSError:
        return False


def _ns(pid: int, kind: str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/{kind}")
    except OSError:
        return None


class NetnsCluster:
    """``nodes`` nodes named node1..nodeN, each declaring ``cpus`` CPUs to Slurm."""

    def __init__(self, root: Path = DEFAULT_FOLDER, nodes: int = 2, cpus: int = 4, tag: str | None = None):
        self.root = Path(root).resolve()
        if self.root == Path("/tmp") or Path("/tmp") in self.root.parents:
            raise ValueError(f"{self.root}: the cluster folder must be on the shared file system, not /tmp")
        self.cpus = cpus
        self.tag = tag or secrets.token_hex(2)
        self.names = [f"node{i + 1}" for i in range(nodes)]
        self.conf = self.root / "slurm.conf"
        self.munge_socket = self.root / "munge" / "munge.socket"
        self.rsh = self.root / "rsh"
        self.state: dict = {"tag": self.tag, "links": [], "netns": [], "holders": {}, "daemons": {}}
        self._procs: dict[str, subprocess.Popen] = {}

    # ---- what a user or a test needs
    @property
    def subnet(self) -> str:
        return self.state["subnet"]

    @property
    def bridge_address(self) -> str:
        return self.state["bridge_address"]

    def address(self, node: str) -> str:
        return self.state["addresses"][node]

    @property
    def env(self) -> dict:
        """Client commands (sinfo, sbatch) find this cluster; Open MPI keeps to the bridge."""
        return {
            **os.environ,
            "SLURM_CONF": str(self.conf),
            "PATH": SEARCH_PATH,
            "OMPI_MCA_btl": "tcp,self,vader",
            "OMPI_MCA_btl_tcp_if_include": self.subnet,
            "OMPI_MCA_oob_tcp_if_include": self.subnet,
            "OMPI_MCA_plm_rsh_agent": str(self.rsh),
            # Open MPI 4.1 over TCP: osc/rdma needs an RDMA network and osc/pt2pt refuses
            # MPI_THREAD_MULTIPLE (mpi4py's default), so a window spanning nodes (mpicd pack's run
            # counter) fails with MPI_ERR_WIN unless osc/ucx may be chosen.
            "OMPI_MCA_osc": "sm,ucx",  # sm: windows within a node (nodeshare)
        }

    def on(self, node: str, *command: str, cwd: Path | str | None = None) -> list[str]:
        """The command line that runs ``command`` inside ``node``'s namespaces, in ``cwd`` (default:
        the current folder; entering a mount namespace would otherwise leave it at /)."""
        holder = str(self.state["holders"][node])
        return ["nsenter", "-F", "-t", holder, "-n", "-u", "-m", f"--wd={cwd or os.getcwd()}", "--", *command]

    def hostfile(self, slots: dict[str, int]) -> Path:
        """An Open MPI hostfile giving each named node its slots, in order (written into the folder)."""
        path = self.root / ("hosts-" + "-".join(f"{n}x{s}" for n, s in slots.items()))
        path.write_text("".join(f"{node} slots={count}\n" for node, count in slots.items()))
        return path

    def processes(self, node: str) -> list[int]:
        """Pids inside ``node``'s mount namespace other than its holder and slurmd."""
        holder = self.state["holders"][node]
        ns = _ns(holder, "mnt")
        skip = {holder, self.state["daemons"].get(f"slurmd-{node}")}
        found = []
        for proc in Path("/proc").iterdir():
            if (
                proc.name.isdigit()
                and int(proc.name) not in skip
                and ns is not None
                and _ns(int(proc.name), "mnt") == ns
            ):
                if _alive(int(proc.name)):
                    found.append(int(proc.name))
        return found

    def link(self, node: str, up: bool) -> None:
        """Take ``node``'s link to the bridge down (a lost node) or bring it back."""
        _ip("link", "set", self.state["veths"][node], "up" if up else "down")

    def run(self, *command: str, timeout: float = 30, **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(command, env=self.env, capture_output=True, text=True, timeout=timeout, **kwargs)

    def logs(self) -> str:
        parts = []
        for path in sorted(self.root.glob("*.log")) + sorted(self.root.glob("*.stderr")):
            text = path.read_text(errors="replace").splitlines()[-30:]
            parts.append(f"--- {path.name}\n" + "\n".join(text))
        return "\n".join(parts)

    # ---- up and down
    def up(self, timeout: float = 60) -> "NetnsCluster":
        if os.getuid() != 0:
            raise RuntimeError("network namespaces need root")
        if (self.root / "cluster.json").exists():
            raise RuntimeError(f"{self.root} already holds a cluster: run `down` first")
        try:
            self._network()
            self._files()
            self._daemons(timeout)
        except BaseException:
            self.down()
            raise
        return self

    def _save(self) -> None:
        (self.root / "cluster.json").write_text(json.dumps(self.state, indent=1))

    def _network(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        subnet = ipaddress.ip_network(unused_subnet())
        hosts = list(subnet.hosts())
        self.state.update(subnet=str(subnet), bridge_address=str(hosts[0]), addresses={}, veths={})
        self._save()
        bridge = f"mcd{self.tag}br"
        _ip("link", "add", bridge, "type", "bridge")
        self.state["links"].append(bridge)
        self._save()
        _ip("addr", "add", f"{hosts[0]}/{subnet.prefixlen}", "dev", bridge)
        _ip("link", "set", bridge, "up")
        for i, node in enumerate(self.names):
            netns, veth, peer = f"mpicd-{self.tag}-{node}", f"mcd{self.tag}v{i + 1}", f"mcd{self.tag}p{i + 1}"
            _ip("netns", "add", netns)
            self.state["netns"].append(netns)
            self._save()
            _ip("link", "add", veth, "type", "veth", "peer", "name", peer)
            self.state["links"].append(veth)
            self._save()
            _ip("link", "set", peer, "netns", netns)
            _ip("-n", netns, "link", "set", peer, "name", "eth0")
            address = str(hosts[10 + i])
            _ip("-n", netns, "addr", "add", f"{address}/{subnet.prefixlen}", "dev", "eth0")
            _ip("-n", netns, "link", "set", "eth0", "up")
            _ip("-n", netns, "link", "set", "lo", "up")
            _ip("link", "set", veth, "master", bridge, "up")
            self.state["addresses"][node], self.state["veths"][node] = address, veth
            self._save()

    def _files(self) -> None:
        for sub in ("munge", "state", *(f"spool/{n}" for n in self.names)):
            (self.root / sub).mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(self.root / "munge", 0o700)
        key = self.root / "munge" / "munge.key"
        if not key.exists():
            key.write_bytes(secrets.token_bytes(1024))
        os.chmod(key, 0o400)
        controller = socket.gethostname().split(".")[0]
        (self.root / "hosts").write_text(
            "127.0.0.1 localhost\n"
            + f"{self.bridge_address} {controller}\n"
            + "".join(f"{self.address(n)} {n}\n" for n in self.names)
        )
        self.conf.write_text(
            SLURM_CONF.format(
                controller=controller,
                first_job=10000 + secrets.randbelow(80000),  # not the ids of another test Slurm
                bridge_address=self.bridge_address,
                user=pwd.getpwuid(os.getuid()).pw_name,
                ctld_port=_free_port(),
                slurmd_port=_free_port(),
                munge_socket=self.munge_socket,
                root=self.root,
                nodes="\n".join(
                    f"NodeName={n} NodeAddr={self.address(n)} CPUs={self.cpus} State=UNKNOWN" for n in self.names
                ),
                node_list=",".join(self.names),
            )
        )
        cases = "\n".join(f"  {n}) pid=$(cat {self.root}/{n}.holder) ;;" for n in self.names)
        self.rsh.write_text(RSH.format(root=self.root, cases=cases))
        self.rsh.chmod(0o755)

    def _spawn(self, name: str, command: list[str]) -> int:
        with open(self.root / f"{name}.stderr", "wb") as err:
            proc = subprocess.Popen(
                command,
                env={**self.env, "PATH": SEARCH_PATH},
                stdin=subprocess.DEVNULL,
                stdout=err,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._procs[name] = proc
        return proc.pid

    def _daemons(self, timeout: float) -> None:
        for node in self.names:
            script = (
                f"hostname {node} && mount -t tmpfs -o mode=1777 tmpfs /tmp && mount -t tmpfs -o mode=1777 tmpfs"
                f" /dev/shm && mount --bind {self.root / 'hosts'} /etc/hosts && exec sleep infinity"
            )
            pid = self._spawn(
                f"holder-{node}",
                ["nsenter", f"--net=/var/run/netns/mpicd-{self.tag}-{node}", "unshare", "-u", "-m",
                 "--propagation", "private", "/bin/sh", "-c", script],
            )  # fmt: skip
            self.state["holders"][node] = pid
            self._save()
        for node in self.names:  # the holder has exec'd sleep once its namespaces are ready
            pid = self.state["holders"][node]
            self._wait(lambda pid=pid: self._comm(pid) == "sleep", timeout, f"{node}'s namespaces were not ready")
            (self.root / f"{node}.holder").write_text(str(pid))
        munge = self.root / "munge"
        self.state["daemons"]["munged"] = self._spawn(
            "munged",
            ["munged", "--foreground", "--force", f"--socket={self.munge_socket}", f"--key-file={munge / 'munge.key'}",
             f"--pid-file={munge / 'munged.pid'}", f"--log-file={munge / 'munged.log'}",
             f"--seed-file={munge / 'munged.seed'}"],
        )  # fmt: skip
        self._save()
        self._wait(self.munge_socket.exists, timeout, "munged did not create its socket")
        self.state["daemons"]["slurmctld"] = self._spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)])
        self._save()
        for node in self.names:
            self.state["daemons"][f"slurmd-{node}"] = self._spawn(
                f"slurmd-{node}", self.on(node, "slurmd", "-D", "-N", node, "-f", str(self.conf))
            )
            self._save()
        self._wait(self._idle, timeout, "the nodes did not all become idle in sinfo")

    @staticmethod
    def _comm(pid: int) -> str:
        try:
            return Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            return ""

    def _idle(self) -> bool:
        for name, proc in self._procs.items():
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with status {proc.returncode}\n{self.logs()}")
        done = self.run("sinfo", "--noheader", "--Node", "--format=%N %T", timeout=10)
        states = dict(line.split() for line in done.stdout.splitlines() if line.strip())
        return done.returncode == 0 and all(states.get(n) == "idle" for n in self.names)

    def wait_idle(self, timeout: float = 60) -> None:
        """Until every node is idle again (after a job, a lost node or a link brought back)."""
        self._wait(self._idle, timeout, "the nodes did not all become idle again")

    def _wait(self, ready, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} within {timeout} s\n{self.logs()}")
            time.sleep(0.25)

    def down(self, timeout: float = 20) -> list[str]:
        """Remove everything ``cluster.json`` records; the list of what could not be removed."""
        state_file = self.root / "cluster.json"
        if state_file.exists():
            self.state = json.loads(state_file.read_text())
        problems = []
        holders = self.state.get("holders", {})
        for node, holder in holders.items():  # every process inside a node (job steps, ranks) first
            if _alive(holder):
                for pid in self.processes(node):
                    _signal(pid, signal.SIGKILL)
        daemons = self.state.get("daemons", {})
        order = [k for k in daemons if k.startswith("slurmd-")] + ["slurmctld", "munged"]
        for name in order:
            if name in daemons:
                self._stop(daemons[name], timeout)
        for holder in holders.values():
            self._stop(holder, timeout)
        for netns in self.state.get("netns", []):
            if _ip("netns", "del", netns, check=False).returncode != 0 and Path(f"/var/run/netns/{netns}").exists():
                problems.append(f"netns {netns}")
        for link in reversed(self.state.get("links", [])):  # a veth goes (asynchronously) with its namespace's end
            for _ in range(50):
                if _ip("link", "show", link, check=False).returncode != 0:
                    break
                _ip("link", "del", link, check=False)
                time.sleep(0.1)
            else:
                problems.append(f"link {link}")
        state_file.unlink(missing_ok=True)
        return problems

    def _stop(self, pid: int, timeout: float) -> None:
        proc = next((p for p in self._procs.values() if p.pid == pid), None)
        _signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while _alive(pid) and time.monotonic() < deadline:
            if proc is not None:
                proc.poll()
            time.sleep(0.1)
        if _alive(pid):
            _signal(pid, signal.SIGKILL)
        if proc is not None:
            proc.wait(timeout)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def main(argv: list[str]) -> int:
    usage = "usage: netns_cluster.py up [NODES] [FOLDER] | down [FOLDER] | exec NODE COMMAND..."
    if not argv:
        print(usage, file=sys.stderr)
        return 2
    if argv[0] == "up":
        nodes = int(argv[1]) if len(argv) > 1 else 2
        folder = Path(argv[2]) if len(argv) > 2 else DEFAULT_FOLDER
        missing = missing_binaries()
        if missing:
            print(f"netns_cluster: missing {', '.join(missing)} (bash jobs/setup.sh installs Slurm)", file=sys.stderr)
            return 2
        cluster = NetnsCluster(folder, nodes).up()
        # the daemons run in their own sessions: they outlive this command until `down`
        print(
            f"# {nodes} nodes ({', '.join(cluster.names)}) on {cluster.subnet}; stop with: {sys.argv[0]} down {folder}"
        )
        for key in ("SLURM_CONF", "OMPI_MCA_btl", "OMPI_MCA_btl_tcp_if_include", "OMPI_MCA_oob_tcp_if_include",
                    "OMPI_MCA_plm_rsh_agent", "OMPI_MCA_osc"):  # fmt: skip
            print(f"export {key}={cluster.env[key]}")
        print(f"export MPICD_NETNS={folder}")
        return 0
    if argv[0] == "down":
        problems = NetnsCluster(Path(argv[1]) if len(argv) > 1 else DEFAULT_FOLDER).down()
        for p in problems:
            print(f"netns_cluster: could not remove {p}", file=sys.stderr)
        return 1 if problems else 0
    if argv[0] == "exec" and len(argv) >= 3:
        cluster = NetnsCluster(Path(os.environ.get("MPICD_NETNS", DEFAULT_FOLDER)))
        cluster.state = json.loads((cluster.root / "cluster.json").read_text())
        os.execvp("nsenter", cluster.on(argv[1], *argv[2:]))
    print(usage, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
