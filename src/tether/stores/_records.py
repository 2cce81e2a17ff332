"""The records stores deal in: who holds a run (``Owner``), a held run (``Lease``), a listed run (``RunInfo``).

Also the error a take gives when the run is held.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Any

from .. import journal as j
from ..errors import RunBusyError

__all__ = ["Lease", "Owner", "RunInfo", "busy_error", "pid_alive"]


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
    """One run as ``store.list()`` shows it."""

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
