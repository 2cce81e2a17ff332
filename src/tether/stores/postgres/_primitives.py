"""PostgresStore's primitives, each one attempt on one connection, written once for both faces.

Every function is a coroutine over a ``Cx`` (``_conn.py``) and the store's ``Tables``: the sync face runs it
with ``run_sync`` over a ``SyncCx``, the async face awaits it over an ``AsyncCx``; ``PostgresStore`` retries
an attempt on a new connection after a lost one, passing ``retry`` > 0 (an earlier attempt may have
committed: the attempt settles that outcome). The SQL text of each statement is here, once.
"""

from __future__ import annotations

import builtins
import functools
from collections.abc import Collection, Sequence
from typing import Any

import orjson
from psycopg import errors as pg_errors

from ... import journal as j
from ...errors import CorruptJournalError, RunNotFoundError
from ...inbox import InboxItem
from .. import _failpoints as fp
from .. import base
from .._planner import Stored, plan_append, stored_body
from .._records import kept_changing_error, lease_lost_error
from ..base import Lease, Owner, busy_error
from ._conn import Cx
from ._sql import (
    CHANNEL,
    EPOCH,
    FREE,
    LIVE,
    SET_LISTING,
    WORK,
    Tables,
    as_json,
    holding,
    info_of,
)

__all__ = [
    "append",
    "claim",
    "claim_next",
    "claim_next_batch",
    "create",
    "free",
    "post",
    "read",
    "row",
    "rows",
    "schema_version",
    "take",
]

Rows = builtins.list[Any]


async def row(cx: Cx, t: Tables, run_id: str, columns: str, lock: str = "") -> Any:
    """The run's row (``columns``); RunNotFoundError when there is none."""
    found = await cx.one(f"SELECT {columns} FROM {t.runs} WHERE id = %s{lock}", (run_id,))
    if found is None:
        raise RunNotFoundError(run_id)
    return found


async def rows(cx: Cx, t: Tables, run_id: str, sql: str, after: int) -> Rows:
    """A run's entries or inbox rows after a number; none: RunNotFoundError when there is no such run."""
    found = await cx.all(sql, (run_id, after))
    if not found:
        await row(cx, t, run_id, "1")
    return found


async def schema_version(cx: Cx, t: Tables) -> int:
    """The highest migration applied in the schema (0: none, or no tables)."""
    exists = await cx.one("SELECT to_regclass(%s) IS NOT NULL", (t.versions,))
    if not (exists and exists[0]):
        return 0
    found = await cx.one(f"SELECT coalesce(max(version), 0) FROM {t.versions}")
    return int(found[0]) if found else 0


async def _notify(cx: Cx, root_id: str) -> None:
    await cx.one("SELECT pg_notify(%s, %s)", (CHANNEL, root_id))


async def _insert(cx: Cx, t: Tables, run_id: str, entries: Sequence[j.Entry]) -> None:
    await cx.many(f"INSERT INTO {t.entries} (run_id, seq, body) VALUES (%s, %s, %s)",
                  [(run_id, entry.seq, j.encode_entry(entry, run_id)) for entry in entries])  # fmt: skip


# --------------------------------------------------------------------------------------------------
# Runs and the journal


async def create(cx: Cx, t: Tables, retry: int, run_id: str, entries: Sequence[j.Entry], info: dict[str, Any],
                 listing: tuple[Any, ...], owner: Owner | None, ttl: float | None) -> Lease | None:  # fmt: skip
    """``Store.create``: the run's row and its first entries, one transaction."""
    try:
        async with cx.transaction():
            made = await cx.one(
                f"INSERT INTO {t.runs} (id, agent, status, turn, first_message, created_at, updated_at, "
                "parent_id, root_id, info, length, inbox_consumed, lease_owner, lease_token, lease_expires_at) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, "
                f"CASE WHEN %s THEN now() + make_interval(secs => %s) END) RETURNING {EPOCH}",
                (run_id, *listing, len(entries), int(info.get("inbox_consumed", -1)),
                 as_json(owner.to_dict()) if owner else None, 1 if owner else 0, owner is not None, ttl),
            )  # fmt: skip
            await _insert(cx, t, run_id, entries)
            if owner is None and listing[1] == "running" and listing[6] is None:
                await _notify(cx, run_id)  # a submitted run: wake a worker
    except pg_errors.UniqueViolation:
        if retry and await _created_by_us(cx, t, run_id, entries[0], owner):
            return await _current_lease(cx, t, run_id, owner, ttl) if owner else None
        raise ValueError(f"run {run_id} already exists. Fix: store.load({run_id!r}), or pick another "
                         "id") from None  # fmt: skip
    return Lease(run_id, 1, owner, made[0] if made else None, ttl) if owner else None


