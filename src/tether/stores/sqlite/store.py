"""SQLiteStore: runs in one SQLite file, on the standard library's ``sqlite3`` (DESIGN 8.2, DURABILITY 2-4).

Four tables (schema version in ``PRAGMA user_version``, migrations applied in order at open):

- ``runs``: one row per run with the listing record (agent, status, turn, first message, times, parent,
  root, and the writer's whole ``info`` as JSON), ``length`` (entries), ``inbox_len`` (posted items),
  ``inbox_consumed`` (the highest ``inbox_seq`` journaled) and the lease (``lease_owner`` JSON,
  ``lease_token``, ``lease_expires_at`` in epoch seconds of this machine's clock).
- ``entries``: ``(run_id, seq, body)``, the body being ``encode_entry(entry)``.
- ``inbox``: ``(run_id, inbox_seq, item_id, body)``, the body being ``InboxItem.to_dict()`` as JSON.
- ``run_metadata``: ``(run_id, key, value)``, each metadata pair of a run, written at create, indexed by pair.

Connections use WAL, ``synchronous=FULL``, a busy timeout and ``isolation_level=None``; every write is
``BEGIN IMMEDIATE … COMMIT`` (``_txn``: waiting out another process's write up to ``lock_timeout``), so posts, appends, claims and releases on one run serialize on the database's
write lock and each is all or nothing. Numbers (``seq``, ``inbox_seq``, the fencing token) come from
counters on the run's row, never from AUTOINCREMENT. The fence of an append is the ``UPDATE`` of that row
(token, length and an unexpired lease in its ``WHERE``), in the transaction that inserts the entries. One
connection per thread (and per process, after a fork).

Listing reads indexes in ``(updated_at DESC, id DESC)`` order (per status, agent, parent and root too), so the
newest page costs the same at any size; ``claim_next`` reads the partial index ``runs_work`` of roots that
may need work; ``claim_next``, ``delete`` and ``prune`` each decide and write in one write transaction.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import logging
import os
import sqlite3
import threading
import time
import uuid
import weakref
from collections.abc import Collection, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import orjson

from ... import journal as j
from ...errors import CorruptJournalError, RunNotFoundError, TetherError
from ...inbox import InboxItem, make_item
from .. import _failpoints as fp
from .._listing import ListQuery
from .._planner import Stored, plan_append, stored_body
from .._records import lease_lost_error
from ..base import (
    Lease,
    Owner,
    RunInfo,
    Store,
    as_cutoff,
    busy_error,
    check_batch,
    check_prune_statuses,
)
from . import _catalog
from ._rows import fetch_all, fetch_one, holding, live, run_row
from ._schema import HELD as _HELD
from ._schema import INSERT_ENTRY as _INSERT_ENTRY
from ._schema import INSERT_METADATA as _INSERT_METADATA
from ._schema import MIGRATIONS as _MIGRATIONS
from ._schema import NEXT as _NEXT
from ._schema import SCHEMA_VERSION
from ._schema import WORK as _WORK
from ._txn import Connection as _Connection
from ._txn import connect as _connect
from ._writers import IO_THREADS, Writers

__all__ = ["SCHEMA_VERSION", "SQLiteStore"]

log = logging.getLogger(__name__)


_HELD_AND_INBOX = _HELD + ", inbox_len"  # what an append reads of its run's row

_FENCED_UPDATE = (
    "UPDATE runs SET agent = ?, status = ?, turn = ?, first_message = ?, created_at = ?, updated_at = ?, "
    "parent_id = ?, root_id = ?, info = ?, length = ?, inbox_consumed = ? WHERE id = ? AND length = ? AND "
    "lease_token = ? AND lease_owner IS NOT NULL AND (lease_expires_at IS NULL OR lease_expires_at > ?)"
)
"""An append's fence and listing (parameters: the listing, the new length, inbox_consumed, the run id, the
stored length, the token, now)."""

_HELD_HERE = (
    f"SELECT id, lease_owner, lease_expires_at FROM runs INDEXED BY runs_work WHERE {_WORK} AND "
    "lease_owner IS NOT NULL AND (lease_expires_at IS NULL OR lease_expires_at > ?) AND "
    "json_extract(lease_owner, '$.host') = ? AND (status = 'running' OR inbox_len > inbox_consumed + 1)"
)
"""Held roots needing work whose holder is a process of this host (parameters: now, host)."""


def _stored(conn: sqlite3.Connection, run_id: str, first: int, end: int) -> list[Stored]:
    """The stored entries ``first <= seq < end`` of a retried append, read in the append's transaction."""
    sql = "SELECT body FROM entries WHERE run_id = ? AND seq >= ? AND seq < ? ORDER BY seq"
    return [stored_body(run_id, body) for (body,) in fetch_all(conn, sql, (run_id, first, end))]


