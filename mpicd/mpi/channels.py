"""Every purpose bytes cross MPI for, declared once: the channels of :class:`mpicd.mpi.comm.Comm`.

Each transfer names its channel (``channel=`` on every :class:`~mpicd.mpi.comm.Comm` call); the comm
layer refuses a channel not declared here, and a dtype or MPI operation the channel does not
declare, before anything is sent, and counts every channel's bytes (the results file's
``/comm/channel_bytes``, checked by ``mpicd verify``). Two classes:

* **protocol** -- what a deployment's sites would send each other. ``payload``: the algorithm's
  declared release (its ``payloads``; the only protocol channel that carries data, private when
  privacy is on: the accountant covers it). ``control``: agreements on facts every site knows
  anyway (buffer sizes and dtypes, which rank failed, which checkpoint round is common, a stop
  request): no value of a record, a model or a metric.
* **instrumentation** -- what only the experimenter's results file and console need: metrics,
  timings, placement. ``reach: writer``: only rank 0, the writer, receives them (every other rank
  only sends); ``reach: all``: every rank receives them, because every rank must pass the same
  value to a collective HDF5 metadata call. docs/explanation/what-leaves-a-rank.md names each one as the
  experimenter's channel, which a deployment would not have.

The algorithm's payload channel is declared here with every dtype and operation an algorithm may
use; a run narrows it to its algorithm's own (:func:`payload_channel`), so a buffer of another
dtype or operation on it is refused.
"""

from __future__ import annotations

from dataclasses import dataclass

PROTOCOL, INSTRUMENTATION = "protocol", "instrumentation"


@dataclass(frozen=True)
class Channel:
    """One purpose of MPI traffic: its class, who receives it, and what it may carry."""

    name: str
    role: str  # "payload" | "control" | "instrumentation"
    dtypes: tuple[str, ...]
    operations: tuple[str, ...]  # mpicd.mpi.accounting.KINDS, plus "gather" (to the writer)
    reach: str  # "peers" (protocol), "writer" or "all" (instrumentation)
    what: str

    @property
    def cls(self) -> str:
        return INSTRUMENTATION if self.role == "instrumentation" else PROTOCOL


_ALL_OPS = ("p2p", "allreduce", "allgather", "bcast")

CHANNELS: dict[str, Channel] = {
    c.name: c
    for c in (
        Channel("payload", "payload", ("float32", "float64", "int64"), _ALL_OPS, "peers",
                "the algorithm's declared release each round (its payloads; the payload table)"),
        Channel("layout", "control", ("int64",), ("allgather",), "peers",
                "before every collective, each rank's buffer size and dtype code, so a mismatch is named "
                "instead of MPI reading past a buffer"),
        Channel("failure", "control", ("int64",), ("allreduce",), "peers",
                "the lowest rank that failed a step (start-up checks, the results file's creation), so "
                "every rank stops together"),
        Channel("start", "control", ("int64",), ("allreduce", "bcast"), "peers",
                "where the run starts: the newest checkpoint round every rank holds, whether every "
                "state loaded and matches the config, the start decision's flags, how many private "
                "releases the clients journaled"),
        Channel("stop", "control", ("int64",), ("allreduce",), "peers",
                "each round, whether any rank was asked to stop (a signal), and at the end that every "
                "rank removed its checkpoints"),
        Channel("slots", "control", ("int64",), ("allgather",), "peers",
                "how many clients each rank holds (the public layout), so the writer's gathers line up"),
        Channel("sweep", "control", ("int64",), ("bcast", "allreduce", "p2p"), "peers",
                "mpicd pack's packing of runs onto rank groups: the pending run numbers, each group's "
                "next run (a one-sided fetch-and-add on rank 0's counter, counted as p2p), the failed and "
                "stopped runs' counts"),
        Channel("dataset", "instrumentation", ("int64", "uint8"), ("bcast",), "all",
                "the simulation's shared loading: one rank per node reads the dataset and sends its "
                "description (JSON) to the node's other ranks; a deployment's sites read their own"),
        Channel("launch", "instrumentation", ("float64", "int64"), ("bcast", "allreduce"), "all",
                "rank 0's start-up seconds per phase, for the root attribute startup_seconds; as mpicd run or "
                "pack ends under jobs/mpirun.sh or slurm/launch.sh, every rank's exit status and whether it runs "
                "on the wrapper's host, and whether the status reached the wrapper (mpicd.mpi.ending)"),
        Channel("rows", "instrumentation", ("float64",), ("gather",), "writer",
                "every rank's results rows (metrics, losses, timings, bytes) at each flush, and its bytes "
                "outside rounds at the end, to the writer"),
        Channel("placement", "instrumentation", ("int64",), ("gather",), "writer",
                "every rank's host, device, CPU model, local rank and threads, to the writer"),
        Channel("progress", "instrumentation", ("float64",), ("gather",), "writer",
                "each round's progress line: every rank's minority accuracy, bytes and seconds, to rank 0"),
        Channel("single_class", "instrumentation", ("int64",), ("allreduce",), "all",
                "after the last round, which clients predicted a single class (the attribute "
                "single_class_clients, written collectively)"),
        Channel("diagnostics", "instrumentation", ("float32",), ("p2p",), "peers",
                "eval.diagnostics: a teacher's eval-mode features of 64 probe images, to its students, "
                "for linear CKA; refused with privacy (raw representations of a non-private model)"),
    )
}  # fmt: skip


def payload_channel(algorithm, params) -> Channel:
    """The payload channel narrowed to what ``algorithm`` declares under ``params``: the operations
    of its payloads and their dtypes, the last round's included (none: an algorithm that sends
    nothing may not use it)."""
    payloads = algorithm.payloads_for(params, last=True) if algorithm.payloads else []
    if not payloads:
        return Channel("payload", "payload", (), (), "peers", f"{algorithm.name} sends nothing")
    dtypes = tuple(dict.fromkeys(d for p in payloads for d in p.dtypes))
    kinds = tuple(dict.fromkeys(p.kind for p in payloads))
    return Channel("payload", "payload", dtypes, kinds, "peers", "; ".join(p.what for p in payloads))


def table() -> str:
    """The channel table of docs/explanation/what-leaves-a-rank.md: every channel but the payload (whose
    rows are the payload table's)."""
    lines = [
        "| channel | class | reaches | dtypes | MPI operations | what it carries |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for c in CHANNELS.values():
        if c.role == "payload":
            continue
        kind = f"{c.cls} ({c.role})" if c.role == "control" else c.cls
        reach = {"peers": "every rank", "all": "every rank", "writer": "rank 0 (the writer) only"}[c.reach]
        if c.name == "diagnostics":
            reach = "the teacher's students"
        if c.name == "dataset":
            reach = "the ranks of one node"
        lines.append(
            f"| `{c.name}` | {kind} | {reach} | {', '.join(c.dtypes)} | {', '.join(c.operations)} | {c.what} |"
        )
    return "\n".join(lines)