async def _created_by_us(cx: Cx, t: Tables, run_id: str, first: j.Entry, owner: Owner | None) -> bool:
    """After a lost COMMIT: whether the stored run is the one this create wrote."""
    found = await cx.one(f"SELECT e.body, r.lease_owner FROM {t.entries} AS e JOIN {t.runs} AS r ON r.id = "
                         "e.run_id WHERE e.run_id = %s AND e.seq = 0", (run_id,))  # fmt: skip
    stored, held = (orjson.loads(found[0]), found[1]) if found else ({}, None)
    same = stored.get("w") == first.w and stored.get("h") == first.h
    return same and (owner is None or (held is not None and Owner.from_dict(held) == owner))


async def _current_lease(cx: Cx, t: Tables, run_id: str, owner: Owner, ttl: float | None) -> Lease:
    found = await cx.one(f"SELECT lease_token, {EPOCH} FROM {t.runs} WHERE id = %s", (run_id,))
    return Lease(run_id, int(found[0]) if found else 0, owner, found[1] if found else None, ttl)


_ROWS_AS_VALUES = 8
"""Appends of up to this many entries bind each entry's seq and body as parameters of their own (a VALUES
list, sent binary); longer ones bind two arrays (``unnest``), which psycopg sends as text."""


@functools.lru_cache(maxsize=64)
def _append_sql(t: Tables, n: int) -> str:
    """An append of ``n`` entries in one statement (so one transaction): the fence, an UPDATE of the run's
    row, and the INSERT of the entries only when the fence matched, returning the inbox's length read at the
    fence (the row locked). No row: the fence matched nothing, and nothing was written. One text per
    ``n`` up to ``_ROWS_AS_VALUES`` (each prepared once per connection by psycopg)."""
    rows = ("(VALUES " + ", ".join(["(%s::int, %s::bytea)"] * n) + ")") if n <= _ROWS_AS_VALUES else (
        "unnest(%s::int[], %s::bytea[])")  # fmt: skip
    return (
        f"WITH fence AS (UPDATE {t.runs} SET {SET_LISTING}, length = %s, inbox_consumed = %s WHERE id = %s AND "
        f"length = %s AND lease_token = %s AND {LIVE} RETURNING id, inbox_len), written AS (INSERT INTO "
        f"{t.entries} (run_id, seq, body) SELECT fence.id, e.seq, e.body FROM fence, {rows} AS e (seq, body)) "
        "SELECT inbox_len FROM fence"
    )


async def _fenced_write(cx: Cx, t: Tables, run_id: str, at: int, new: Sequence[j.Entry], lease_token: int | None,
                        listing: tuple[Any, ...], consumed: int) -> int | None:  # fmt: skip
    """The fenced append of ``new`` at ``at``: the inbox's length, or None when the fence matched no row."""
    rows: builtins.list[Any] = []
    if len(new) <= _ROWS_AS_VALUES:
        for entry in new:
            rows += (entry.seq, j.encode_entry(entry, run_id))
    else:
        rows = [[entry.seq for entry in new], [j.encode_entry(entry, run_id) for entry in new]]
    found = await cx.one(_append_sql(t, len(new)),
                         (*listing, at + len(new), consumed, run_id, at, lease_token, *rows))  # fmt: skip
    return None if found is None else int(found[0])