class SQLiteStore(Store):
    """Runs in one SQLite file; safe for many threads and processes of one machine.

    A lease holds until it expires (by this machine's clock) or, sooner, until its holder's process is
    known to be dead (same host, no such pid): a run whose driver was killed can be resumed at once.

    Args:
        path: the database file (created 0600, with its folder 0700, when missing).
        ttl: the default lease length in seconds (a holder renews every ttl/4).
        busy_timeout_ms: how long one try of a write waits for another writer's transaction.
        lock_timeout: how long in all a write (creating a run, an append, a claim, ...) waits for another
            process's write transaction before it raises StoreLockedError.

    Raises:
        TetherError: the file cannot be created or used, or was written by a newer tether (a newer schema).
    """

    ttl: float | None = 30.0
    append_reads_inbox = True  # read with the fence's row, in the append's transaction

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        ttl: float = 30.0,
        busy_timeout_ms: int = 5000,
        lock_timeout: float = 30.0,
    ) -> None:
        super().__init__()
        self.io_threads.limit = IO_THREADS  # appends waiting at once share a commit (``_writers``)
        self.ttl = ttl
        self.busy_timeout_ms = int(busy_timeout_ms)
        self.lock_timeout = float(lock_timeout)
        target = Path(path).expanduser().absolute()
        self.path = target
        try:
            if not target.parent.exists():
                target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                os.chmod(target.parent, 0o700)
            self.path = target.resolve()
            created = not self.path.exists()
            if created:
                os.close(os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600))
        except OSError as exc:
            raise TetherError(
                f"cannot create the SQLite file {self.path} ({exc.strerror or exc}). Fix: pick a path in a "
                "folder you can write, e.g. sqlite:///runs.db (./runs.db) or sqlite:////abs/path/runs.db"
            ) from exc
        self._local = threading.local()
        self._conns: weakref.WeakSet[_Connection] = weakref.WeakSet()
        self._conns_lock = threading.Lock()
        self._writers = Writers(
            self._conn, self.path, self.lock_timeout
        )  # this process's writes, one at a time
        try:
            self._migrate(self._conn())
        except sqlite3.DatabaseError as exc:  # not a database, a folder, no permission, locked too long
            raise TetherError(f"{self.path} is not a usable store ({exc}). Fix: check the path") from exc
        if created:
            for suffix in ("", "-wal", "-shm"):
                with contextlib.suppress(OSError):
                    os.chmod(f"{self.path}{suffix}", 0o600)

    # --- Connections and transactions
    @property
    def identity(self) -> str:
        return f"sqlite:///{self.path}"

    def _conn(self) -> sqlite3.Connection:
        """This thread's connection (a new one in a forked child)."""
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is not None and self._local.pid == os.getpid():
            return conn
        conn = _connect(self.path, self.busy_timeout_ms)
        self._local.conn, self._local.pid = conn, os.getpid()
        with self._conns_lock:
            self._conns.add(conn)
        return conn

    def _write(self, run_id: str | None = None) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        """One write transaction (for ``run_id``, named in its errors): see ``Writers.transaction``."""
        return self._writers.transaction(run_id)

    def _migrate(self, conn: sqlite3.Connection) -> None:
        """Bring the schema to ``SCHEMA_VERSION``, or refuse a newer one."""
        version = fetch_one(conn, "PRAGMA user_version")[0]
        if version == SCHEMA_VERSION:
            return
        with self._write():
            version = fetch_one(conn, "PRAGMA user_version")[0]
            if version > SCHEMA_VERSION:
                raise TetherError(
                    f"{self.path} was written by a newer tether (schema {version}; this tether knows up to "
                    f"{SCHEMA_VERSION}). Fix: upgrade tether"
                )
            for statements in _MIGRATIONS[version:]:
                for sql in statements:
                    conn.execute(sql)
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def close(self) -> None:
        """Close this store's connections (those of other threads as far as sqlite3 allows)."""
        with self._conns_lock:
            conns, self._conns = list(self._conns), weakref.WeakSet()
        for conn in conns:
            with contextlib.suppress(sqlite3.Error):
                conn.close()
        self._local = threading.local()
        super().close()

    # --- Runs and the journal
    def _lease(
        self, run_id: str, token: int, owner: Owner, ttl: float | None
    ) -> tuple[str, float | None, Lease]:
        ttl = self.ttl if ttl is None else ttl
        expires = time.time() + ttl if ttl is not None else None
        return orjson.dumps(owner.to_dict()).decode(), expires, Lease(run_id, token, owner, expires, ttl)

    def create(
        self,
        run_id: str,
        entries: Sequence[j.Entry],
        info: dict[str, Any],
        *,
        owner: Owner | None = None,
        ttl: float | None = None,
    ) -> Lease | None:
        j.validate_run_id(run_id)
        check_batch(run_id, entries, 0)
        owner_json, expires, lease = self._lease(run_id, 1, owner, ttl) if owner else (None, None, None)
        try:
            with self._write(run_id) as conn:
                conn.execute(
                    "INSERT INTO runs (id, agent, status, turn, first_message, created_at, updated_at, "
                    "parent_id, root_id, info, length, inbox_consumed, lease_owner, lease_token, "
                    "lease_expires_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (run_id, *self._listing(info), len(entries), int(info.get("inbox_consumed", -1)),
                     owner_json, 1 if owner is not None else 0, expires),
                )  # fmt: skip
                self._insert(conn, run_id, entries)
                pairs = (info.get("metadata") or {}).items()
                conn.executemany(_INSERT_METADATA, [(run_id, str(k), str(v)) for k, v in pairs])
        except sqlite3.IntegrityError:
            raise ValueError(
                f"run {run_id} already exists. Fix: store.load({run_id!r}), or pick another id"
            ) from None
        return lease

    @staticmethod
    def _listing(info: dict[str, Any]) -> tuple[Any, ...]:
        """The listing columns from the writer's info: agent … root_id, then the info JSON."""
        return (
            info.get("agent"), str(info.get("status") or "running"), int(info.get("turn") or 0),
            info.get("first_message"), info.get("created_at"), info.get("updated_at") or j.now_iso(),
            info.get("parent_id"), info.get("root_id"), orjson.dumps(info, default=str).decode(),
        )  # fmt: skip

    @staticmethod
    def _insert(conn: sqlite3.Connection, run_id: str, entries: Iterable[j.Entry]) -> None:
        conn.executemany(
            _INSERT_ENTRY, [(run_id, entry.seq, j.encode_entry(entry, run_id)) for entry in entries]
        )

    def append(
        self,
        run_id: str,
        entries: Sequence[j.Entry],
        *,
        expected_seq: int,
        writer: str,
        lease_token: int | None,
        info: dict[str, Any],
    ) -> int:
        """See ``Store.append``; returns the inbox's length, read in the append's transaction."""
        rows = [(run_id, entry.seq, j.encode_entry(entry, run_id)) for entry in entries]  # before the lock
        listing = (*self._listing(info), int(info.get("inbox_consumed", -1)))
        new, inbox_len = self._writers.together(
            functools.partial(self._append, run_id, entries, rows, expected_seq, lease_token, listing), run_id
        )  # committed with the appends of other runs that wait meanwhile (one sync for all)
        if fp.ACTIVE and new and fp.hits("after_append", new):
            fp.die()
        return inbox_len

    def _append(
        self,
        run_id: str,
        entries: Sequence[j.Entry],
        rows: list[tuple[str, int, bytes]],
        expected_seq: int,
        lease_token: int | None,
        listing: tuple[Any, ...],
        conn: sqlite3.Connection,
    ) -> tuple[list[j.Entry], int]:
        """One append's writes in ``conn``'s transaction (``rows`` and ``listing`` made before it).

        Returns the entries written, and the inbox's length (read in the fenced statement, or with the
        fence's row). The usual append (the journal ends at ``expected_seq``, the lease holds) is one fenced
        ``UPDATE … RETURNING`` and the ``INSERT``; when that ``UPDATE`` matches no row (a retry, a gap, a
        lost lease), the row is read and the planner decides, as for every append before.
        """
        now = time.time()
        if entries:
            check_batch(run_id, entries, expected_seq)  # the planner's first check, before any write
            found = conn.execute(
                _FENCED_UPDATE + " RETURNING inbox_len",
                (*listing[:-1], expected_seq + len(entries), listing[-1], run_id, expected_seq, lease_token,
                 now),
            ).fetchall()  # fmt: skip
            if found:  # a new append at the journal's end, fenced: nothing stored to compare
                new = list(entries)
                if fp.ACTIVE and fp.hits("before_append", new):
                    fp.die()  # inside the transaction: nothing of it is written
                conn.executemany(_INSERT_ENTRY, rows)
                if fp.ACTIVE and fp.hits("torn_append", new):
                    fp.die()  # inside the transaction: SQLite rolls it back, all or nothing
                return new, int(found[0][0])
        n, token, owner, expires, inbox_len = run_row(conn, run_id, _HELD_AND_INBOX)
        if lease_token != token or not live(owner, expires, now):
            raise lease_lost_error(run_id, lease_token, token)
        stored = functools.partial(_stored, conn, run_id)
        new = plan_append(run_id, entries, expected_seq=expected_seq, stored_length=n, stored=stored)
        if not new:
            return new, int(inbox_len)
        if fp.ACTIVE and fp.hits("before_append", new):
            fp.die()
        cur = conn.execute(
            _FENCED_UPDATE, (*listing[:-1], n + len(new), listing[-1], run_id, n, lease_token, now)
        )
        if cur.rowcount != 1:  # cannot happen under the write lock; the fence is here all the same
            raise lease_lost_error(run_id, lease_token, token)
        conn.executemany(_INSERT_ENTRY, rows[len(entries) - len(new) :])
        if fp.ACTIVE and fp.hits("torn_append", new):
            fp.die()  # inside the transaction: SQLite rolls it back, all or nothing
        return new, int(inbox_len)

    def read(self, run_id: str, after_seq: int = -1) -> list[j.Entry]:
        after_seq = max(after_seq, -1)
        conn = self._conn()
        if after_seq < 0:  # the whole journal (a load): one plain index scan, the bodies only
            bodies = fetch_all(conn, "SELECT body FROM entries WHERE run_id = ? ORDER BY seq", (run_id,))
            if not bodies:
                run_row(conn, run_id, "1")
                return []
            return j.decode_journal(run_id, [body for (body,) in bodies])
        rows = fetch_all(
            conn,
            "SELECT seq, body FROM entries WHERE run_id = ? AND seq = 0 UNION ALL "
            "SELECT seq, body FROM entries WHERE run_id = ? AND seq > ? ORDER BY seq",
            (run_id, run_id, max(after_seq, 0)),
        )
        if not rows:
            run_row(conn, run_id, "1")
            return []
        first = orjson.loads(rows[0][1]) if rows[0][0] == 0 else {}  # run_started: the journal's version
        version = first.get("version")
        out: list[j.Entry] = []
        decode = j.LineDecoder(run_id)
        for expected, (_, body) in enumerate((r for r in rows if r[0] > after_seq), start=after_seq + 1):
            entry = decode(body, version, expected)
            if entry.seq != expected:
                raise CorruptJournalError(run_id, entry.seq, f"expected seq {expected} here")
            out.append(entry)
        return out

    def length(self, run_id: str) -> int:
        return int(run_row(self._conn(), run_id, "length")[0])

    # --- The inbox
    def post(self, run_id: str, item: dict[str, Any], *, item_id: str | None = None) -> int:
        item_id = item_id or str(item.get("item_id") or uuid.uuid4().hex)
        made = make_item(item, inbox_seq=0, item_id=item_id)  # checks the type before any write
        with self._write(run_id) as conn:
            found = fetch_one(
                conn, "SELECT inbox_seq FROM inbox WHERE run_id = ? AND item_id = ?", (run_id, item_id)
            )
            if found is not None:
                return int(found[0])
            row = fetch_one(
                conn, "UPDATE runs SET inbox_len = inbox_len + 1 WHERE id = ? RETURNING inbox_len", (run_id,)
            )
            if row is None:
                raise RunNotFoundError(run_id)
            seq = int(row[0]) - 1
            body = {**made.to_dict(), "inbox_seq": seq}
            conn.execute(
                "INSERT INTO inbox (run_id, inbox_seq, item_id, body) VALUES (?, ?, ?, ?)",
                (run_id, seq, item_id, orjson.dumps(body)),
            )
        return seq

    def read_inbox(self, run_id: str, after_seq: int = -1) -> list[InboxItem]:
        conn = self._conn()
        rows = fetch_all(
            conn,
            "SELECT body FROM inbox WHERE run_id = ? AND inbox_seq > ? ORDER BY inbox_seq",
            (run_id, after_seq),
        )
        if not rows:
            run_row(conn, run_id, "1")
        return [InboxItem.from_dict(orjson.loads(body)) for (body,) in rows]

    def inbox_length(self, run_id: str) -> int:
        return int(run_row(self._conn(), run_id, "inbox_len")[0])

    # --- Leases
    def _take(self, conn: sqlite3.Connection, run_id: str, owner: Owner, ttl: float | None) -> Lease:
        owner_json, expires, _ = self._lease(run_id, 0, owner, ttl)
        (token,) = fetch_one(
            conn,
            "UPDATE runs SET lease_token = lease_token + 1, lease_owner = ?, lease_expires_at = ? "
            "WHERE id = ? RETURNING lease_token",
            (owner_json, expires, run_id),
        )
        return Lease(run_id, int(token), owner, expires, ttl if ttl is not None else self.ttl)

    def claim(self, run_id: str, owner: Owner, ttl: float | None = None) -> Lease:
        with self._write() as conn:
            held, expires = run_row(conn, run_id, "lease_owner, lease_expires_at")
            if holder := holding(held, expires, time.time()):
                raise busy_error(run_id, holder)
            return self._take(conn, run_id, owner, ttl)

    def claim_next(
        self, owner: Owner, ttl: float | None = None, agents: Collection[str] | None = None
    ) -> Lease | None:
        """Claim the root of a tree that needs work (see ``Store.claim_next``), in one write transaction.

        The candidates come from the partial index ``runs_work``, oldest update first. When no free root
        needs work, a root held by a process of this host that no longer lives is taken (as ``claim``
        would take it), so a worker restarted after a SIGKILL need not wait for the dead lease's ttl.
        """
        names = None if agents is None else list(agents)
        if names is not None and not names:
            return None
        now = time.time()
        only, named = ("", []) if names is None else (f" AND agent IN ({', '.join('?' * len(names))})", names)

        def take(conn: sqlite3.Connection) -> Lease | None:
            row = fetch_one(conn, _NEXT + only + " ORDER BY updated_at, id LIMIT 1", [now, now, *named])
            if row is not None:
                return self._take(conn, row[0], owner, ttl)
            held = fetch_all(
                conn, _HELD_HERE + only + " ORDER BY updated_at, id LIMIT 50", [now, owner.host, *named]
            )
            for run_id, raw, expires in held:
                if holding(raw, expires, now) is None:  # its holder is a dead process of this host
                    return self._take(conn, run_id, owner, ttl)
            return None

        return self._writers.together(take)  # committed with other writes waiting meanwhile

    def renew(self, lease: Lease) -> Lease:
        _, expires, renewed = self._lease(lease.run_id, lease.token, lease.owner, lease.ttl)

        def extend(conn: sqlite3.Connection) -> None:
            cur = conn.execute(
                "UPDATE runs SET lease_expires_at = ? "
                "WHERE id = ? AND lease_token = ? AND lease_owner IS NOT NULL",
                (expires, lease.run_id, lease.token),
            )
            if cur.rowcount != 1:
                raise lease_lost_error(lease.run_id, lease.token)

        self._writers.together(extend, lease.run_id)
        return renewed

    def release(self, lease: Lease, *, at_seq: int, inbox_len: int) -> bool:
        def let_go(conn: sqlite3.Connection) -> bool:
            cur = conn.execute(
                "UPDATE runs SET lease_owner = NULL, lease_expires_at = NULL "
                "WHERE id = ? AND lease_token = ? AND length = ? AND inbox_len = ?",
                (lease.run_id, lease.token, at_seq, inbox_len),
            )
            if cur.rowcount == 1:
                return True
            (token,) = run_row(conn, lease.run_id, "lease_token")
            return bool(token != lease.token)  # taken over: nothing of ours to release

        return self._writers.together(let_go, lease.run_id)  # committed with other writes waiting meanwhile

    def abandon(self, lease: Lease) -> None:
        try:
            with self._write() as conn:
                conn.execute(
                    "UPDATE runs SET lease_owner = NULL, lease_expires_at = NULL "
                    "WHERE id = ? AND lease_token = ?",
                    (lease.run_id, lease.token),
                )
        except Exception as exc:  # never raises: the lease expires on its own
            log.warning("abandoning run %s failed: %s", lease.run_id, exc)

    def holder(self, run_id: str) -> Owner | None:
        held, expires = run_row(self._conn(), run_id, "lease_owner, lease_expires_at")
        return holding(held, expires, time.time())

    # --- Listing and removal (``_catalog``)
    def delete(self, run_id: str, *, children: bool = False) -> None:
        j.validate_run_id(run_id)
        with self._write() as conn:
            _catalog.delete(conn, run_id, children)

    def prune(
        self,
        older_than: datetime | timedelta | str,
        *,
        statuses: Sequence[str] = j.STOP_STATUSES,
        children: bool = False,
        dry_run: bool = False,
    ) -> builtins.list[str]:
        """Delete old stopped trees (see ``Store.prune``) in one write transaction; return their ids."""
        wanted, cutoff = check_prune_statuses(statuses), as_cutoff(older_than)
        with self._write() as conn:
            return _catalog.prune(conn, builtins.list(wanted), cutoff, children, dry_run)

    def list(
        self,
        *,
        status: str | None = None,
        agent: str | None = None,
        parent_id: str | None = None,
        root_id: str | None = None,
        updated_before: datetime | str | None = None,
        updated_after: datetime | str | None = None,
        limit: int = 100,
        cursor: str | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> builtins.list[RunInfo]:
        query = ListQuery.of(
            status=status,
            agent=agent,
            parent_id=parent_id,
            root_id=root_id,
            updated_before=updated_before,
            updated_after=updated_after,
            cursor=cursor,
            metadata=metadata,
        )
        return _catalog.list_runs(self._conn(), query, limit)
