"""Who a pid is, so that a recorded pid is signalled only while it is still the process recorded.

A pid alone names nobody for long: pids wrap (32768 here), and a state file outlives the processes it
lists (``/var/tmp`` survives a reboot). A process is identified by its pid, its start time (field 22 of
``/proc/PID/stat``, clock ticks since boot: it never changes, and two processes with the same pid
cannot share it within one boot) and its command line. :func:`record` takes that identity;
:func:`still` says whether a pid still carries it; :func:`never_signal` names the processes that are
never signalled whatever a record says: the caller itself, its ancestors, and every process in the
caller's or pid 1's mount namespace when the signal is meant for something a tool made in a
namespace of its own.
"""

from __future__ import annotations

import os
import signal


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (which may hold spaces and parentheses)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def start_time(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat, or None when there is no such process."""
    fields = _stat(pid)
    return int(fields[19]) if fields else None  # fields[0] is field 3 (the state)


def state(pid: int) -> str | None:
    """The one-letter state (R, S, T, Z...), or None."""
    fields = _stat(pid)
    return fields[0] if fields else None


def parent(pid: int) -> int | None:
    fields = _stat(pid)
    return int(fields[1]) if fields else None


def cmdline(pid: int) -> list[str] | None:
    """The command line as a list, or None (no such process, or a kernel thread's empty one)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            raw = fh.read()
    except OSError:
        return None
    return [part.decode(errors="surrogateescape") for part in raw.split(b"\0")[:-1]] or None


def namespace(pid: int, kind: str = "mnt") -> str | None:
    """``mnt:[4026531841]`` and the like, or None."""
    try:
        return os.readlink(f"/proc/{pid}/ns/{kind}")
    except OSError:
        return None


def alive(pid: int) -> bool:
    """Running or stopped, not a zombie and not gone."""
    return state(pid) not in (None, "Z")


def record(pid: int) -> dict:
    """The identity to store: {"pid", "start", "cmdline"} (start and cmdline None if it is gone)."""
    return {"pid": pid, "start": start_time(pid), "cmdline": cmdline(pid)}


def still(entry: dict) -> bool:
    """Whether ``entry`` (from :func:`record`) still names the same, living process."""
    pid = entry.get("pid")
    if not isinstance(pid, int) or pid <= 1 or entry.get("start") is None:
        return False
    return alive(pid) and start_time(pid) == entry["start"] and cmdline(pid) == entry.get("cmdline")


def ancestors(pid: int | None = None) -> set[int]:
    """``pid`` (default: this process) and every process above it, pid 1 included."""
    found, pid = set(), os.getpid() if pid is None else pid
    while pid and pid not in found:
        found.add(pid)
        pid = parent(pid)
    return found | {1}


def never_signal(pid: int, foreign_namespace: bool = True) -> str | None:
    """Why ``pid`` must not be signalled, or None. Always refused: pid 1 and below, the caller and
    its ancestors. With ``foreign_namespace`` (the default: the target is one a tool made in a mount
    namespace of its own), also any process in the caller's or pid 1's mount namespace."""
    if pid <= 1:
        return f"pid {pid} is init or invalid"
    if pid in ancestors():
        return f"pid {pid} is this process or one of its ancestors"
    if foreign_namespace:
        ns = namespace(pid)
        if ns is None:
            return None  # gone: nothing to signal
        if ns in (namespace(os.getpid()), namespace(1)):
            return f"pid {pid} shares the mount namespace of this process or of pid 1 ({ns})"
    return None


def signal_if_still(entry: dict, sig: int = signal.SIGKILL, foreign_namespace: bool = True) -> str:
    """Send ``sig`` to the recorded process if it still is that process and may be signalled.
    Returns "signalled", "gone", or why it was skipped ("stale: ..." or "refused: ...")."""
    pid = entry.get("pid")
    if not isinstance(pid, int) or not alive(pid):
        return "gone"
    if not still(entry):
        return (
            f"stale: pid {pid} is now {' '.join(cmdline(pid) or ['?'])!r} started at {start_time(pid)},"
            f" not the recorded {' '.join(entry.get('cmdline') or ['?'])!r} started at {entry.get('start')}"
        )
    try:  # a pidfd pins the process: checked after it is open, a pid reused since cannot be hit
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return "gone"
    try:
        if not still(entry):
            return "gone"
        why = never_signal(pid, foreign_namespace)
        if why:
            return f"refused: {why}"
        try:
            signal.pidfd_send_signal(fd, sig)
        except ProcessLookupError:
            return "gone"
    finally:
        os.close(fd)
    return "signalled"