async def append(cx: Cx, t: Tables, run_id: str, entries: Sequence[j.Entry], expected_seq: int,
                 lease_token: int | None, listing: tuple[Any, ...],
                 consumed: int) -> tuple[builtins.list[j.Entry], int]:  # fmt: skip
    """``Store.append``: the entries written (none: a retried append found them stored) and the inbox's
    length, read in the append's transaction.

    A new append is one statement in autocommit: one transaction, one round trip (``_append_sql``: the fence
    inside it). When its fence matches nothing (a retry whose COMMIT's outcome was unknown, another writer,
    a lost lease) the slow path settles it in a transaction: re-read, then refuse, or skip what the same
    writer stored (DURABILITY 3) and write the rest, fenced again. A crash test's ``torn_append`` takes the
    slow path too, to die inside an open transaction.
    """
    new = builtins.list(entries)
    if fp.ACTIVE and new and fp.hits("before_append", new):
        fp.die()  # before anything is sent: nothing is written
    torn = fp.ACTIVE and bool(new) and fp.hits("torn_append", new)
    if new and not torn:
        length = await _fenced_write(cx, t, run_id, expected_seq, new, lease_token, listing, consumed)
        if length is not None:
            return new, length
    async with cx.transaction():
        for _ in range(3):  # re-read, then refuse, or skip what is stored; then the fence again
            at, new, length = await _unstored(cx, t, run_id, entries, expected_seq, lease_token)
            if not new:
                return [], length
            found = await _fenced_write(cx, t, run_id, at, new, lease_token, listing, consumed)
            if found is not None:
                if torn:
                    fp.die()  # inside the transaction: the server rolls it back
                return new, found
        raise kept_changing_error(run_id)


async def _unstored(cx: Cx, t: Tables, run_id: str, entries: Sequence[j.Entry], expected_seq: int,
                    token: int | None) -> tuple[int, builtins.list[j.Entry], int]:  # fmt: skip
    """Why the fence matched no row: raise, or return where to write, what is not stored yet, and the
    inbox's length."""
    n, current, live, inbox_len = await row(cx, t, run_id, f"length, lease_token, {LIVE}, inbox_len")
    if token != current or not live:
        raise lease_lost_error(run_id, token, current)
    end = expected_seq + min(len(entries), n - expected_seq)  # what plan_append compares (nothing: a gap)
    found = await cx.all(f"SELECT body FROM {t.entries} WHERE run_id = %s AND seq >= %s AND seq < %s ORDER BY "
                         "seq", (run_id, expected_seq, end)) if entries and end > expected_seq else []  # fmt: skip
    stored: builtins.list[Stored] = [stored_body(run_id, bytes(body)) for (body,) in found]

    def lookup(first: int, end: int) -> builtins.list[Stored]:
        return stored[first - expected_seq : end - expected_seq]

    planned = plan_append(run_id, entries, expected_seq=expected_seq, stored_length=n, stored=lookup)
    return n, planned, int(inbox_len)


async def read(cx: Cx, t: Tables, run_id: str, after_seq: int) -> builtins.list[j.Entry]:
    """``Store.read``: the entries after ``after_seq`` (with seq 0, for the journal's format version)."""
    found = await rows(cx, t, run_id, f"SELECT seq, body FROM {t.entries} WHERE run_id = %s AND (seq = 0 OR "
                       "seq > %s) ORDER BY seq", after_seq)  # fmt: skip
    if after_seq < 0:
        return j.decode_journal(run_id, (bytes(body) for _, body in found))
    version = orjson.loads(found[0][1]).get("version") if found and found[0][0] == 0 else None
    out: builtins.list[j.Entry] = []
    for expected, (_, body) in enumerate((r for r in found if r[0] > after_seq), start=after_seq + 1):
        entry = j.decode_entry(bytes(body), run_id, journal_version=version)
        if entry.seq != expected:
            raise CorruptJournalError(run_id, entry.seq, f"expected seq {expected} here")
        out.append(entry)
    return out


# --------------------------------------------------------------------------------------------------
# The inbox


