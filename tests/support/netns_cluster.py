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

Everything made is recorded in ``cluster.json`` in the cluster folder (root's, mode 0700), and
``down`` removes it all: the processes inside the nodes' namespaces and the daemons, the namespaces,
the veths and the bridge. Nothing outside the folder, the namespaces and the bridge is touched.

``down`` acts only on what it can prove this cluster made, because the file outlives what it names
(``/var/tmp`` survives a reboot; pids wrap): a recorded process is signalled only while its start
time and command line are the recorded ones and that command line is one this module launches for
its role in this folder (:mod:`proc_identity`); a holder must also sit in the network namespace
named with this cluster's tag. Every daemon and holder runs in a mount namespace of its own, so
nothing is ever signalled that shares the caller's or pid 1's mount namespace, nor the caller or
its ancestors: a stale or forged ``cluster.json`` kills nothing and ``down`` says what it skipped.
Namespaces and links are removed only when their names carry this cluster's tag.

    sudo python tests/support/netns_cluster.py up 2 [FOLDER]   # prints the environment to export
    sudo python tests/support/netns_cluster.py down [FOLDER]
    sudo python tests/support/netns_cluster.py exec node1 hostname [FOLDER given by $MPICD_NETNS]

The default FOLDER is /var/tmp/mpicd-netns (it must not be under /tmp, which is node-local).
"""

from __future__ import annotations

import ipaddress
import json
import os
import pwd
import re
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import proc_identity  # noqa: E402 - tests/support/ is not a package

DEFAULT_FOLDER = Path("/var/tmp/mpicd-netns")
SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin", "/usr/bin", "/bin"])
BINARIES = ("ip", "nsenter", "unshare", "munged", "slurmctld", "slurmd", "sinfo", "sbatch", "srun", "mpirun")
TAG = re.compile(r"^[0-9a-f]{4}$")
NODE = re.compile(r"^node[1-9][0-9]*$")
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
read -r pid start < "{root}/$node.holder"
# the holder must still be the process recorded (field 22: its start time), not a reused pid
now=$(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f20)
[ "$now" = "$start" ] || {{ echo "rsh: $node's holder (pid $pid) is gone: the cluster is down" >&2; exit 255; }}
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
        if not TAG.match(self.tag):
            raise ValueError(f"tag {self.tag!r}: four hex digits (it names the namespaces and links)")
        self.names = [f"node{i + 1}" for i in range(nodes)]
        self.conf = self.root / "slurm.conf"
        self.munge_socket = self.root / "munge" / "munge.socket"
        self.rsh = self.root / "rsh"
        self.state: dict = {
            "tag": self.tag, "links": [], "netns": [], "holders": {}, "daemons": {}, "identities": {}
        }  # fmt: skip
        self._procs: dict[str, subprocess.Popen] = {}
        self.skipped: list[str] = []  # what the last down() left alone, and why

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
        """Pids inside ``node``'s mount namespace other than its holder and slurmd; RuntimeError
        unless the holder is proven this cluster's (else its namespace could be anyone's)."""
        holder = self.state["holders"][node]
        why = self._unproven(f"holder-{node}")
        if why:
            raise RuntimeError(f"{node}'s holder (pid {holder}): {why}")
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

    # ---- what proves a recorded process is this cluster's
    def _launched(self, name: str) -> list[list[str]]:
        """Every command line the process ``name`` can show: what was launched and each program
        it execs in turn (nsenter and unshare exec what follows them; sh -c execs sleep)."""
        if name.startswith("holder-"):
            node = name.removeprefix("holder-")
            argv = self._holder_argv(node)
            return [argv, argv[2:], argv[7:], ["sleep", "infinity"]]
        if name.startswith("slurmd-"):
            node = name.removeprefix("slurmd-")
            argv = self._slurmd_argv(node)
            return [argv, argv[argv.index("--") + 1 :]]
        argv = self._munged_argv() if name == "munged" else self._slurmctld_argv() if name == "slurmctld" else None
        return [] if argv is None else [argv, argv[4:]]

    def _unproven(self, name: str) -> str | None:
        """Why the recorded process ``name`` is not provably this cluster's, or None when it is:
        alive with the recorded start time and command line, a command line this module launches
        for ``name`` in this folder, outside the caller's and pid 1's mount namespaces, and (a
        holder) inside the network namespace named with this cluster's tag."""
        entry = self.state.get("identities", {}).get(name)
        if not isinstance(entry, dict):
            return "not ours: no identity recorded"
        pid = entry.get("pid")
        if not isinstance(pid, int) or not proc_identity.alive(pid):
            return "gone"
        try:
            launched = self._launched(name)
        except (KeyError, ValueError):
            launched = []
        if entry.get("cmdline") not in launched:
            return f"not ours: the recorded command line {entry.get('cmdline')!r} is not one this cluster launches as {name}"
        now = proc_identity.cmdline(pid)
        if proc_identity.start_time(pid) != entry.get("start") or now not in launched:
            return (
                f"stale: pid {pid} is now {' '.join(now or ['?'])!r} started at {proc_identity.start_time(pid)},"
                f" not {name} started at {entry.get('start')}"
            )
        if name.startswith("holder-"):
            netns = Path(f"/var/run/netns/mpicd-{self.tag}-{name.removeprefix('holder-')}")
            try:
                inside = os.stat(f"/proc/{pid}/ns/net")
                made = os.stat(netns)
            except OSError:
                return f"not ours: its network namespace {netns} is gone"
            if (inside.st_dev, inside.st_ino) != (made.st_dev, made.st_ino):
                return f"not ours: it is not inside {netns}"
        why = proc_identity.never_signal(pid)
        return f"refused: {why}" if why else None

    def _remember(self, name: str, pid: int) -> None:
        """Record ``name``'s identity now (again once it has exec'd what it runs for good)."""
        self.state["identities"][name] = proc_identity.record(pid)
        self._save()

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
            other = NetnsCluster(self.root)
            other.state = json.loads((self.root / "cluster.json").read_text())
            other.tag = str(other.state.get("tag"))
            live = [n for n in other.state.get("identities", {}) if TAG.match(other.tag) and not other._unproven(n)]
            clear = (
                f"python {Path(__file__).resolve()} down {self.root} (it signals only processes it proves"
                " this cluster started, says what it skipped, and removes the stale file)"
            )
            if live:
                raise RuntimeError(f"{self.root} holds a running cluster ({', '.join(live)}): stop it with {clear}")
            raise RuntimeError(
                f"{self.root} holds a stale cluster.json (none of its processes is alive as recorded: an"
                f" earlier boot or session left it): clear it with {clear}"
            )
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
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(self.root, 0o700)
        why = _untrusted(self.root)
        if why:
            raise RuntimeError(why)
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
        cases = "\n".join(f"  {n}) ;;" for n in self.names)
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
        self._remember(name, proc.pid)  # Popen returns once the command is exec'd
        return proc.pid

    # the command lines launched, one place: down() proves a process by them
    def _holder_argv(self, node: str) -> list[str]:
        script = (
            f"hostname {node} && mount -t tmpfs -o mode=1777 tmpfs /tmp && mount -t tmpfs -o mode=1777 tmpfs"
            f" /dev/shm && mount --bind {self.root / 'hosts'} /etc/hosts && exec sleep infinity"
        )
        return ["nsenter", f"--net=/var/run/netns/mpicd-{self.tag}-{node}", "unshare", "-u", "-m",
                "--propagation", "private", "/bin/sh", "-c", script]  # fmt: skip

    def _slurmd_argv(self, node: str) -> list[str]:
        return self.on(node, "slurmd", "-D", "-N", node, "-f", str(self.conf), cwd=self.root)

    # the daemons of the root network namespace get a mount namespace of their own, so that no
    # process this cluster signals ever shares the caller's
    def _munged_argv(self) -> list[str]:
        munge = self.root / "munge"
        return ["unshare", "-m", "--propagation", "private",
                "munged", "--foreground", "--force", f"--socket={self.munge_socket}",
                f"--key-file={munge / 'munge.key'}", f"--pid-file={munge / 'munged.pid'}",
                f"--log-file={munge / 'munged.log'}", f"--seed-file={munge / 'munged.seed'}"]  # fmt: skip

    def _slurmctld_argv(self) -> list[str]:
        return ["unshare", "-m", "--propagation", "private", "slurmctld", "-D", "-i", "-f", str(self.conf)]

    def _daemons(self, timeout: float) -> None:
        for node in self.names:
            self.state["holders"][node] = self._spawn(f"holder-{node}", self._holder_argv(node))
            self._save()
        for node in self.names:  # the holder has exec'd sleep once its namespaces are ready
            pid = self.state["holders"][node]
            self._wait(lambda pid=pid: self._comm(pid) == "sleep", timeout, f"{node}'s namespaces were not ready")
            self._remember(f"holder-{node}", pid)
            (self.root / f"{node}.holder").write_text(f"{pid} {self.state['identities'][f'holder-{node}']['start']}\n")
        self.state["daemons"]["munged"] = self._spawn("munged", self._munged_argv())
        self._save()
        self._wait(self.munge_socket.exists, timeout, "munged did not create its socket")
        self.state["daemons"]["slurmctld"] = self._spawn("slurmctld", self._slurmctld_argv())
        self._save()
        for node in self.names:
            self.state["daemons"][f"slurmd-{node}"] = self._spawn(f"slurmd-{node}", self._slurmd_argv(node))
            self._save()
        self._wait(self._idle, timeout, "the nodes did not all become idle in sinfo")
        for name, pid in self.state["daemons"].items():  # each has exec'd its daemon by now
            self._remember(name, pid)

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
        """Remove everything ``cluster.json`` records that is provably this cluster's; the list of
        what could not be removed and of what was skipped as not provably its own (also in
        ``self.skipped``). The state file goes unless something could not be removed or a process that
        may be this cluster's was refused (it shares the caller's mount namespace, say)."""
        state_file = self.root / "cluster.json"
        self.skipped = []
        if state_file.exists():
            why = _untrusted(self.root, state_file)
            if why:
                return [f"skipped everything: {why}"]
            self.state = json.loads(state_file.read_text())
        tag = self.state.get("tag")
        if not isinstance(tag, str) or not TAG.match(tag):
            return [f"skipped everything: the recorded tag {tag!r} is not four hex digits"]
        self.tag = tag
        self.state.setdefault("identities", {})
        problems: list[str] = []
        refused = False

        def proven(name: str) -> bool:
            nonlocal refused
            why = self._unproven(name)
            if why and why != "gone":
                self.skipped.append(f"skipped {name} (pid {self.state['identities'].get(name, {}).get('pid')}): {why}")
                refused |= why.startswith("refused")  # perhaps ours after all: keep the record
            return why is None

        holders = {n: p for n, p in self.state.get("holders", {}).items() if NODE.match(str(n))}
        own_holders = [node for node in holders if proven(f"holder-{node}")]
        for node in own_holders:  # every process inside a node (job steps, ranks) first
            ns = _ns(holders[node], "mnt")
            try:
                inside = self.processes(node)
            except RuntimeError as err:  # the holder ended meanwhile
                self.skipped.append(f"skipped the processes inside {node}: {err}")
                inside = []
            for pid in inside:
                why = _kill_inside(pid, ns)
                if why:
                    self.skipped.append(f"skipped a process inside {node}: {why}")
        daemons = self.state.get("daemons", {})
        order = [k for k in daemons if k.startswith("slurmd-")] + ["slurmctld", "munged"]
        for name in order:
            if name in daemons and proven(name):
                self._stop(name, timeout)
        for node in own_holders:
            self._stop(f"holder-{node}", timeout)
        own_netns = re.compile(rf"^mpicd-{tag}-node[1-9][0-9]*$")
        for netns in self.state.get("netns", []):
            if not own_netns.match(str(netns)):
                self.skipped.append(f"skipped netns {netns!r}: not named with this cluster's tag {tag}")
            elif _ip("netns", "del", netns, check=False).returncode != 0 and Path(f"/var/run/netns/{netns}").exists():
                problems.append(f"netns {netns}")
        own_link = re.compile(rf"^mcd{tag}(br|v[1-9][0-9]*)$")
        for link in reversed(self.state.get("links", [])):  # a veth goes (asynchronously) with its namespace's end
            if not own_link.match(str(link)):
                self.skipped.append(f"skipped link {link!r}: not named with this cluster's tag {tag}")
                continue
            for _ in range(50):
                if _ip("link", "show", link, check=False).returncode != 0:
                    break
                _ip("link", "del", link, check=False)
                time.sleep(0.1)
            else:
                problems.append(f"link {link}")
        if not refused and not problems:
            state_file.unlink(missing_ok=True)
        return problems + self.skipped

    def _stop(self, name: str, timeout: float) -> None:
        """SIGTERM, then SIGKILL after ``timeout``, to the process ``name``, each signal only while
        it is still provably this cluster's (through a pidfd: a pid reused meanwhile is never hit)."""
        entry = self.state["identities"][name]
        proc = self._procs.get(name) if self._procs.get(name) and self._procs[name].pid == entry["pid"] else None
        if self._signal_proven(name, signal.SIGTERM):
            deadline = time.monotonic() + timeout
            while not self._unproven(name) and time.monotonic() < deadline:
                if proc is not None:
                    proc.poll()
                time.sleep(0.1)
            self._signal_proven(name, signal.SIGKILL)
        if proc is not None:
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.skipped.append(f"{name} (pid {proc.pid}) did not end")

    def _signal_proven(self, name: str, sig: int) -> bool:
        pid = self.state["identities"][name]["pid"]
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            return False
        try:
            if self._unproven(name):  # checked with the pidfd open: it names the process checked
                return False
            signal.pidfd_send_signal(fd, sig)
            return True
        except ProcessLookupError:
            return False
        finally:
            os.close(fd)


