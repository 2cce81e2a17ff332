"""The write transactions of one SQLiteStore in this process: taking turns, and appends committed together.

SQLite lets one writer at a time into the database, and its busy handler makes a writer that finds it
locked sleep (1, 2, 5, 10 ms and more) rather than wake it when the lock frees. So this process's
writers take turns on a lock of their own first; other processes still meet at ``BEGIN IMMEDIATE``
(``busy_timeout``).

Appends (and claims, renewals and releases) of several runs that wait for that lock together are
committed together (group commit across runs, DESIGN 5.3): the writer that gets the lock runs every
write queued meanwhile in one transaction, each in a savepoint of its own, and commits once, so they
share one sync; none returns before that commit. Each append keeps its own rules: its fence (the fenced
``UPDATE``) runs before its ``INSERT`` in the same transaction, and an append that fails (a conflict, a
lost lease) is rolled back to its savepoint alone and raises in its caller. When the ``COMMIT`` fails,
every write of it raises (a retried append is settled by the same-writer rule).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from ._txn import begin, store_error

__all__ = ["IO_THREADS", "Writers"]

T = TypeVar("T")

IO_THREADS = 32
"""Threads a SQLiteStore runs its I/O on (``stores.base.IO_THREADS`` is 4): the writes waiting at once
are committed together, so more threads mean fewer syncs when many runs are driven at once; a thread
waiting for the write lock costs a connection and a stack, nothing more."""


class _Queued:
    """One append waiting for a transaction: its work, then its outcome."""

    __slots__ = ("done", "error", "run_id", "value", "work")

    def __init__(self, work: Callable[[sqlite3.Connection], Any], run_id: str | None) -> None:
        self.work = work
        self.run_id = run_id
        self.done = False
        self.value: Any = None
        self.error: BaseException | None = None


class Writers:
    """Write transactions on ``connect()``'s connection (this thread's), one at a time in this process.

    Each ``BEGIN IMMEDIATE`` waits out another process's write for up to ``lock_timeout`` seconds, and a
    file with no room left raises ``StoreFullError`` naming the run (``_txn``).

    Args:
        connect: this thread's connection (``isolation_level=None``).
        path: the database file, named in errors.
        lock_timeout: how long a write waits for another process's write lock in all.
    """

    def __init__(self, connect: Callable[[], sqlite3.Connection], path: Path, lock_timeout: float) -> None:
        self._connect = connect
        self._path = path
        self._lock_timeout = lock_timeout
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._lock = threading.Lock()  # held for each write transaction of this process
        self._queue_lock = threading.Lock()
        self._queue: list[_Queued] = []

    def _turn(self) -> threading.Lock:
        if self._pid != os.getpid():  # a forked child: the parent's lock and queue are not its own
            self._reset()
        return self._lock

    @contextlib.contextmanager
    def transaction(self, run_id: str | None = None) -> Iterator[sqlite3.Connection]:
        """One write transaction (for ``run_id``, named in its errors), rolled back on any error.

        Raises:
            StoreLockedError: another process held the write lock past ``lock_timeout``.
            StoreFullError: the file (or its disk) had no room; nothing of this transaction was written.
        """
        with self._turn(), self._transaction(run_id) as conn:
            yield conn

    @contextlib.contextmanager
    def _transaction(self, run_id: str | None) -> Iterator[sqlite3.Connection]:
        """A write transaction, the caller holding this process's turn."""
        conn = self._connect()
        begin(conn, self._path, self._lock_timeout, run_id)
        try:
            yield conn
            conn.execute("COMMIT")
        except BaseException as exc:
            _rollback(conn)
            error = store_error(exc, self._path, run_id)
            if error is exc:
                raise
            raise error from exc

    def together(self, work: Callable[[sqlite3.Connection], T], run_id: str | None = None) -> T:
        """Run ``work`` in a write transaction, with whatever other ``together`` work waits meanwhile.

        ``work`` runs in a savepoint of its own; its exception rolls back only its own writes and is
        raised here. Returns what ``work`` returned, once the transaction that held it committed.
        """
        queued = _Queued(work, run_id)
        turn = self._turn()
        with self._queue_lock:
            self._queue.append(queued)
        with turn:
            if not queued.done:  # no writer took it along: this one commits whatever is queued
                with self._queue_lock:
                    batch, self._queue = self._queue, []
                self._commit(batch)
        if queued.error is not None:
            raise queued.error
        return queued.value

    def _commit(self, batch: list[_Queued]) -> None:
        if len(batch) == 1:  # alone: its own transaction, without a savepoint's two statements
            queued = batch[0]
            try:  # what ``_transaction`` does, without a context manager's three calls
                conn = self._connect()
                begin(conn, self._path, self._lock_timeout, queued.run_id)
                try:
                    queued.value = queued.work(conn)
                    conn.execute("COMMIT")
                except BaseException as exc:
                    _rollback(conn)
                    queued.error = _raised(store_error(exc, self._path, queued.run_id), exc)
            except BaseException as exc:  # the connection or its BEGIN
                queued.error = exc
            finally:
                queued.done = True
            return
        conn = self._connect()
        try:
            begin(conn, self._path, self._lock_timeout, None)
            for queued in batch:
                conn.execute("SAVEPOINT tether_append")
                try:
                    queued.value = queued.work(conn)
                except BaseException as exc:
                    queued.error = exc
                    conn.execute("ROLLBACK TO tether_append")
                conn.execute("RELEASE tether_append")
            conn.execute("COMMIT")
        except BaseException as exc:  # BEGIN, a savepoint or the COMMIT failed: none of the batch is durable
            _rollback(conn)
            for queued in batch:
                if queued.error is None:
                    queued.error = store_error(exc, self._path, queued.run_id)
        finally:
            for queued in batch:
                queued.done = True


def _raised(error: BaseException, cause: BaseException) -> BaseException:
    """``error`` as ``raise error from cause`` leaves it (``error`` itself when it is ``cause``)."""
    if error is not cause:
        error.__cause__ = cause
        error.__suppress_context__ = True
    return error


def _rollback(conn: sqlite3.Connection) -> None:
    if conn.in_transaction:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
