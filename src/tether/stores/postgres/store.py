"""PostgresStore: runs in PostgreSQL, shared by processes on many machines (DESIGN 8.2, 11; DURABILITY 2-4).

SQLiteStore's three tables (``runs``, ``entries``, ``inbox``) in the DSN's schema (its ``search_path``),
versioned in ``tether_schema`` and migrated on first use. Numbers come from the run's row: ``post`` is
``UPDATE runs SET inbox_len = inbox_len + 1 … RETURNING`` plus the INSERT, one transaction; an append is
fenced by ``UPDATE runs … WHERE id AND length AND lease_token AND lease_expires_at > now()`` before its
INSERT, one transaction; claims are short transactions (``FOR UPDATE SKIP LOCKED`` on roots needing work,
then a new token and expiry), so no row lock is held during a run. Lease expiry is judged by the server's
clock. Posts, submitted runs and runs given up with work left ``NOTIFY tether_work`` (payload: the root's
id); ``wait_for_work`` listens on a dedicated connection. ``updated_at`` is kept as the writer's ISO string
(``COLLATE "C"``), so listing bounds and cursors compare exactly as ``ListCursor`` does.

A lost connection (a restarted server, a killed backend, an idle connection dropped) is retried on a new
one for up to ``retry_timeout`` seconds, each retry settling an unknown outcome: appends by the same-writer
rule, posts by ``item_id``, claims and creates by finding their own lease or entries. psycopg 3 and
psycopg_pool are imported only here and in ``_sql`` (schema, SQL, helpers): ``pip install tether[postgres]``.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, TypeVar

import orjson
import psycopg
from psycopg import errors as pg_errors
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import ConnectionPool, PoolClosed

from ... import journal as j
from ...errors import CorruptJournalError, RunNotFoundError, TetherError
from ...inbox import InboxItem, make_item
from .. import _failpoints as fp
from .. import base
from .._listing import ListQuery
from .._planner import Stored, plan_append, stored_body
from .._records import kept_changing_error, lease_lost_error
from ..base import Lease, Owner, RunInfo, Store, busy_error
from ._connect import first_connect
from ._sql import (
    CHANNEL,
    EPOCH,
    FREE,
    HAS_METADATA,
    LISTED,
    LIVE,
    MIGRATIONS,
    NEEDS,
    SCHEMA_VERSION,
    SET_LISTING,
    WORK,
    Conn,
    PostgresUnavailableError,
    as_json,
    holding,
    info_of,
    listing_of,
    redact,
    refuse_newer,
    schema_version,
)

__all__ = ["CHANNEL", "SCHEMA_VERSION", "PostgresStore", "PostgresUnavailableError"]

log = logging.getLogger(__name__)
T = TypeVar("T")
Rows = builtins.list[Any]


class PostgresStore(Store):
    """Runs in PostgreSQL; safe for many threads, processes and machines.

    Args:
        dsn: a libpq connection string or ``postgresql://`` URL (a schema: ``options=-csearch_path=NAME``).
        ttl: the default lease length in seconds, judged by the server's clock (a holder renews every ttl/4).
        pool_min, pool_max: the connection pool's size (per process).
        connect_timeout: seconds to wait for a new connection.
        migrate: create or upgrade the schema on first use; False only checks it (``tether db migrate``).
        pool_timeout: seconds to wait for a free connection of the pool.
        retry_timeout: how long an operation retries after lost connections before it raises
            PostgresUnavailableError.

    Nothing connects until the first use, which raises TetherError for a schema newer than this tether (or
    one missing or older with ``migrate=False``).
    """

    ttl: float | None = 30.0

    def __init__(self, dsn: str, *, ttl: float = 30.0, pool_min: int = 1, pool_max: int = 10,
                 connect_timeout: float = 5, migrate: bool = True, pool_timeout: float = 30.0,
                 retry_timeout: float = 30.0) -> None:  # fmt: skip
        super().__init__()
        self.io_threads.limit = max(self.io_threads.limit or 1, pool_max)  # every pooled connection in use
        if not 0 <= pool_min <= pool_max or pool_max < 1:
            raise ValueError(f"pool_min={pool_min}, pool_max={pool_max}. Fix: 0 <= pool_min <= pool_max >= 1")
        self.dsn, self.ttl, self.auto_migrate = dsn, ttl, migrate
        self.pool_min, self.pool_max, self.pool_timeout = pool_min, pool_max, pool_timeout
        self.connect_timeout, self.retry_timeout = connect_timeout, retry_timeout
        self._identity = redact(dsn)
        params = conninfo_to_dict(dsn)
        params.setdefault("application_name", "tether")
        params["connect_timeout"] = str(max(1, round(connect_timeout)))
        self._conninfo = make_conninfo("", **params)
        self._lock, self._listen_lock = threading.Lock(), threading.Lock()
        self._pools: dict[int, ConnectionPool[Any]] = {}  # per process: a forked child makes its own
        self._ready_pid, self._closed = 0, False
        self._listener: tuple[int, Conn] | None = None

    @property
    def identity(self) -> str:
        return self._identity

    # --- Connections, retries and the schema
    def _pool(self) -> ConnectionPool[Any]:
        pid = os.getpid()
        with self._lock:
            if self._closed:
                raise TetherError(f"store {self.identity} is closed. Fix: open a new PostgresStore")
            if pid not in self._pools:  # a parent's pool is left alone: psycopg never closes it from here
                first_connect(self._conninfo, self.identity)  # one clear error, not the pool's retries
                self._pools[pid] = ConnectionPool(
                    self._conninfo, min_size=self.pool_min, max_size=self.pool_max, open=True,
                    kwargs={"autocommit": True}, timeout=self.pool_timeout, name=f"tether-{pid}",
                )  # fmt: skip
            return self._pools[pid]

    def _run(self, fn: Callable[[Conn, int], T], *, ready: bool = True, retry_for: float | None = None) -> T:
        """``fn(conn, attempt)`` on a pooled connection, again on a new one after a lost connection.

        ``attempt`` > 0 tells ``fn`` that an earlier attempt may have committed: it settles that outcome.
        """
        if ready and self._ready_pid != os.getpid():
            self._ensure_ready()
        attempt, deadline = 0, 0.0
        while True:
            try:
                with self._pool().connection() as conn:
                    return fn(conn, attempt)
            except PoolClosed:
                raise
            except (pg_errors.QueryCanceled, psycopg.ProgrammingError, psycopg.DataError) as exc:
                raise TetherError(f"PostgreSQL at {self.identity} refused: {str(exc).strip().splitlines()[0]}. "
                                  "Fix: check the DSN's database, user and schema (search_path)") from exc  # fmt: skip
            except psycopg.OperationalError as exc:
                now = time.monotonic()
                deadline = deadline or now + (self.retry_timeout if retry_for is None else retry_for)
                if now >= deadline or self._closed:
                    raise PostgresUnavailableError(f"PostgreSQL at {self.identity} was unreachable for "
                                                   f"{self.retry_timeout:g}s ({exc}). Fix: check that the server "
                                                   "runs and accepts connections, then retry") from exc  # fmt: skip
                log.info("PostgreSQL connection lost (%s); retrying", str(exc).strip()[:200])
                if attempt >= 2:  # dead pooled connections fail at once; a restarting server needs time
                    time.sleep(min(0.05 * 2 ** (attempt - 2), 1.0))
                attempt += 1

    def _ensure_ready(self) -> None:
        if self.auto_migrate:
            self.migrate()
            return
        version = self._run(schema_version, ready=False)
        refuse_newer(self.identity, version)
        if version < SCHEMA_VERSION:
            raise TetherError(f"{self.identity} has tether schema {version}; this tether needs {SCHEMA_VERSION}. "
                              "Fix: run tether db migrate --store URL, or pass migrate=True")  # fmt: skip
        self._ready_pid = os.getpid()

    def migrate(self) -> int:
        """Create or upgrade the schema (``tether db migrate``), serialized by an advisory lock; its version.

        Raises TetherError for a schema newer than this tether.
        """

        def apply(conn: Conn, attempt: int) -> int:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(hashtext('tether_schema:' || current_schema()))")
                conn.execute("CREATE TABLE IF NOT EXISTS tether_schema (version INTEGER PRIMARY KEY, "
                             "applied_at TIMESTAMPTZ NOT NULL DEFAULT now())")  # fmt: skip
                version = schema_version(conn, attempt)
                refuse_newer(self.identity, version)
                for number, statements in enumerate(MIGRATIONS[version:], start=version + 1):
                    for sql in statements:
                        conn.execute(sql)
                    conn.execute("INSERT INTO tether_schema (version) VALUES (%s)", (number,))
                    log.info("%s: applied tether schema migration %d", self.identity, number)
            return max(version, SCHEMA_VERSION)

        version = self._run(apply, ready=False)
        self._ready_pid = os.getpid()
        return version

    def close(self) -> None:
        """Close this process's pool and the listening connection."""
        with self._lock:
            self._closed = True
            pool = self._pools.pop(os.getpid(), None)
        if pool is not None:
            pool.close()
        if self._listen_lock.acquire(timeout=0.1):  # else a waiter holds it: it closes the connection itself
            try:
                if self._listener is not None and self._listener[0] == os.getpid():
                    with contextlib.suppress(Exception):
                        self._listener[1].close()
                self._listener = None
            finally:
                self._listen_lock.release()
        super().close()

    # --- Runs and the journal
    @staticmethod
    def _row(conn: Conn, run_id: str, columns: str, lock: str = "") -> Any:
        row = conn.execute(f"SELECT {columns} FROM runs WHERE id = %s{lock}", (run_id,)).fetchone()
        if row is None:
            raise RunNotFoundError(run_id)
        return row

    def _rows(self, run_id: str, sql: str, after: int) -> Rows:
        """A run's entries or inbox rows after a number; none: RunNotFoundError when there is no such run."""
        return self._run(lambda conn, _: conn.execute(sql, (run_id, after)).fetchall()
                         or [self._row(conn, run_id, "1")][1:])  # fmt: skip

    @staticmethod
    def _insert(conn: Conn, run_id: str, entries: Sequence[j.Entry]) -> None:
        rows = [(run_id, entry.seq, j.encode_entry(entry, run_id)) for entry in entries]
        conn.cursor().executemany("INSERT INTO entries (run_id, seq, body) VALUES (%s, %s, %s)", rows)

    @staticmethod
    def _notify(conn: Conn, root_id: str) -> None:
        conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, root_id))

    def create(self, run_id: str, entries: Sequence[j.Entry], info: dict[str, Any], *,
               owner: Owner | None = None, ttl: float | None = None) -> Lease | None:  # fmt: skip
        base.check_batch(j.validate_run_id(run_id), entries, 0)
        ttl, listing = self.ttl if ttl is None else ttl, listing_of(info)

        def attempt(conn: Conn, retry: int) -> Lease | None:
            try:
                with conn.transaction():
                    row = conn.execute(
                        "INSERT INTO runs (id, agent, status, turn, first_message, created_at, updated_at, "
                        "parent_id, root_id, info, length, inbox_consumed, lease_owner, lease_token, "
                        "lease_expires_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, "
                        f"CASE WHEN %s THEN now() + make_interval(secs => %s) END) RETURNING {EPOCH}",
                        (run_id, *listing, len(entries), int(info.get("inbox_consumed", -1)),
                         as_json(owner.to_dict()) if owner else None, 1 if owner else 0, owner is not None, ttl),
                    ).fetchone()  # fmt: skip
                    self._insert(conn, run_id, entries)
                    if owner is None and listing[1] == "running" and listing[6] is None:
                        self._notify(conn, run_id)  # a submitted run: wake a worker
            except pg_errors.UniqueViolation:
                if retry and self._created_by_us(conn, run_id, entries[0], owner):
                    return self._current_lease(conn, run_id, owner, ttl) if owner else None
                raise ValueError(f"run {run_id} already exists. Fix: store.load({run_id!r}), or pick another "
                                 "id") from None  # fmt: skip
            return Lease(run_id, 1, owner, row[0] if row else None, ttl) if owner else None

        return self._run(attempt)

    @staticmethod
    def _created_by_us(conn: Conn, run_id: str, first: j.Entry, owner: Owner | None) -> bool:
        """After a lost COMMIT: whether the stored run is the one this create wrote."""
        row = conn.execute("SELECT e.body, r.lease_owner FROM entries AS e JOIN runs AS r ON r.id = e.run_id "
                           "WHERE e.run_id = %s AND e.seq = 0", (run_id,)).fetchone()  # fmt: skip
        stored, held = (orjson.loads(row[0]), row[1]) if row else ({}, None)
        same = stored.get("w") == first.w and stored.get("h") == first.h
        return same and (owner is None or (held is not None and Owner.from_dict(held) == owner))

    @staticmethod
    def _current_lease(conn: Conn, run_id: str, owner: Owner, ttl: float | None) -> Lease:
        row = conn.execute(f"SELECT lease_token, {EPOCH} FROM runs WHERE id = %s", (run_id,)).fetchone()
        return Lease(run_id, int(row[0]) if row else 0, owner, row[1] if row else None, ttl)

    def append(self, run_id: str, entries: Sequence[j.Entry], *, expected_seq: int, writer: str,
               lease_token: int | None, info: dict[str, Any]) -> None:  # fmt: skip
        if entries:  # the fence below assumes n == expected_seq (a new append); plan_append rules otherwise
            base.check_batch(run_id, entries, expected_seq)
        listing, consumed = listing_of(info), int(info.get("inbox_consumed", -1))

        def attempt(conn: Conn, retry: int) -> builtins.list[j.Entry]:
            with conn.transaction():
                at, new = expected_seq, builtins.list(entries)
                for _ in range(3):  # the fence; zero rows: re-read, then refuse, or skip what is stored
                    if new:
                        cur = conn.execute(f"UPDATE runs SET {SET_LISTING}, length = %s, inbox_consumed = %s "
                                           f"WHERE id = %s AND length = %s AND lease_token = %s AND {LIVE}",
                                           (*listing, at + len(new), consumed, run_id, at, lease_token))  # fmt: skip
                        if cur.rowcount == 1:
                            break
                    at, new = self._unstored(conn, run_id, entries, expected_seq, lease_token)
                    if not new:
                        return []
                else:
                    raise kept_changing_error(run_id)
                if fp.ACTIVE and fp.hits("before_append", new):
                    fp.die()  # inside the transaction: the server rolls it back
                self._insert(conn, run_id, new)
                if fp.ACTIVE and fp.hits("torn_append", new):
                    fp.die()
            return new

        written = self._run(attempt)
        if written and fp.ACTIVE and fp.hits("after_append", written):
            fp.die()

    def _unstored(self, conn: Conn, run_id: str, entries: Sequence[j.Entry], expected_seq: int,
                  token: int | None) -> tuple[int, builtins.list[j.Entry]]:  # fmt: skip
        """Why the fence matched no row: raise, or return where to write and what is not stored yet."""
        n, current, live = self._row(conn, run_id, f"length, lease_token, {LIVE}")
        if token != current or not live:
            raise lease_lost_error(run_id, token, current)
        stored = functools.partial(self._stored, conn, run_id)
        return n, plan_append(run_id, entries, expected_seq=expected_seq, stored_length=n, stored=stored)

    @staticmethod
    def _stored(conn: Conn, run_id: str, first: int, end: int) -> builtins.list[Stored]:
        """The stored entries ``first <= seq < end`` of a retried append, read in the append's transaction."""
        rows = conn.execute("SELECT body FROM entries WHERE run_id = %s AND seq >= %s AND seq < %s ORDER BY seq",
                            (run_id, first, end)).fetchall()  # fmt: skip
        return [stored_body(run_id, bytes(body)) for (body,) in rows]

    def read(self, run_id: str, after_seq: int = -1) -> builtins.list[j.Entry]:
        after_seq = max(after_seq, -1)
        rows = self._rows(run_id, "SELECT seq, body FROM entries WHERE run_id = %s AND (seq = 0 OR seq > %s) "
                          "ORDER BY seq", after_seq)  # fmt: skip
        if after_seq < 0:
            return j.decode_journal(run_id, (bytes(body) for _, body in rows))
        version = orjson.loads(rows[0][1]).get("version") if rows and rows[0][0] == 0 else None
        out: builtins.list[j.Entry] = []
        for expected, (_, body) in enumerate((r for r in rows if r[0] > after_seq), start=after_seq + 1):
            entry = j.decode_entry(bytes(body), run_id, journal_version=version)
            if entry.seq != expected:
                raise CorruptJournalError(run_id, entry.seq, f"expected seq {expected} here")
            out.append(entry)
        return out

    def length(self, run_id: str) -> int:
        return int(self._run(lambda conn, _: self._row(conn, run_id, "length"))[0])

    # --- The inbox
    def post(self, run_id: str, item: dict[str, Any], *, item_id: str | None = None) -> int:
        item_id = item_id or str(item.get("item_id") or uuid.uuid4().hex)  # the same id across retries
        made = make_item(item, inbox_seq=0, item_id=item_id).to_dict()  # checks the type before any write

        def attempt(conn: Conn, retry: int) -> int:
            try:
                with conn.transaction():
                    row = conn.execute("UPDATE runs SET inbox_len = inbox_len + 1 WHERE id = %s RETURNING "
                                       "inbox_len, lease_owner, lease_expires_at, coalesce(root_id, id)",
                                       (run_id,)).fetchone()  # fmt: skip
                    if row is None:
                        raise RunNotFoundError(run_id)
                    seq = int(row[0]) - 1
                    if not conn.execute("INSERT INTO inbox (run_id, inbox_seq, item_id, body) VALUES (%s, %s, %s, "
                                        "%s) ON CONFLICT (run_id, item_id) DO NOTHING RETURNING inbox_seq",
                                        (run_id, seq, item_id, orjson.dumps({**made, "inbox_seq": seq}))
                                        ).fetchone():  # fmt: skip
                        raise _Posted()  # stored already: roll the count back, return the stored number
                    self._notify(conn, row[3])
                    return seq
            except _Posted:
                found = conn.execute("SELECT inbox_seq FROM inbox WHERE run_id = %s AND item_id = %s",
                                     (run_id, item_id)).fetchone()  # fmt: skip
                return int(found[0]) if found else attempt(conn, retry)

        return self._run(attempt)

    def read_inbox(self, run_id: str, after_seq: int = -1) -> builtins.list[InboxItem]:
        sql = "SELECT body FROM inbox WHERE run_id = %s AND inbox_seq > %s ORDER BY inbox_seq"
        return [InboxItem.from_dict(orjson.loads(body)) for (body,) in self._rows(run_id, sql, after_seq)]

    def inbox_length(self, run_id: str) -> int:
        return int(self._run(lambda conn, _: self._row(conn, run_id, "inbox_len"))[0])

    # --- Leases
    def _take(self, conn: Conn, run_id: str, owner: Owner, ttl: float | None,
              token: int | None = None) -> Lease | None:  # fmt: skip
        """New token, owner and expiry (only from ``token`` when given: a compare-and-swap)."""
        ttl = self.ttl if ttl is None else ttl
        cas = "" if token is None else " AND lease_token = %s AND lease_owner IS NOT NULL"
        row = conn.execute("UPDATE runs SET lease_token = lease_token + 1, lease_owner = %s, lease_expires_at = "
                           f"now() + make_interval(secs => %s) WHERE id = %s{cas} RETURNING lease_token, {EPOCH}",
                           [as_json(owner.to_dict()), ttl, run_id, *([] if token is None else [token])]
                           ).fetchone()  # fmt: skip
        return None if row is None else Lease(run_id, int(row[0]), owner, row[1], ttl)

    def claim(self, run_id: str, owner: Owner, ttl: float | None = None) -> Lease:
        def attempt(conn: Conn, retry: int) -> Lease:
            with conn.transaction():
                holder = holding(*self._row(conn, run_id, f"lease_owner, {LIVE}", " FOR UPDATE"))
                if holder is not None and retry and holder == owner:  # our own claim, its COMMIT cut off
                    return self._current_lease(conn, run_id, owner, self.ttl if ttl is None else ttl)
                if holder is not None:
                    raise busy_error(run_id, holder)
                return self._take(conn, run_id, owner, ttl)  # type: ignore[return-value]

        return self._run(attempt)

    def claim_next(self, owner: Owner, ttl: float | None = None,
                   agents: Collection[str] | None = None) -> Lease | None:  # fmt: skip
        """See ``Store.claim_next``: one short transaction, ``FOR UPDATE SKIP LOCKED`` on the oldest free root
        needing work, then a new token and expiry. A root held by a dead process of this host is taken too
        (compare-and-swap on its token)."""
        names = None if agents is None else [str(a) for a in agents]
        if names is not None and not names:
            return None
        only, params = ("", []) if names is None else (" AND agent = ANY(%s)", [names])

        def attempt(conn: Conn, retry: int) -> Lease | None:
            if retry:  # a claim whose COMMIT was cut off: is a root held by this owner?
                row = conn.execute(f"SELECT id FROM runs WHERE parent_id IS NULL AND lease_owner = %s AND {LIVE}",
                                   (as_json(owner.to_dict()),)).fetchone()  # fmt: skip
                if row is not None:
                    return self._current_lease(conn, row[0], owner, self.ttl if ttl is None else ttl)
            with conn.transaction():
                row = conn.execute(f"SELECT id FROM runs AS r WHERE {WORK} AND {FREE} AND {NEEDS}{only} "
                                   "ORDER BY updated_at, id LIMIT 1 FOR UPDATE OF r SKIP LOCKED", params
                                   ).fetchone()  # fmt: skip
                if row is not None:
                    return self._take(conn, row[0], owner, ttl)
            held = conn.execute(  # held by a process of this host: taken at once if that process is dead
                f"SELECT id, lease_token, lease_owner FROM runs AS r WHERE {WORK} AND {LIVE} AND "
                "lease_owner->>'host' = %s AND (status = 'running' OR inbox_len > inbox_consumed + 1)"
                f"{only} ORDER BY updated_at, id LIMIT 50", [owner.host, *params]).fetchall()  # fmt: skip
            for run_id, token, raw in held:
                if holding(raw, True) is None and (
                    lease := self._take(conn, run_id, owner, ttl, token=token)
                ):
                    return lease
            return None

        return self._run(attempt)

    def renew(self, lease: Lease) -> Lease:
        def attempt(conn: Conn, retry: int) -> Lease:
            row = conn.execute("UPDATE runs SET lease_expires_at = now() + make_interval(secs => %s) WHERE id = %s "
                               f"AND lease_token = %s AND lease_owner IS NOT NULL RETURNING {EPOCH}",
                               (lease.ttl if lease.ttl is not None else self.ttl, lease.run_id, lease.token)
                               ).fetchone()  # fmt: skip
            if row is None:
                raise lease_lost_error(lease.run_id, lease.token)
            return Lease(lease.run_id, lease.token, lease.owner, row[0], lease.ttl)

        return self._run(attempt, retry_for=(lease.ttl or self.ttl or 30.0) / 4)  # the renewer tries again

    def _free(self, lease: Lease, condition: str, params: Sequence[Any]) -> bool:
        """Drop the lease where ``condition`` holds; NOTIFY when the run is left needing work."""

        def attempt(conn: Conn, retry: int) -> bool:
            with conn.transaction():
                row = conn.execute("UPDATE runs SET lease_owner = NULL, lease_expires_at = NULL WHERE id = %s AND "
                                   f"lease_token = %s{condition} RETURNING status = 'running' OR inbox_len > "
                                   "inbox_consumed + 1, coalesce(root_id, id)", (lease.run_id, lease.token, *params)
                                   ).fetchone()  # fmt: skip
                if row is not None and row[0]:
                    self._notify(conn, row[1])
                return row is not None or self._row(conn, lease.run_id, "lease_token")[0] != lease.token

        return self._run(attempt)

    def release(self, lease: Lease, *, at_seq: int, inbox_len: int) -> bool:
        return self._free(lease, " AND length = %s AND inbox_len = %s", (at_seq, inbox_len))

    def abandon(self, lease: Lease) -> None:
        try:
            self._free(lease, "", ())
        except Exception as exc:  # never raises: the lease expires on its own
            log.warning("abandoning run %s failed: %s", lease.run_id, exc)

    def holder(self, run_id: str) -> Owner | None:
        return holding(*self._run(lambda conn, _: self._row(conn, run_id, f"lease_owner, {LIVE}")))

    def wait_for_work(self, timeout: float) -> bool:
        """Block until a NOTIFY on ``tether_work`` or ``timeout`` seconds; True when woken (for workers).

        Listens on a dedicated connection (never one of the pool), made on the first call, which returns
        True at once: anything posted before it was not heard, so look now. A lost connection returns True
        too and is made again on the next call.
        """
        with self._listen_lock:
            if self._closed:
                return False
            if self._listener is None or self._listener[0] != os.getpid() or self._listener[1].closed:
                try:
                    conn = psycopg.Connection.connect(self._conninfo, autocommit=True)
                    conn.execute(f"LISTEN {CHANNEL}")
                except psycopg.OperationalError as exc:
                    log.warning("listening on %s failed (%s); polling", self.identity, exc)
                    time.sleep(min(timeout, 1.0))
                    return True
                self._listener = (os.getpid(), conn)
                return True
            conn, deadline, woken = self._listener[1], time.monotonic() + timeout, False
            try:
                while not woken and not self._closed and (left := deadline - time.monotonic()) > 0:
                    woken = any(True for _ in conn.notifies(timeout=min(left, 1.0), stop_after=1))
                while woken and not self._closed and any(True for _ in conn.notifies(timeout=0.001)):
                    pass  # one wake-up for a burst
            except psycopg.OperationalError as exc:
                log.info("listening connection lost (%s); listening again", exc)
                woken = True
            if self._closed or conn.broken:
                with contextlib.suppress(Exception):
                    conn.close()
            return woken

    # --- Listing and removal
    def delete(self, run_id: str, *, children: bool = False) -> None:
        def attempt(conn: Conn, retry: int) -> None:
            with conn.transaction():
                rows = conn.execute(f"SELECT {LISTED} FROM runs WHERE id = %s OR root_id = (SELECT root_id FROM "
                                    "runs WHERE id = %s) OR id = (SELECT parent_id FROM runs WHERE id = %s) "
                                    "ORDER BY id FOR UPDATE", (run_id, run_id, run_id)).fetchall()  # fmt: skip
                if retry and not any(row[0] == run_id for row in rows):
                    return  # our own delete, whose COMMIT was cut off
                ids = base.plan_delete([info_of(row) for row in rows], run_id, children)
                for row in rows:
                    if row[0] in ids and (holder := holding(row[9], row[11])):
                        raise busy_error(row[0], holder)
                conn.execute("DELETE FROM runs WHERE id = ANY(%s)", (ids,))

        self._run(attempt)

    def prune(self, older_than: datetime | timedelta | str, *, statuses: Sequence[str] = j.STOP_STATUSES,
              children: bool = False, dry_run: bool = False) -> builtins.list[str]:  # fmt: skip
        wanted, cutoff = builtins.list(base.check_prune_statuses(statuses)), base.as_cutoff(older_than)
        sql = (  # roots, each with every run of its tree stopped and free (only with children=True)
            f"SELECT id FROM runs AS r WHERE parent_id IS NULL AND status = ANY(%s) AND updated_at < %s AND "
            f"{FREE} AND inbox_len <= inbox_consumed + 1 AND NOT EXISTS (SELECT 1 FROM runs AS c WHERE "
            f"c.root_id = r.id AND c.parent_id IS NOT NULL AND ({'' if children else 'TRUE OR '}c.status <> "
            "ALL(%s) OR (c.lease_owner IS NOT NULL AND c.lease_expires_at > now()))) "
            "ORDER BY updated_at, id FOR UPDATE OF r SKIP LOCKED"
        )

        def attempt(conn: Conn, retry: int) -> builtins.list[str]:
            out: builtins.list[str] = []
            with conn.transaction():
                for (root,) in conn.execute(sql, (wanted, cutoff, builtins.list(j.STOP_STATUSES))).fetchall():
                    out += [root, *(kid for (kid,) in conn.execute(
                        "SELECT id FROM runs WHERE root_id = %s AND parent_id IS NOT NULL ORDER BY updated_at, "
                        "id FOR UPDATE", (root,)).fetchall())]  # fmt: skip
                if out and not dry_run:
                    conn.execute("DELETE FROM runs WHERE id = ANY(%s)", (out,))
            return out

        return self._run(attempt)

    def list(self, *, status: str | None = None, agent: str | None = None, parent_id: str | None = None,
             root_id: str | None = None, updated_before: datetime | str | None = None,
             updated_after: datetime | str | None = None, limit: int = 100,
             cursor: str | None = None, metadata: Mapping[str, str] | None = None) -> builtins.list[RunInfo]:  # fmt: skip
        query = ListQuery.of(status=status, agent=agent, parent_id=parent_id, root_id=root_id,
                             updated_before=updated_before, updated_after=updated_after, cursor=cursor,
                             metadata=metadata)  # fmt: skip
        here = query.cursor
        where: builtins.list[tuple[str, Any]] = [
            (f"{column} = %s", value) for column, value in query.equal.items()
        ]
        if query.metadata:
            where.append((HAS_METADATA, as_json(query.metadata)))
        where += [(f"updated_at {op} %s", bound) for op, bound in (("<", query.before), (">", query.after))
                  if bound is not None]  # fmt: skip
        if here.since is not None:
            where.append(("updated_at > %s", here.since))
        if here.id is not None:  # the keyset: before (at, id), newest first
            where.append(("(updated_at, id) < (%s, %s)", (here.at, here.id)))
        params = [p for _, value in where for p in (value if isinstance(value, tuple) else (value,))]
        sql = f"SELECT {LISTED} FROM runs" + (" WHERE " + " AND ".join(c for c, _ in where) if where else "")
        sql += " ORDER BY updated_at DESC, id DESC LIMIT %s"
        rows = self._run(lambda conn, _: conn.execute(sql, [*params, max(int(limit), 0)]).fetchall())
        return [info_of(row) for row in rows]


class _Posted(Exception):
    """Raised inside a post's transaction when its item_id is stored already (rolls the count back)."""
