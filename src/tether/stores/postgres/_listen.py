"""A worker's wait for work on PostgreSQL: ``LISTEN tether_work`` on a connection of its own.

See ``tether.stores.postgres``. Appends that make a run need work (a submitted run, a posted item, a
release) ``NOTIFY`` the channel in their own statement; a waiting worker wakes and claims.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable

import psycopg

from ._sql import CHANNEL

__all__ = ["Listener"]

log = logging.getLogger("tether.stores.postgres")


class Listener:
    """The listening connection of one store: made on the first wait, one per process, never pooled."""

    def __init__(self, conninfo: str, identity: str) -> None:
        self._conninfo, self._identity = conninfo, identity
        self._lock = threading.Lock()
        self._conn: tuple[int, psycopg.Connection] | None = None  # (the pid that made it, the connection)

    def wait(self, timeout: float, closed: Callable[[], bool]) -> bool:
        """Block until a NOTIFY or ``timeout`` seconds; True when woken (see ``PostgresStore.wait_for_work``).

        ``closed`` says whether the store was closed meanwhile: the wait then ends, returning False.
        """
        with self._lock:
            if closed():
                return False
            if self._conn is None or self._conn[0] != os.getpid() or self._conn[1].closed:
                try:
                    conn = psycopg.Connection.connect(self._conninfo, autocommit=True)
                    conn.execute(f"LISTEN {CHANNEL}")
                except psycopg.OperationalError as exc:
                    log.warning("listening on %s failed (%s); polling", self._identity, exc)
                    time.sleep(min(timeout, 1.0))
                    return True
                self._conn = (os.getpid(), conn)
                return True  # anything posted before LISTEN was not heard: look now
            conn, deadline, woken = self._conn[1], time.monotonic() + timeout, False
            try:
                while not woken and not closed() and (left := deadline - time.monotonic()) > 0:
                    woken = any(True for _ in conn.notifies(timeout=min(left, 1.0), stop_after=1))
                while woken and not closed() and any(True for _ in conn.notifies(timeout=0.001)):
                    pass  # one wake-up for a burst
            except psycopg.OperationalError as exc:
                log.info("listening connection lost (%s); listening again", exc)
                woken = True
            if closed() or conn.broken:
                with contextlib.suppress(Exception):
                    conn.close()
            return woken

    def close(self) -> None:
        """Close this process's listening connection; a wait in progress closes it itself when it ends."""
        if not self._lock.acquire(timeout=0.1):
            return  # a waiter holds it: it sees the store closed within a second and closes the connection
        try:
            if self._conn is not None and self._conn[0] == os.getpid():
                with contextlib.suppress(Exception):
                    self._conn[1].close()
            self._conn = None
        finally:
            self._lock.release()
