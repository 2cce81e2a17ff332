"""The records stores deal in: who holds a run (``Owner``), a held run (``Lease``), a listed run (``RunInfo``).

Also the errors of a take, an append and a renew, each worded here once for every store.
"""

from __future__ import annotations

import errno
import os
import socket
from dataclasses import dataclass, field
from typing import Any

from .. import journal as j
from ..errors import ConflictError, LeaseLostError, RunBusyError, StoreFullError, StoreLockedError

__all__ = [
    "Lease",
    "Owner",
    "RunInfo",
    "busy_error",
    "conflict_error",
    "full_error",
    "gap_error",
    "kept_changing_error",
    "lease_lost_error",
    "locked_error",
    "no_room",
    "pid_alive",
]

NO_ROOM_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
"""The ``errno`` values of a write that found no room: a full disk, a full quota."""


@dataclass(frozen=True, slots=True)
class Owner:
    """Who takes a run: the writer id, pid, host and since when."""

    writer: str
    pid: int
    host: str
    since: str

    @classmethod
    def here(cls, writer: str | None = None) -> Owner:
        """An owner for this process (a fresh writer id unless given)."""
        return cls(writer or j.new_writer_id(), os.getpid(), socket.gethostname(), j.now_iso())

    def describe(self) -> str:
        """``pid 123 on host h since T``."""
        return f"pid {self.pid} on host {self.host} since {self.since}"

    def to_dict(self) -> dict[str, Any]:
        """The JSON form stores keep."""
        return {"writer": self.writer, "pid": self.pid, "host": self.host, "since": self.since}

    @classmethod
    def from_dict(cls, obj: dict[str, Any]) -> Owner:
        """Read the JSON form."""
        return cls(
            str(obj.get("writer", "")),
            int(obj.get("pid", 0)),
            str(obj.get("host", "")),
            str(obj.get("since", "")),
        )


@dataclass(frozen=True, slots=True)
class Lease:
    """A held run: the fencing token (incremented by each claim), the owner, the expiry (None: a lock).

    ``ttl`` is the length it was claimed for; ``renew`` extends it by that much again.
    """

    run_id: str
    token: int
    owner: Owner
    expires_at: float | None = None
    ttl: float | None = None


@dataclass(frozen=True, slots=True)
class RunInfo:
    """One run as ``store.list()`` shows it; ``metadata`` is the run's (``run_started``), ``{}`` when none."""

    id: str
    agent: str | None
    status: str
    first_message: str | None
    created_at: str | None
    updated_at: str | None
    turn: int
    parent_id: str | None
    root_id: str | None
    lease_owner: str | None
    lease_expires_at: float | None
    length: int = 0
    inbox_len: int = 0
    inbox_consumed: int = -1
    metadata: dict[str, str] = field(default_factory=dict, hash=False)

    @property
    def unconsumed(self) -> bool:
        """Whether the inbox holds items no entry has journaled yet (the run needs a taker)."""
        return self.inbox_len > self.inbox_consumed + 1

    @property
    def display_status(self) -> str:
        """The status as ``tether ls`` shows it: ``running (no owner)`` for a running run no one holds."""
        if self.status == "running" and self.lease_owner is None:
            return "running (no owner)"
        return self.status


def pid_alive(pid: int, host: str) -> bool | None:
    """Whether ``pid`` lives; None when it is on another host and cannot be told."""
    if host != socket.gethostname():
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def busy_error(run_id: str, owner: Owner | None) -> RunBusyError:
    """The RunBusyError for a take that found ``run_id`` held by ``owner``."""
    if owner is None:
        return RunBusyError(
            f"run {run_id} is driven by another holder. Fix: wait for it, or stop that process", run_id=run_id
        )
    alive = pid_alive(owner.pid, owner.host)
    state = {True: "alive", False: "no longer alive", None: "on another host"}[alive]
    return RunBusyError(
        f"run {run_id} is driven by {owner.describe()} (that process is {state}). Fix: wait for it, or stop "
        "that process",
        run_id=run_id,
        owner=owner.to_dict(),
    )


def lease_lost_error(run_id: str, token: int | None, current: int | None = None) -> LeaseLostError:
    """The LeaseLostError of an append or renew whose lease ``token`` no longer holds the run.

    ``current`` is the run's token now, named in the message when the store knows it.
    """
    now = "" if current is None else f", current {current}"
    return LeaseLostError(
        f"run {run_id} is no longer held by this writer (token {token}{now}: released, expired, abandoned or "
        "taken over). Fix: stop writing; claim the run again and reload it",
        run_id=run_id,
    )


def gap_error(run_id: str, expected_seq: int, length: int) -> ConflictError:
    """The ConflictError of an append at ``expected_seq`` past the ``length`` stored entries (a gap).

    Its ``seq`` is ``length``, the first seq the journal lacks.
    """
    return ConflictError(
        f"run {run_id}: append at seq {expected_seq} leaves a gap after {length} entries. Fix: "
        "store.load(id) again and continue from there",
        run_id=run_id,
        seq=length,
    )


def conflict_error(run_id: str, seq: int, stored: j.Entry) -> ConflictError:
    """The ConflictError of an append that met another writer's (or other content's) ``stored`` entry at ``seq``.

    The message names the seq, the stored entry's kind and its writer.
    """
    return ConflictError(
        f"run {run_id} seq {seq} holds a {stored.kind} entry from writer {stored.w[:8]}, not this one. "
        "Fix: store.load(id) again and continue from there",
        run_id=run_id,
        seq=seq,
    )


def kept_changing_error(run_id: str) -> ConflictError:
    """The ConflictError of an append whose fence kept missing because other appends kept landing."""
    return ConflictError(
        f"run {run_id}: the journal kept changing under this append. Fix: store.load(id) again and "
        "continue from there",
        run_id=run_id,
    )


def no_room(exc: BaseException) -> bool:
    """Whether ``exc`` is an OSError of a write that found no room (``ENOSPC``, ``EDQUOT``)."""
    return isinstance(exc, OSError) and not isinstance(exc, StoreFullError) and exc.errno in NO_ROOM_ERRNOS


def full_error(run_id: str | None, path: str, reason: str, code: int = errno.ENOSPC) -> StoreFullError:
    """The StoreFullError of a write for ``run_id`` (None: no run's) to ``path`` that found no room
    (``reason``: the OS's or SQLite's words). The write was refused whole; what was saved before it is kept."""
    if run_id is None:
        return StoreFullError(
            f"no room to write {path} ({reason}); nothing was written. Fix: free space on that disk (or raise "
            "its quota), then try again",
            code=code,
            filename=path,
        )
    return StoreFullError(
        f"run {run_id}: no room to write {path} ({reason}); this write was refused whole and everything "
        "saved before it is kept. Fix: free space on that disk (or raise its quota), then save again: "
        f"store.save(state) writes what this process still holds, tether resume {run_id} continues from "
        "what is saved",
        run_id=run_id,
        code=code,
        filename=path,
    )


def locked_error(path: str, waited: float, reason: str, run_id: str | None = None) -> StoreLockedError:
    """The StoreLockedError of a write to the SQLite file ``path`` that waited ``waited`` seconds for another
    process's write transaction (``run_id``: the run it was writing, when there was one)."""
    what = f"run {run_id}: " if run_id else ""
    return StoreLockedError(
        f"{what}SQLite file {path} stayed locked by another process's write for {waited:.0f}s ({reason}); "
        f"nothing was written. Fix: end the process holding a write transaction open on it (fuser {path} "
        "names it), or let the store wait longer: SQLiteStore(path, lock_timeout=SECONDS)",
        filename=path,
    )