async def post(cx: Cx, t: Tables, run_id: str, item_id: str, made: dict[str, Any]) -> int:
    """``Store.post``: count it on the run's row and insert it, one transaction; a stored ``item_id``
    rolls the count back and returns the stored number."""
    try:
        async with cx.transaction():
            counted = await cx.one(f"UPDATE {t.runs} SET inbox_len = inbox_len + 1 WHERE id = %s RETURNING "
                                   "inbox_len, coalesce(root_id, id)", (run_id,))  # fmt: skip
            if counted is None:
                raise RunNotFoundError(run_id)
            seq = int(counted[0]) - 1
            if not await cx.one(f"INSERT INTO {t.inbox} (run_id, inbox_seq, item_id, body) VALUES (%s, %s, %s, "
                                "%s) ON CONFLICT (run_id, item_id) DO NOTHING RETURNING inbox_seq",
                                (run_id, seq, item_id, orjson.dumps({**made, "inbox_seq": seq}))):  # fmt: skip
                raise _Posted()  # stored already: roll the count back, return the stored number
            await _notify(cx, counted[1])
            return seq
    except _Posted:
        found = await cx.one(f"SELECT inbox_seq FROM {t.inbox} WHERE run_id = %s AND item_id = %s",
                             (run_id, item_id))  # fmt: skip
        return int(found[0]) if found else await post(cx, t, run_id, item_id, made)


async def read_inbox(cx: Cx, t: Tables, run_id: str, after_seq: int) -> builtins.list[InboxItem]:
    sql = f"SELECT body FROM {t.inbox} WHERE run_id = %s AND inbox_seq > %s ORDER BY inbox_seq"
    return [InboxItem.from_dict(orjson.loads(body)) for (body,) in await rows(cx, t, run_id, sql, after_seq)]


class _Posted(Exception):
    """Raised inside a post's transaction when its item_id is stored already (rolls the count back)."""


# --------------------------------------------------------------------------------------------------
# Leases


async def take(cx: Cx, t: Tables, run_id: str, owner: Owner, ttl: float,
               token: int | None = None) -> Lease | None:  # fmt: skip
    """New token, owner and expiry (only from ``token`` when given: a compare-and-swap)."""
    cas = "" if token is None else " AND lease_token = %s AND lease_owner IS NOT NULL"
    found = await cx.one(f"UPDATE {t.runs} SET lease_token = lease_token + 1, lease_owner = %s, lease_expires_at = "
                         f"now() + make_interval(secs => %s) WHERE id = %s{cas} RETURNING lease_token, {EPOCH}",
                         [as_json(owner.to_dict()), ttl, run_id, *([] if token is None else [token])])  # fmt: skip
    return None if found is None else Lease(run_id, int(found[0]), owner, found[1], ttl)


async def claim(cx: Cx, t: Tables, retry: int, run_id: str, owner: Owner, ttl: float) -> Lease:
    async with cx.transaction():
        holder = holding(*await row(cx, t, run_id, f"lease_owner, {LIVE}", " FOR UPDATE"))
        if holder is not None and retry and holder == owner:  # our own claim, its COMMIT cut off
            return await _current_lease(cx, t, run_id, owner, ttl)
        if holder is not None:
            raise busy_error(run_id, holder)
        return await take(cx, t, run_id, owner, ttl)  # type: ignore[return-value]


def _claim_sql(t: Tables, only: str) -> str:
    """A claim in one statement (autocommit: one transaction, one round trip): the oldest free root needing
    work, locked ``FOR UPDATE SKIP LOCKED`` (a root another claim is taking is passed over), gets a new
    token, owner and expiry; returns its id, token and expiry. No row: none was free."""
    return (
        f"UPDATE {t.runs} SET lease_token = lease_token + 1, lease_owner = %s, lease_expires_at = now() + "
        f"make_interval(secs => %s) WHERE id = (SELECT id FROM {t.runs} AS r WHERE {WORK} AND {FREE} AND "
        f"{t.needs}{only} ORDER BY updated_at, id LIMIT 1 FOR UPDATE OF r SKIP LOCKED) RETURNING id, "
        f"lease_token, {EPOCH}"
    )


