"""SQLiteStore's connections and write transactions (DESIGN 8.2).

A connection uses WAL, ``synchronous=FULL``, a busy timeout and ``isolation_level=None``. A write is
``BEGIN IMMEDIATE … COMMIT``; its ``BEGIN`` waits for another process's write transaction in slices of the
busy timeout, for up to the store's ``lock_timeout`` in all (the same wait for creating a run as for an
append mid-run). A lock held longer, and a file with no room left, raise tether's errors naming the file and
the fix instead of sqlite3's bare "database is locked" and "database or disk is full".
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from pathlib import Path

from ...errors import TetherError
from .._records import full_error, locked_error

__all__ = ["Connection", "begin", "connect", "is_full", "store_error"]


class Connection(sqlite3.Connection):
    """A connection that can be weakly referenced: one of a finished thread goes with the thread."""


def connect(path: Path, busy_timeout_ms: int) -> Connection:
    """A new connection to ``path`` with the store's pragmas.

    Raises:
        TetherError: the file cannot use WAL (a network file system).
    """
    conn = sqlite3.connect(path, timeout=busy_timeout_ms / 1000, isolation_level=None, factory=Connection)
    conn.execute(f"PRAGMA busy_timeout = {busy_timeout_ms}")
    mode = _wal(conn, busy_timeout_ms / 1000)
    if str(mode).lower() != "wal":
        raise TetherError(f"{path} cannot use WAL (mode {mode}). Fix: put it on a local disk")
    conn.execute("PRAGMA synchronous = FULL")
    conn.execute("PRAGMA foreign_keys = ON")
    return conn


def _wal(conn: sqlite3.Connection, timeout: float) -> str:
    """Set WAL mode (kept in the file) and return the mode the file is in.

    Turning a new file to WAL needs its exclusive lock, and SQLite answers "database is locked" at once,
    without waiting, when another process opening the same new file holds a lock meanwhile: tried again
    until ``timeout``.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            with contextlib.closing(conn.execute("PRAGMA journal_mode = WAL")) as cur:
                return str(cur.fetchone()[0])
        except sqlite3.OperationalError as exc:
            if not _is_busy(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(0.01)


def _code(exc: BaseException) -> int | None:
    return getattr(exc, "sqlite_errorcode", None)


def is_full(exc: BaseException) -> bool:
    """Whether ``exc`` is SQLite's "database or disk is full" (``SQLITE_FULL``)."""
    if not isinstance(exc, sqlite3.Error):
        return False
    return _code(exc) == sqlite3.SQLITE_FULL or "database or disk is full" in str(exc)


def _is_busy(exc: sqlite3.Error) -> bool:
    return _code(exc) in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED) or "database is locked" in str(exc)


def begin(conn: sqlite3.Connection, path: Path, lock_timeout: float, run_id: str | None) -> None:
    """``BEGIN IMMEDIATE``, waiting out another process's write for up to ``lock_timeout`` seconds.

    Raises:
        StoreLockedError: the file was still locked at the deadline.
    """
    start = time.monotonic()
    while True:
        try:
            conn.execute("BEGIN IMMEDIATE")
            return
        except sqlite3.OperationalError as exc:
            waited = time.monotonic() - start
            if not _is_busy(exc) or waited >= lock_timeout:
                if _is_busy(exc):
                    raise locked_error(str(path), waited, str(exc), run_id) from exc
                raise
            time.sleep(0.01)  # each try waits the busy timeout itself; this only yields between tries


def store_error(exc: BaseException, path: Path, run_id: str | None) -> BaseException:
    """The error to raise for ``exc`` from a write transaction: a full file becomes ``StoreFullError``."""
    if is_full(exc):
        error = full_error(run_id, str(path), str(exc))
        error.__cause__ = exc
        return error
    return exc
