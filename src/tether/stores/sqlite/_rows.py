"""Reading SQLiteStore's rows: a statement's rows, its first row, and who a row's lease says holds the run.

See ``tether.stores.sqlite``.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Sequence
from typing import Any

import orjson

from ...errors import RunNotFoundError
from ..base import Owner, pid_alive

__all__ = ["fetch_all", "fetch_one", "holding", "live", "run_row"]


def fetch_all(conn: sqlite3.Connection, sql: str, params: Sequence[Any] = ()) -> list[Any]:
    """Every row of ``sql``; the statement is closed before this returns (none is left open)."""
    with contextlib.closing(conn.execute(sql, params)) as cur:
        return cur.fetchall()


def fetch_one(conn: sqlite3.Connection, sql: str, params: Sequence[Any] = ()) -> Any:
    """The first row of ``sql``, or None."""
    return next(iter(fetch_all(conn, sql, params)), None)


def run_row(conn: sqlite3.Connection, run_id: str, columns: str) -> Any:
    """``columns`` of the run's row.

    Raises:
        RunNotFoundError: no such run.
    """
    row = fetch_one(conn, f"SELECT {columns} FROM runs WHERE id = ?", (run_id,))
    if row is None:
        raise RunNotFoundError(run_id)
    return row


def live(owner: str | None, expires: float | None, now: float) -> bool:
    """Whether a row's lease (its ``lease_owner`` and ``lease_expires_at``) is held and unexpired at ``now``."""
    return owner is not None and (expires is None or expires > now)


def holding(raw: str | None, expires: float | None, now: float) -> Owner | None:
    """The lease's owner while it holds: unexpired, and not a process of this host known to be dead."""
    if not live(raw, expires, now):
        return None
    owner = Owner.from_dict(orjson.loads(raw or "{}"))
    return None if pid_alive(owner.pid, owner.host) is False else owner