def _untrusted(folder: Path, *files: Path) -> str | None:
    """Why the cluster folder (or a state file in it) is not to be trusted, or None: it must be
    this user's (root's), a real folder, and writable by nobody else."""
    for path in (folder, *files):
        try:
            info = os.lstat(path)
        except OSError as err:
            return f"{path}: {err.strerror}"
        if stat.S_ISLNK(info.st_mode):
            return f"{path} is a symbolic link"
        if info.st_uid != os.getuid():
            return f"{path} belongs to uid {info.st_uid}, not {os.getuid()}"
        if info.st_mode & 0o022:
            return f"{path} is writable by group or others (mode {stat.S_IMODE(info.st_mode):o}): chmod 700 it"
    if stat.S_IMODE(os.lstat(folder).st_mode) & 0o077:
        return f"{folder} is open to group or others (mode {stat.S_IMODE(os.lstat(folder).st_mode):o}): chmod 700 it"
    return None


def _kill_inside(pid: int, ns: str | None) -> str | None:
    """SIGKILL ``pid`` if it is (checked through a pidfd) still inside mount namespace ``ns`` and
    may be signalled; why not, or None."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return None
    try:
        if ns is None or _ns(pid, "mnt") != ns:
            return None  # gone, or a reused pid elsewhere
        why = proc_identity.never_signal(pid)
        if why:
            return why
        signal.pidfd_send_signal(fd, signal.SIGKILL)
    except ProcessLookupError:
        pass
    finally:
        os.close(fd)
    return None


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
        try:
            cluster = NetnsCluster(folder, nodes).up()
        except RuntimeError as err:
            print(f"netns_cluster: {err}", file=sys.stderr)
            return 1
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
        cluster = NetnsCluster(Path(argv[1]) if len(argv) > 1 else DEFAULT_FOLDER)
        reported = cluster.down()
        for line in reported:
            print(
                f"netns_cluster: {line if line.startswith('skipped') else 'could not remove ' + line}", file=sys.stderr
            )
        kept = (cluster.root / "cluster.json").exists()
        if kept:
            print(f"netns_cluster: kept {cluster.root / 'cluster.json'} (something in it may still be running)")
        return 1 if kept else 0
    if argv[0] == "exec" and len(argv) >= 3:
        cluster = NetnsCluster(Path(os.environ.get("MPICD_NETNS", DEFAULT_FOLDER)))
        why = _untrusted(cluster.root, cluster.root / "cluster.json")
        if not why:
            cluster.state = json.loads((cluster.root / "cluster.json").read_text())
            cluster.tag = str(cluster.state.get("tag"))
            why = cluster._unproven(f"holder-{argv[1]}") if TAG.match(cluster.tag) else "no valid tag recorded"
        if why:
            print(f"netns_cluster: cannot run on {argv[1]}: {why}", file=sys.stderr)
            return 1
        os.execvp("nsenter", cluster.on(argv[1], *argv[2:]))
    print(usage, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
