"""Resuming a run: every rank agrees on the newest checkpoint every rank holds and reads whole, and
restores each client's state, byte ledger, key and random streams from it. Whether a run resumes at all
is :class:`mpicd.run.folder.RunFolder`'s decision."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from mpicd.privacy.budget import KeyMismatch
from mpicd.config.sections import config_difference, ConfigError
from mpicd.mpi.comm import Traffic
from mpicd.run import checkpoint, startpoint
from mpicd.run.agreement import raise_agreed
from mpicd.run.client import Client
from mpicd.run.plan import Plan


def client_state(plan: Plan, client: Client, ledger, outside: bool = True) -> dict:
    """One client's checkpoint; ``outside``: with this rank's traffic outside rounds (its first
    client's file holds it, the others none, so a resume on any layout adds up the same total)."""
    channels = {name: list(v) for name, v in ledger.channels.items()} if outside else {}
    outside = ledger.outside_rounds if outside else Traffic()
    return {
        "config": plan.resolved_config,
        "model": client.model.state_dict(),
        "optimizer": client.optimizer.state_dict(),
        "algorithm": client.algorithm.state_dict(),
        "torch_rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state_all() if client.device.type == "cuda" else None,
        "outside_rounds": (dict(outside.bytes_sent), dict(outside.bytes_recv), outside.seconds),
        "channels": channels,
        **({} if client.algorithm.ctx.privacy is None else {"privacy": client.algorithm.ctx.privacy.state_dict()}),
    }


def restore_client(client: Client, ledger, state: dict) -> None:
    client.model.load_state_dict(state["model"])
    client.optimizer.load_state_dict(state["optimizer"])
    client.algorithm.load_state_dict(state["algorithm"])
    torch.set_rng_state(state["torch_rng"].cpu())
    if state["cuda_rng"] is not None:
        torch.cuda.set_rng_state_all(state["cuda_rng"])
    # the privacy ledger and key were restored first (_restore_keys): epsilon goes on from there
    sent, recv, seconds = state["outside_rounds"]
    previous = Traffic(dict(sent), dict(recv), seconds)
    for kind in previous.bytes_sent:  # this job's start-up traffic adds to the earlier jobs'
        ledger.outside_rounds.add(kind, previous.bytes_sent[kind], previous.bytes_recv[kind], 0.0)
    ledger.outside_rounds.seconds += previous.seconds
    for name, (sent, recv) in state.get("channels", {}).items():  # {}: a checkpoint older than channels
        ledger.record_channel(name, sent, recv)


def agree_on_checkpoint(comm, folder: Path, run_id: str, bound: int, clients: list[int] | None = None) -> int:
    """The newest rounds-completed count <= ``bound`` that every rank holds a checkpoint of run
    ``run_id`` for, of each of its ``clients`` (default: the client whose index is the rank; 0:
    none). Checkpoints are per client, so a run checkpointed on one layout resumes on any other.
    Another run's checkpoints in the folder are not looked at.

    Collective; terminates because the bound strictly decreases until every rank holds the
    candidate or it reaches 0.
    """
    held = [set(checkpoint.available(folder, c, run_id)) for c in (clients or [comm.rank])]
    mine = sorted(set.intersection(*held), reverse=True)
    while True:
        best = max((n for n in mine if n <= bound), default=0)
        candidate = int(comm.allreduce_min(np.array([best], dtype=np.int64), channel="start")[0])
        if candidate == 0:
            return 0
        held = int(comm.allreduce_min(np.array([int(candidate in mine)], dtype=np.int64), channel="start")[0])
        if held:
            return candidate
        bound = candidate - 1


def resume_point(
    plan: Plan, clients: list[Client], comm, folder: Path, decision: startpoint.Start, key: bytes | None = None
) -> int:
    """Load the newest checkpoint of this run that all ranks share and read whole, at or before
    the file's completed rounds (collective); returns the first round to run. A checkpoint that
    does not read (torn, zero-filled) on any rank sends every rank back to the next older one; this
    run's checkpoints past the one loaded are deleted, so they never count among the newest two.

    With privacy, a run none of whose checkpoints reads is never started again at round 1 while it
    has released anything (its journals hold a release, or its file holds rounds): that would send
    those rounds again with other noise, outside the epsilon the file records. ConfigError instead,
    naming the unreadable file. Without privacy it starts again at round 1, as before.

    A checkpoint whose config differs from this run's in anything but operational keys is
    refused with a ConfigError naming the key (raised on every rank). ``folder``: the checkpoint folder.
    """
    indices = [c.index for c in clients]
    bound, unreadable = decision.bound, None
    while True:
        agreed = agree_on_checkpoint(comm, folder, decision.run_id, bound, indices)
        if not agreed:
            break
        states = _load_states(clients, comm, folder, agreed, decision.run_id, key)
        first = lowest_client(comm, [c for c, state in zip(indices, states) if state is None])
        if first is None:  # every rank read every one of its clients' files
            break
        unreadable = unreadable or checkpoint.path_for(folder, first, agreed, decision.run_id)
        bound = agreed - 1
    if not agreed:  # before anything is deleted: a refused resume leaves the folder as it was
        _refuse_a_second_start(plan, clients, comm, folder, decision, unreadable)
    for c in indices:
        checkpoint.discard(folder, c, decision.run_id, newer_than=agreed)
    if not agreed:
        return 0
    state = states[0]
    difference = config_difference(state["config"], plan.resolved_config, "the checkpoint", "this run")
    same = int(comm.allreduce_min(np.array([int(difference is None)], dtype=np.int64), channel="start")[0])
    if not same:  # every rank raises here, so none is left in a collective
        raise ConfigError(
            "--resume",
            f"the checkpoint in {folder} was made with a different config: "
            f"{difference or 'on another rank'}; use another output file or "
            f"restore the config",
        )
    _restore_keys(clients, comm, states, [checkpoint.path_for(folder, c, agreed, decision.run_id) for c in indices])
    for c, client_state in zip(clients, states):
        restore_client(c, comm.ledger, client_state)
    return agreed


def _restore_keys(clients: list[Client], comm, states: list[dict], paths: list[Path]) -> None:
    """Each private client's ledger and key from its checkpoint, before anything else is restored; a
    ``privacy.key_dir`` that is not where a checkpoint's key came from stops the run on every rank
    (ConfigError naming both, exit 2; no key file is made)."""
    mismatch = None
    for c, state, path in zip(clients, states, paths):
        if c.algorithm.ctx.privacy is None:
            continue
        try:
            c.algorithm.ctx.privacy.load_state_dict(state["privacy"], source=f"checkpoint {path}")
        except KeyMismatch as err:
            mismatch = mismatch or err
    raise_agreed(comm, mismatch and ConfigError("privacy.key_dir", str(mismatch)))


def lowest_client(comm, flagged: list[int]) -> int | None:
    """The lowest client index any rank flags (its own clients' ``flagged``), the same on every rank,
    or None (collective: one int64 Allreduce on the start channel)."""
    none = np.iinfo(np.int64).max
    lowest = int(comm.allreduce_min(np.array([min(flagged, default=none)], dtype=np.int64), channel="start")[0])
    return None if lowest == none else lowest


def _load_states(clients: list[Client], comm, folder: Path, agreed: int, run_id: str, key: bytes | None) -> list:
    """Each client's state after ``agreed`` rounds (None: it does not read); a file that is refused (its
    MAC fails, or it is a zip or pickle mpicd did not write) stops the resume on every rank
    (ConfigError naming it, printed by the lowest rank that holds one)."""
    states, why = [], ""
    for c in clients:
        try:
            states.append(checkpoint.load(folder, c.index, agreed, run_id, c.device, key))
        except checkpoint.Refused as err:
            states.append(None)
            why = why or str(err)
    advice = "; move it away to resume from an older checkpoint, or start a new output"
    raise_agreed(comm, ConfigError("--resume", why + advice) if why else None)  # every rank raises, or none
    return states


def _refuse_a_second_start(plan, clients, comm, folder: Path, decision, unreadable: Path | None) -> None:
    """With privacy, no round 1 again for a run that has released (collective; ConfigError on every
    rank): the count of journaled releases over every client, and the file's rounds, say whether it has."""
    if plan.privacy is None:
        return
    mine = sum(
        len(c.algorithm.ctx.privacy.journal or ()) for c in clients
    )  # read by run.privacy_records.PrivacyRecords
    released = int(comm.allreduce_sum(np.array([mine], dtype=np.int64), channel="start")[0])
    if not released and not decision.bound:
        return
    what = (
        f"{unreadable} does not read and no older checkpoint of run {decision.run_id} is whole on every rank"
        if unreadable
        else f"{folder} holds no checkpoint of run {decision.run_id} at or before round {decision.bound}"
    )
    sent = (
        f"its clients journaled {released} private releases" if released else f"its file holds {decision.bound} rounds"
    )
    raise ConfigError(
        "--resume",
        f"{what}, but the run has released ({sent}): starting it again at round 1 would send those rounds again "
        "with other noise, outside the epsilon its file records. Restore the checkpoint, or pass --overwrite to "
        "start a new run (a new run id and nonce; the releases already sent stay with the peers that received "
        "them and out of the new run's epsilon)",
    )
