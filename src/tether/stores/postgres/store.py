"""PostgresStore: runs in PostgreSQL, shared by processes on many machines (DESIGN 8.2, 11; DURABILITY 2-4).

SQLiteStore's three tables (``runs``, ``entries``, ``inbox``) in a schema of its own (``schema``, default
``tether``; ``?schema=NAME`` in the URL), every statement qualified with it, versioned in
``<schema>.tether_schema`` and migrated on first use. Numbers come from the run's row: ``post`` is
``UPDATE runs SET inbox_len = inbox_len + 1 … RETURNING`` plus the INSERT, one transaction; an append is
fenced by ``UPDATE runs … WHERE id AND length AND lease_token AND lease_expires_at > now()`` before its
INSERT, one transaction (one statement in autocommit, one round trip, returning the inbox's length too:
``_primitives.append``); claims are short transactions (``FOR UPDATE SKIP LOCKED`` on roots needing work,
then a new token and expiry), so no row lock is held during a run. Lease expiry is judged by the server's
clock. Posts, submitted runs and runs given up with work left ``NOTIFY tether_work`` (payload: the root's
id); ``wait_for_work`` listens on a dedicated connection. ``updated_at`` is kept as the writer's ISO string
(``COLLATE "C"``), so listing bounds and cursors compare exactly as ``ListCursor`` does.

Both faces are native: each primitive is one coroutine in ``_primitives.py``, run over a sync pooled
connection (``read``) or awaited over psycopg's ``AsyncConnectionPool`` (``aread``; one pool per event loop).
A lost connection (a restarted server, a killed backend, an idle connection dropped) is retried on a new
one for up to ``retry_timeout`` seconds, each retry settling an unknown outcome: appends by the same-writer
rule, posts by ``item_id``, claims and creates by finding their own lease or entries. psycopg 3 and
psycopg_pool are imported only in this package: ``pip install tether[postgres]``.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import logging
import os
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Collection, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

import psycopg
from psycopg import errors as pg_errors
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolClosed

from ... import journal as j
from ...errors import TetherError
from ...inbox import InboxItem, make_item
from .. import _failpoints as fp
from .. import base
from .._listing import ListQuery
from ..base import Lease, Owner, RunInfo, Store, run_sync
from . import _primitives as p
from . import _schema
from ._conn import AsyncCx, Cx, SyncCx
from ._connect import first_connect
from ._listen import Listener
from ._sql import (
    CHANNEL,
    HAS_METADATA,
    LISTED,
    LIVE,
    SCHEMA_VERSION,
    PostgresUnavailableError,
    Tables,
    as_json,
    holding,
    info_of,
    listing_of,
    redact,
    refuse_newer,
    split_schema,
)

__all__ = ["CHANNEL", "SCHEMA_VERSION", "PostgresStore", "PostgresUnavailableError"]

log = logging.getLogger(__name__)
T = TypeVar("T")
Attempt = Callable[[Cx, int], Coroutine[Any, Any, T]]
"""One attempt of an operation on a connection; the int is the retry number (> 0: settle an unknown outcome)."""


class PostgresStore(Store):
    """Runs in PostgreSQL; safe for many threads, processes, machines and event loops.

    Args:
        dsn: a libpq connection string or ``postgresql://`` URL; ``?schema=NAME`` in a URL names the schema.
        schema: the schema of tether's tables (created by the migrations). Default: the URL's ``?schema=``,
            else ``tether``. With neither named, tether's tables found in the connection's default schema
            (``public``, where a tether before schemas kept them) are an error naming the fix.
        ttl: the default lease length in seconds, judged by the server's clock (a holder renews every ttl/4).
        pool_min, pool_max: each connection pool's size (one sync pool per process, one async pool per
            event loop that awaits the store; an async pool connects on demand, up to ``pool_max``).
        connect_timeout: seconds to wait for a new connection.
        migrate: create or upgrade the schema on first use; False only checks it (``tether db migrate``).
        pool_timeout: seconds to wait for a free connection of the pool.
        retry_timeout: how long an operation retries after lost connections before it raises
            PostgresUnavailableError.

    Nothing connects until the first use, which raises TetherError for a schema newer than this tether (or
    one missing or older with ``migrate=False``, or tether's tables left in the connection's default schema).

    Raises:
        ValueError: a schema name that is not a plain identifier, or pool sizes that do not fit.
    """

    ttl: float | None = 30.0
    append_reads_inbox = True  # the fence's UPDATE returns inbox_len (one statement: _primitives.append)

    def __init__(self, dsn: str, *, schema: str | None = None, ttl: float = 30.0, pool_min: int = 1,
                 pool_max: int = 10, connect_timeout: float = 5, migrate: bool = True, pool_timeout: float = 30.0,
                 retry_timeout: float = 30.0) -> None:  # fmt: skip
        super().__init__()
        self.io_threads.limit = max(self.io_threads.limit or 1, pool_max)  # every pooled connection in use
        if not 0 <= pool_min <= pool_max or pool_max < 1:
            raise ValueError(f"pool_min={pool_min}, pool_max={pool_max}. Fix: 0 <= pool_min <= pool_max >= 1")
        dsn, self.schema, named = split_schema(dsn, schema)
        self.dsn, self.ttl, self.auto_migrate = dsn, ttl, migrate
        self.pool_min, self.pool_max, self.pool_timeout = pool_min, pool_max, pool_timeout
        self.connect_timeout, self.retry_timeout = connect_timeout, retry_timeout
        self._identity = redact(dsn, self.schema)
        self._t = Tables.of(self.schema)
        self._old_place_checked = (
            named  # a schema chosen by name is meant: no tables are looked for elsewhere
        )
        params = conninfo_to_dict(dsn)
        params.setdefault("application_name", "tether")
        params["connect_timeout"] = str(max(1, round(connect_timeout)))
        self._conninfo = make_conninfo("", **params)
        self._lock = threading.Lock()
        self._pools: dict[int, ConnectionPool[Any]] = {}  # per process: a forked child makes its own
        self._apools: dict[asyncio.AbstractEventLoop, _LoopPool] = {}  # an async connection is its loop's
        self._ready_pid, self._closed = 0, False
        self._listener = Listener(self._conninfo, self._identity)

    @property
    def identity(self) -> str:
        return self._identity

    # --- Connections, retries and the schema
    def _pool(self) -> ConnectionPool[Any]:
        pid = os.getpid()
        with self._lock:
            self._check_open()
            if pid not in self._pools:  # a parent's pool is left alone: psycopg never closes it from here
                first_connect(self._conninfo, self.identity)  # one clear error, not the pool's retries
                self._pools[pid] = ConnectionPool(
                    self._conninfo, min_size=self.pool_min, max_size=self.pool_max, open=True,
                    kwargs={"autocommit": True}, timeout=self.pool_timeout, name=f"tether-{pid}",
                )  # fmt: skip
            return self._pools[pid]

    async def _apool(self) -> AsyncConnectionPool[Any]:
        loop = asyncio.get_running_loop()
        mine = self._apools.get(loop)
        if mine is not None and mine.pid == os.getpid() and not mine.pool.closed and not self._closed:
            return mine.pool
        with self._lock:
            self._check_open()
            self._drop_dead_pools()
            mine = self._apools.get(loop)
            if mine is None or mine.pid != os.getpid():  # a parent's pool is left alone, as in ``_pool``
                made: weakref.WeakSet[Any] = weakref.WeakSet()

                async def configure(conn: Any) -> None:
                    made.add(conn)

                pool = AsyncConnectionPool(  # min_size 0: no background connect left running when a loop ends
                    self._conninfo, min_size=0, max_size=self.pool_max, open=False, configure=configure,
                    kwargs={"autocommit": True}, timeout=self.pool_timeout, name=f"tether-async-{os.getpid()}",
                )  # fmt: skip
                mine = self._apools[loop] = _LoopPool(os.getpid(), pool, made)
        await mine.pool.open()  # the first caller opens it; others wait for it here
        return mine.pool

    def _drop_dead_pools(self) -> None:
        """Close the connections of the async pools whose event loop has closed (``asyncio.run`` ended), under
        ``_lock``: no loop is left to close them, and each would hold its connections until exit."""
        for loop in [loop for loop in self._apools if loop.is_closed()]:
            mine = self._apools.pop(loop)
            for conn in builtins.list(mine.made) if mine.pid == os.getpid() else ():
                with contextlib.suppress(Exception):
                    conn.pgconn.finish()  # the socket closes at once; no loop is needed

    def _check_open(self) -> None:
        if self._closed:
            raise TetherError(f"store {self.identity} is closed. Fix: open a new PostgresStore")

    def _run(self, fn: Attempt[T], *, ready: bool = True, retry_for: float | None = None) -> T:
        """``fn(cx, attempt)`` on a pooled connection, again on a new one after a lost connection."""
        if ready and self._ready_pid != os.getpid():
            self._ensure_ready()
        tries = _Tries(self, retry_for)
        while True:
            try:
                with self._pool().connection() as conn:
                    return run_sync(fn(SyncCx(conn), tries.attempt))
            except (PoolClosed, TetherError):
                raise
            except psycopg.Error as exc:
                time.sleep(tries.failed(exc))

    async def _arun(self, fn: Attempt[T], *, ready: bool = True, retry_for: float | None = None) -> T:
        """``_run`` awaited, on this event loop's async pool. A cancelled task's statement is cancelled and
        its connection discarded (``AsyncCx``): the pool stays good."""
        if ready and self._ready_pid != os.getpid():
            await self.run_io(self._ensure_ready)
        tries = _Tries(self, retry_for)
        while True:
            try:
                async with (await self._apool()).connection() as conn:
                    return await fn(AsyncCx(conn), tries.attempt)
            except (PoolClosed, TetherError):
                raise
            except psycopg.Error as exc:
                await asyncio.sleep(tries.failed(exc))

    def _ensure_ready(self) -> None:
        if self.auto_migrate:
            self.migrate()
            return
        version = self._run(lambda cx, _: p.schema_version(cx, self._t), ready=False)
        refuse_newer(self.identity, version)
        if (
            version == 0
            and not self._old_place_checked
            and (old := self._run(lambda cx, _: _schema.old_place(cx, self._t), ready=False))
        ):
            raise _schema.old_place_error(self.identity, self._t, old)
        if version < SCHEMA_VERSION:
            raise TetherError(f"{self.identity} has tether schema {version}; this tether needs {SCHEMA_VERSION}. "
                              "Fix: run tether db migrate --store URL, or pass migrate=True")  # fmt: skip
        self._ready_pid = os.getpid()

    def migrate(self, *, move_from: str | None = None) -> int:
        """Create (with its schema) or upgrade the tables (``tether db migrate``), serialized by an advisory
        lock; returns the version. ``move_from`` first moves tether's tables out of that schema (the old
        place, ``public`` for a tether before schemas), in the same transaction.

        Raises:
            TetherError: a schema newer than this tether; tether's tables found in the connection's default
                schema (the error names them and the fix); nothing to move from ``move_from``.
        """
        check = not self._old_place_checked
        version = self._run(lambda cx, _: _schema.migrate(cx, self._t, self.identity, move_from, check),
                            ready=False)  # fmt: skip
        self._ready_pid = os.getpid()
        return version

    def close(self) -> None:
        """Close this process's sync pool, the listening connection, and the async pools of event loops that
        are not running (``agent.run``'s loop between runs); ``aclose`` closes the pool of the loop it is
        awaited on, and a pool whose loop runs elsewhere closes with that loop."""
        with self._lock:
            self._closed = True
            pool = self._pools.pop(os.getpid(), None)
            self._drop_dead_pools()
            idle = [
                (loop, self._apools.pop(loop))
                for loop in builtins.list(self._apools)
                if not loop.is_running()
            ]
        if pool is not None:
            pool.close()
        for loop, mine in idle:
            self._close_idle_pool(loop, mine)
        self._listener.close()
        super().close()

    @staticmethod
    def _close_idle_pool(loop: asyncio.AbstractEventLoop, mine: _LoopPool) -> None:
        """Close an async pool whose loop is not running, on that loop: its worker tasks end and its
        connections close now, instead of the loop's pending tasks being reported when it is collected."""
        if mine.pid != os.getpid():
            return  # a parent's pool is left alone, as in ``_pool``
        try:
            loop.run_until_complete(mine.pool.close())
        except RuntimeError:  # the loop started meanwhile in another thread: finish the sockets only
            for conn in builtins.list(mine.made):
                with contextlib.suppress(Exception):
                    conn.pgconn.finish()

    async def aclose(self) -> None:
        """Close this event loop's async pool, then everything ``close`` closes."""
        await self.aclose_loop()
        await self.run_io(self.close)

    async def aclose_loop(self) -> None:
        """Close this event loop's async pool (see ``Store.aclose_loop``)."""
        with self._lock:
            mine = self._apools.pop(asyncio.get_running_loop(), None)
        if mine is not None and mine.pid == os.getpid():
            await mine.pool.close()

    # --- The primitives: one attempt each (``_primitives``), run by either face
    def _create(self, run_id: str, entries: Sequence[j.Entry], info: dict[str, Any], owner: Owner | None,
                ttl: float | None) -> Attempt[Lease | None]:  # fmt: skip
        base.check_batch(j.validate_run_id(run_id), entries, 0)
        ttl, listing = self.ttl if ttl is None else ttl, listing_of(info)
        return lambda cx, retry: p.create(cx, self._t, retry, run_id, entries, info, listing, owner, ttl)

    def create(self, run_id: str, entries: Sequence[j.Entry], info: dict[str, Any], *,
               owner: Owner | None = None, ttl: float | None = None) -> Lease | None:  # fmt: skip
        return self._run(self._create(run_id, entries, info, owner, ttl))

    async def acreate(self, run_id: str, entries: Sequence[j.Entry], info: dict[str, Any], *,
                      owner: Owner | None = None, ttl: float | None = None) -> Lease | None:  # fmt: skip
        return await self._arun(self._create(run_id, entries, info, owner, ttl))

    def _append(self, run_id: str, entries: Sequence[j.Entry], expected_seq: int, lease_token: int | None,
                info: dict[str, Any]) -> Attempt[tuple[builtins.list[j.Entry], int]]:  # fmt: skip
        if entries:  # the fence assumes n == expected_seq (a new append); plan_append rules otherwise
            base.check_batch(run_id, entries, expected_seq)
        listing, consumed = listing_of(info), int(info.get("inbox_consumed", -1))
        return lambda cx, _: p.append(
            cx, self._t, run_id, entries, expected_seq, lease_token, listing, consumed
        )

    def append(self, run_id: str, entries: Sequence[j.Entry], *, expected_seq: int, writer: str,
               lease_token: int | None, info: dict[str, Any]) -> int:  # fmt: skip
        """See ``Store.append``; returns the inbox's length, read in the append's transaction."""
        return _after_append(*self._run(self._append(run_id, entries, expected_seq, lease_token, info)))

    async def aappend(self, run_id: str, entries: Sequence[j.Entry], *, expected_seq: int, writer: str,
                      lease_token: int | None, info: dict[str, Any]) -> int:  # fmt: skip
        return _after_append(
            *await self._arun(self._append(run_id, entries, expected_seq, lease_token, info))
        )

    def _read(self, run_id: str, after_seq: int) -> Attempt[builtins.list[j.Entry]]:
        return lambda cx, _: p.read(cx, self._t, run_id, max(after_seq, -1))

    def read(self, run_id: str, after_seq: int = -1) -> builtins.list[j.Entry]:
        return self._run(self._read(run_id, after_seq))

    async def aread(self, run_id: str, after_seq: int = -1) -> builtins.list[j.Entry]:
        return await self._arun(self._read(run_id, after_seq))

    def _column(self, run_id: str, column: str) -> Attempt[Any]:
        async def attempt(cx: Cx, _: int) -> Any:
            return (await p.row(cx, self._t, run_id, column))[0]

        return attempt

    def length(self, run_id: str) -> int:
        return int(self._run(self._column(run_id, "length")))

    async def alength(self, run_id: str) -> int:
        return int(await self._arun(self._column(run_id, "length")))

    def _post(self, run_id: str, item: dict[str, Any], item_id: str | None) -> Attempt[int]:
        item_id = item_id or str(item.get("item_id") or uuid.uuid4().hex)  # the same id across retries
        made = make_item(item, inbox_seq=0, item_id=item_id).to_dict()  # checks the type before any write
        return lambda cx, _: p.post(cx, self._t, run_id, item_id, made)

    def post(self, run_id: str, item: dict[str, Any], *, item_id: str | None = None) -> int:
        return self._run(self._post(run_id, item, item_id))

    async def apost(self, run_id: str, item: dict[str, Any], *, item_id: str | None = None) -> int:
        return await self._arun(self._post(run_id, item, item_id))

    def _read_inbox(self, run_id: str, after_seq: int) -> Attempt[builtins.list[InboxItem]]:
        return lambda cx, _: p.read_inbox(cx, self._t, run_id, after_seq)

    def read_inbox(self, run_id: str, after_seq: int = -1) -> builtins.list[InboxItem]:
        return self._run(self._read_inbox(run_id, after_seq))

    async def aread_inbox(self, run_id: str, after_seq: int = -1) -> builtins.list[InboxItem]:
        return await self._arun(self._read_inbox(run_id, after_seq))

    def inbox_length(self, run_id: str) -> int:
        return int(self._run(self._column(run_id, "inbox_len")))

    async def ainbox_length(self, run_id: str) -> int:
        return int(await self._arun(self._column(run_id, "inbox_len")))

    # --- Leases
    def _claim(self, run_id: str, owner: Owner, ttl: float | None) -> Attempt[Lease]:
        ttl = self.ttl if ttl is None else ttl
        return lambda cx, retry: p.claim(cx, self._t, retry, run_id, owner, ttl)  # type: ignore[arg-type]

    def claim(self, run_id: str, owner: Owner, ttl: float | None = None) -> Lease:
        return self._run(self._claim(run_id, owner, ttl))

    async def aclaim(self, run_id: str, owner: Owner, ttl: float | None = None) -> Lease:
        return await self._arun(self._claim(run_id, owner, ttl))

    def _claim_next(
        self, owner: Owner, ttl: float | None, agents: Collection[str] | None
    ) -> Attempt[Lease | None] | None:
        names = None if agents is None else [str(a) for a in agents]
        if names is not None and not names:
            return None
        ttl = self.ttl if ttl is None else ttl
        return lambda cx, retry: p.claim_next(cx, self._t, retry, owner, ttl, names)  # type: ignore[arg-type]

    def claim_next(self, owner: Owner, ttl: float | None = None,
                   agents: Collection[str] | None = None) -> Lease | None:  # fmt: skip
        """See ``Store.claim_next`` (``_primitives.claim_next`` says how)."""
        attempt = self._claim_next(owner, ttl, agents)
        return None if attempt is None else self._run(attempt)

    async def aclaim_next(self, owner: Owner, ttl: float | None = None,
                          agents: Collection[str] | None = None) -> Lease | None:  # fmt: skip
        attempt = self._claim_next(owner, ttl, agents)
        return None if attempt is None else await self._arun(attempt)

    def _claim_next_batch(self, owners: Sequence[Owner], ttl: float | None,
                          agents: Collection[str] | None) -> Attempt[builtins.list[Lease]] | None:  # fmt: skip
        names = None if agents is None else [str(a) for a in agents]
        if not owners or (names is not None and not names):
            return None
        ttl, owners = self.ttl if ttl is None else ttl, builtins.list(owners)
        return lambda cx, retry: p.claim_next_batch(cx, self._t, retry, owners, ttl, names)  # type: ignore[arg-type]

    def claim_next_batch(self, owners: Sequence[Owner], ttl: float | None = None,
                         agents: Collection[str] | None = None) -> builtins.list[Lease]:  # fmt: skip
        """``claim_next`` for several owners in one statement (a Worker's free slots, one commit): up to one
        root per owner (fewer: no more were free), each held by the owner it is paired with (``Lease.owner``)."""
        attempt = self._claim_next_batch(owners, ttl, agents)
        return [] if attempt is None else self._run(attempt)

    async def aclaim_next_batch(self, owners: Sequence[Owner], ttl: float | None = None,
                                agents: Collection[str] | None = None) -> builtins.list[Lease]:  # fmt: skip
        attempt = self._claim_next_batch(owners, ttl, agents)
        return [] if attempt is None else await self._arun(attempt)

    def _renew(self, lease: Lease) -> tuple[Attempt[Lease], float]:
        ttl = lease.ttl if lease.ttl is not None else self.ttl or 30.0
        return (lambda cx, _: p.renew(cx, self._t, lease, ttl)), ttl / 4  # the renewer tries again after

    def renew(self, lease: Lease) -> Lease:
        attempt, retry_for = self._renew(lease)
        return self._run(attempt, retry_for=retry_for)

    async def arenew(self, lease: Lease) -> Lease:
        attempt, retry_for = self._renew(lease)
        return await self._arun(attempt, retry_for=retry_for)

    def _release(self, lease: Lease, at_seq: int, inbox_len: int) -> Attempt[bool]:
        return lambda cx, _: p.free(
            cx, self._t, lease, " AND length = %s AND inbox_len = %s", (at_seq, inbox_len)
        )

    def release(self, lease: Lease, *, at_seq: int, inbox_len: int) -> bool:
        return self._run(self._release(lease, at_seq, inbox_len))

    async def arelease(self, lease: Lease, *, at_seq: int, inbox_len: int) -> bool:
        return await self._arun(self._release(lease, at_seq, inbox_len))

    def abandon(self, lease: Lease) -> None:
        try:
            self._run(lambda cx, _: p.free(cx, self._t, lease, "", ()))
        except Exception as exc:  # never raises: the lease expires on its own
            log.warning("abandoning run %s failed: %s", lease.run_id, exc)

    async def aabandon(self, lease: Lease) -> None:
        try:
            await self._arun(lambda cx, _: p.free(cx, self._t, lease, "", ()))
        except Exception as exc:  # never raises: the lease expires on its own
            log.warning("abandoning run %s failed: %s", lease.run_id, exc)

    def _holder(self, run_id: str) -> Attempt[Owner | None]:
        async def attempt(cx: Cx, _: int) -> Owner | None:
            return holding(*await p.row(cx, self._t, run_id, f"lease_owner, {LIVE}"))

        return attempt

    def holder(self, run_id: str) -> Owner | None:
        return self._run(self._holder(run_id))

    async def aholder(self, run_id: str) -> Owner | None:
        return await self._arun(self._holder(run_id))

    def wait_for_work(self, timeout: float) -> bool:
        """Block until a NOTIFY on ``tether_work`` or ``timeout`` seconds; True when woken (for workers).

        Listens on a dedicated connection (never one of the pool), made on the first call, which returns
        True at once: anything posted before it was not heard, so look now. A lost connection returns True
        too and is made again on the next call.
        """
        return self._listener.wait(timeout, lambda: self._closed)

    # --- Listing and removal
    def delete(self, run_id: str, *, children: bool = False) -> None:
        self._run(lambda cx, retry: p.delete(cx, self._t, retry, run_id, children, LISTED))

    async def adelete(self, run_id: str, *, children: bool = False) -> None:
        await self._arun(lambda cx, retry: p.delete(cx, self._t, retry, run_id, children, LISTED))

    def _prune(self, older_than: datetime | timedelta | str, statuses: Sequence[str], children: bool,
               dry_run: bool) -> Attempt[builtins.list[str]]:  # fmt: skip
        wanted, cutoff = builtins.list(base.check_prune_statuses(statuses)), base.as_cutoff(older_than)
        return lambda cx, _: p.prune(cx, self._t, wanted, cutoff, children, dry_run)

    def prune(self, older_than: datetime | timedelta | str, *, statuses: Sequence[str] = j.STOP_STATUSES,
              children: bool = False, dry_run: bool = False) -> builtins.list[str]:  # fmt: skip
        return self._run(self._prune(older_than, statuses, children, dry_run))

    async def aprune(self, older_than: datetime | timedelta | str, *, statuses: Sequence[str] = j.STOP_STATUSES,
                     children: bool = False, dry_run: bool = False) -> builtins.list[str]:  # fmt: skip
        return await self._arun(self._prune(older_than, statuses, children, dry_run))

    def _list(self, **filters: Any) -> Attempt[builtins.list[RunInfo]]:
        limit = filters.pop("limit", 100)
        query = ListQuery.of(**filters)
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
        params = [v for _, value in where for v in (value if isinstance(value, tuple) else (value,))]
        sql = f"SELECT {LISTED} FROM {self._t.runs}" + (
            " WHERE " + " AND ".join(c for c, _ in where) if where else ""
        )
        sql += " ORDER BY updated_at DESC, id DESC LIMIT %s"

        async def attempt(cx: Cx, _: int) -> builtins.list[RunInfo]:
            return [info_of(row) for row in await cx.all(sql, [*params, max(int(limit), 0)])]

        return attempt

    def list(self, *, status: str | None = None, agent: str | None = None, parent_id: str | None = None,
             root_id: str | None = None, updated_before: datetime | str | None = None,
             updated_after: datetime | str | None = None, limit: int = 100,
             cursor: str | None = None, metadata: Mapping[str, str] | None = None) -> builtins.list[RunInfo]:  # fmt: skip
        return self._run(self._list(status=status, agent=agent, parent_id=parent_id, root_id=root_id,
                                    updated_before=updated_before, updated_after=updated_after, limit=limit,
                                    cursor=cursor, metadata=metadata))  # fmt: skip

    async def alist(self, *, status: str | None = None, agent: str | None = None, parent_id: str | None = None,
                    root_id: str | None = None, updated_before: datetime | str | None = None,
                    updated_after: datetime | str | None = None, limit: int = 100,
                    cursor: str | None = None, metadata: Mapping[str, str] | None = None) -> builtins.list[RunInfo]:  # fmt: skip
        return await self._arun(self._list(status=status, agent=agent, parent_id=parent_id, root_id=root_id,
                                           updated_before=updated_before, updated_after=updated_after,
                                           limit=limit, cursor=cursor, metadata=metadata))  # fmt: skip


@dataclass(slots=True)
class _LoopPool:
    """One event loop's async pool (made in process ``pid``) and every connection it made."""

    pid: int
    pool: AsyncConnectionPool[Any]
    made: weakref.WeakSet[Any]


def _after_append(written: builtins.list[j.Entry], inbox_len: int) -> int:
    if written and fp.ACTIVE and fp.hits("after_append", written):
        fp.die()
    return inbox_len


class _Tries:
    """The attempts of one operation: which one this is, and whether a failed one may be tried again."""

    def __init__(self, store: PostgresStore, retry_for: float | None) -> None:
        self.store, self.attempt, self._deadline = store, 0, 0.0
        self._for = store.retry_timeout if retry_for is None else retry_for

    def failed(self, exc: psycopg.Error) -> float:
        """The pause before the next attempt after ``exc``; raises when there is to be none.

        Raises:
            TetherError: the server refused the statement (no retry helps).
            PostgresUnavailableError: connections kept failing for ``retry_timeout`` seconds.
        """
        store = self.store
        if isinstance(exc, pg_errors.QueryCanceled | psycopg.ProgrammingError | psycopg.DataError):
            raise TetherError(f"PostgreSQL at {store.identity} refused: {str(exc).strip().splitlines()[0]}. "
                              "Fix: check the DSN's database and user, and the schema") from exc  # fmt: skip
        if not isinstance(exc, psycopg.OperationalError):
            raise exc
        now = time.monotonic()
        self._deadline = self._deadline or now + self._for
        if now >= self._deadline or store._closed:
            raise PostgresUnavailableError(f"PostgreSQL at {store.identity} was unreachable for "
                                           f"{store.retry_timeout:g}s ({exc}). Fix: check that the server "
                                           "runs and accepts connections, then retry") from exc  # fmt: skip
        log.info("PostgreSQL connection lost (%s); retrying", str(exc).strip()[:200])
        self.attempt += 1
        return min(0.05 * 2 ** (self.attempt - 3), 1.0) if self.attempt > 2 else 0.0