async def claim_next(cx: Cx, t: Tables, retry: int, owner: Owner, ttl: float,
                     names: Collection[str] | None) -> Lease | None:  # fmt: skip
    """``Store.claim_next``: one statement (``_claim_sql``) takes the oldest free root needing work. When
    none is free, a root held by a dead process of this host is taken (compare-and-swap on its token)."""
    only, params = ("", []) if names is None else (" AND agent = ANY(%s)", [builtins.list(names)])
    if retry:  # a claim whose COMMIT was cut off: is a root held by this owner?
        found = await cx.one(f"SELECT id FROM {t.runs} WHERE parent_id IS NULL AND lease_owner = %s AND {LIVE}",
                             (as_json(owner.to_dict()),))  # fmt: skip
        if found is not None:
            return await _current_lease(cx, t, found[0], owner, ttl)
    found = await cx.one(_claim_sql(t, only), [as_json(owner.to_dict()), ttl, *params])
    if found is not None:
        return Lease(found[0], int(found[1]), owner, found[2], ttl)
    return await _take_from_dead(cx, t, owner, ttl, only, params)


def _claim_batch_sql(t: Tables, only: str) -> str:
    """``_claim_sql`` for up to ``n`` roots at once (one statement): the oldest free ones needing work, each
    locked ``FOR UPDATE SKIP LOCKED``, numbered from 0, the one numbered i given the owner at index i of
    the owners' JSON array. Returns each root's id, token, expiry and number."""
    return (
        f"WITH picked AS (SELECT id, row_number() OVER () - 1 AS n FROM (SELECT id FROM {t.runs} AS r WHERE "
        f"{WORK} AND {FREE} AND {t.needs}{only} ORDER BY updated_at, id LIMIT %s FOR UPDATE OF r SKIP LOCKED) "
        f"AS free) UPDATE {t.runs} AS u SET lease_token = u.lease_token + 1, lease_owner = %s::jsonb -> "
        "picked.n::int, lease_expires_at = now() + make_interval(secs => %s) FROM picked WHERE u.id = picked.id "
        f"RETURNING u.id, u.lease_token, {EPOCH}, picked.n"
    )


async def claim_next_batch(cx: Cx, t: Tables, retry: int, owners: Sequence[Owner], ttl: float,
                           names: Collection[str] | None) -> builtins.list[Lease]:  # fmt: skip
    """``PostgresStore.claim_next_batch``: up to one root per owner, in one statement (``_claim_batch_sql``);
    none free: a root held by a dead process of this host, as ``claim_next`` takes it."""
    only, params = ("", []) if names is None else (" AND agent = ANY(%s)", [builtins.list(names)])
    if retry:  # a batch whose COMMIT was cut off: the roots held by its owners are its claims
        mine = {owner.writer: owner for owner in owners}
        found = await cx.all(f"SELECT id, lease_token, {EPOCH}, lease_owner->>'writer' FROM {t.runs} WHERE "
                             f"parent_id IS NULL AND lease_owner->>'writer' = ANY(%s) AND {LIVE}",
                             (builtins.list(mine),))  # fmt: skip
        if found:
            return [Lease(run_id, int(token), mine[writer], at, ttl) for run_id, token, at, writer in found]
    claimed = await cx.all(_claim_batch_sql(t, only), [*params, len(owners),
                           as_json([owner.to_dict() for owner in owners]), ttl])  # fmt: skip
    if claimed:
        return [Lease(run_id, int(token), owners[n], at, ttl) for run_id, token, at, n in claimed]
    lease = await _take_from_dead(cx, t, owners[0], ttl, only, params)
    return [] if lease is None else [lease]


async def _take_from_dead(cx: Cx, t: Tables, owner: Owner, ttl: float, only: str,
                          params: builtins.list[Any]) -> Lease | None:  # fmt: skip
    """A root needing work held by a process of this host that is dead, taken (compare-and-swap)."""
    held = await cx.all(  # held by a process of this host: taken at once if that process is dead
        f"SELECT id, lease_token, lease_owner FROM {t.runs} AS r WHERE {WORK} AND {LIVE} AND "
        "lease_owner->>'host' = %s AND (status = 'running' OR inbox_len > inbox_consumed + 1)"
        f"{only} ORDER BY updated_at, id LIMIT 50", [owner.host, *params])  # fmt: skip
    for run_id, token, raw in held:
        if holding(raw, True) is None and (lease := await take(cx, t, run_id, owner, ttl, token=token)):
            return lease
    return None


async def renew(cx: Cx, t: Tables, lease: Lease, ttl: float) -> Lease:
    found = await cx.one(f"UPDATE {t.runs} SET lease_expires_at = now() + make_interval(secs => %s) WHERE id = "
                         f"%s AND lease_token = %s AND lease_owner IS NOT NULL RETURNING {EPOCH}",
                         (ttl, lease.run_id, lease.token))  # fmt: skip
    if found is None:
        raise lease_lost_error(lease.run_id, lease.token)
    return Lease(lease.run_id, lease.token, lease.owner, found[0], lease.ttl)


async def free(cx: Cx, t: Tables, lease: Lease, condition: str, params: Sequence[Any]) -> bool:
    """Drop the lease where ``condition`` holds, NOTIFY when the run is left needing work: one statement. No
    row: whether the lease was lost already (its token moved on) is read after."""
    found = await cx.one(
        f"WITH freed AS (UPDATE {t.runs} SET lease_owner = NULL, lease_expires_at = NULL WHERE id = %s AND "
        f"lease_token = %s{condition} RETURNING status = 'running' OR inbox_len > inbox_consumed + 1 AS needs, "
        "coalesce(root_id, id) AS root) SELECT CASE WHEN needs THEN pg_notify(%s, root) END FROM freed",
        (lease.run_id, lease.token, *params, CHANNEL),
    )  # one statement in autocommit: the NOTIFY goes out with its commit
    return found is not None or (await row(cx, t, lease.run_id, "lease_token"))[0] != lease.token


# --------------------------------------------------------------------------------------------------
# Removal


async def delete(cx: Cx, t: Tables, retry: int, run_id: str, children: bool, listed: str) -> None:
    async with cx.transaction():
        found = await cx.all(f"SELECT {listed} FROM {t.runs} WHERE id = %s OR root_id = (SELECT root_id FROM "
                             f"{t.runs} WHERE id = %s) OR id = (SELECT parent_id FROM {t.runs} WHERE id = %s) "
                             "ORDER BY id FOR UPDATE", (run_id, run_id, run_id))  # fmt: skip
        if retry and not any(r[0] == run_id for r in found):
            return  # our own delete, whose COMMIT was cut off
        ids = base.plan_delete([info_of(r) for r in found], run_id, children)
        for r in found:
            if r[0] in ids and (holder := holding(r[9], r[11])):
                raise busy_error(r[0], holder)
        await cx.count(f"DELETE FROM {t.runs} WHERE id = ANY(%s)", (ids,))


async def prune(cx: Cx, t: Tables, wanted: builtins.list[str], cutoff: str, children: bool,
                dry_run: bool) -> builtins.list[str]:  # fmt: skip
    sql = (  # roots, each with every run of its tree stopped and free (only with children=True)
        f"SELECT id FROM {t.runs} AS r WHERE parent_id IS NULL AND status = ANY(%s) AND updated_at < %s AND "
        f"{FREE} AND inbox_len <= inbox_consumed + 1 AND NOT EXISTS (SELECT 1 FROM {t.runs} AS c WHERE "
        f"c.root_id = r.id AND c.parent_id IS NOT NULL AND ({'' if children else 'TRUE OR '}c.status <> "
        "ALL(%s) OR (c.lease_owner IS NOT NULL AND c.lease_expires_at > now()))) "
        "ORDER BY updated_at, id FOR UPDATE OF r SKIP LOCKED"
    )
    out: builtins.list[str] = []
    async with cx.transaction():
        for (root,) in await cx.all(sql, (wanted, cutoff, builtins.list(j.STOP_STATUSES))):
            kids = await cx.all(f"SELECT id FROM {t.runs} WHERE root_id = %s AND parent_id IS NOT NULL ORDER BY "
                                "updated_at, id FOR UPDATE", (root,))  # fmt: skip
            out += [root, *(kid for (kid,) in kids)]
        if out and not dry_run:
            await cx.count(f"DELETE FROM {t.runs} WHERE id = ANY(%s)", (out,))
    return out
