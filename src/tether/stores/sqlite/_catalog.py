"""SQLiteStore's listing and removal: ``list``, ``delete`` and ``prune`` as statements over one connection.

See ``tether.stores.sqlite``. ``delete`` and ``prune`` run inside the caller's write transaction, so each
decides and writes at once; ``list_runs`` reads the ``(updated_at DESC, id DESC)`` indexes.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence
from typing import Any

import orjson

from ... import journal as j
from .._listing import ListQuery
from ..base import RunInfo, busy_error, delete_children_error, delete_subagent_error
from ._rows import fetch_all, fetch_one, holding, run_row
from ._schema import FREE, LISTED, METADATA_PAIR

__all__ = ["delete", "list_runs", "prune"]


def remove(conn: sqlite3.Connection, run_ids: Sequence[str]) -> None:
    """Delete runs; their entries and inbox go with them (``ON DELETE CASCADE``, ``foreign_keys=ON``)."""
    conn.executemany("DELETE FROM runs WHERE id = ?", [(run_id,) for run_id in run_ids])


def delete(conn: sqlite3.Connection, run_id: str, children: bool) -> None:
    """``Store.delete`` in the caller's write transaction."""
    parent_id, root_id = run_row(conn, run_id, "parent_id, root_id")
    if parent_id is not None and fetch_one(conn, "SELECT 1 FROM runs WHERE id = ?", (parent_id,)):
        raise delete_subagent_error(run_id, parent_id, root_id)
    kids = [
        row[0]
        for row in fetch_all(
            conn,
            "WITH RECURSIVE tree(id) AS (SELECT id FROM runs WHERE parent_id = ? UNION "
            "SELECT runs.id FROM runs JOIN tree ON runs.parent_id = tree.id) SELECT id FROM tree",
            (run_id,),
        )
        if row[0] != run_id
    ]
    if kids and not children:
        raise delete_children_error(run_id, len(kids))
    now = time.time()
    for rid in [run_id, *sorted(kids)]:
        held, expires = run_row(conn, rid, "lease_owner, lease_expires_at")
        if holder := holding(held, expires, now):
            raise busy_error(rid, holder)
    remove(conn, [run_id, *kids])


def prune(
    conn: sqlite3.Connection, wanted: Sequence[str], cutoff: str, children: bool, dry_run: bool
) -> list[str]:
    """``Store.prune`` in the caller's write transaction (``wanted``: checked statuses; ``cutoff``: ISO)."""
    now = time.time()
    marks = ", ".join("?" * len(wanted))
    stops = ", ".join(f"'{status}'" for status in j.STOP_STATUSES)
    if children:
        kids = (
            "NOT EXISTS (SELECT 1 FROM runs AS c WHERE c.root_id = r.id AND c.id <> r.id AND "
            f"(c.status NOT IN ({stops}) OR NOT (c.lease_owner IS NULL OR "
            "COALESCE(c.lease_expires_at <= ?, 0))))"
        )
        kid_params: list[Any] = [now]
    else:
        kids = "NOT EXISTS (SELECT 1 FROM runs AS c WHERE c.root_id = r.id AND c.id <> r.id)"
        kid_params = []
    sql = (
        f"SELECT id FROM runs AS r WHERE parent_id IS NULL AND status IN ({marks}) AND updated_at < ? "
        f"AND {FREE} AND inbox_len <= inbox_consumed + 1 AND {kids} ORDER BY updated_at, id"
    )
    ids: list[str] = []
    for (root,) in fetch_all(conn, sql, [*wanted, cutoff, now, *kid_params]):
        ids.append(root)
        rows = fetch_all(
            conn, "SELECT id FROM runs WHERE root_id = ? AND id <> ? ORDER BY updated_at, id", (root, root)
        )
        ids.extend(row[0] for row in rows)
    if ids and not dry_run:
        remove(conn, ids)
    return ids


def list_runs(conn: sqlite3.Connection, query: ListQuery, limit: int) -> list[RunInfo]:
    """``Store.list``: the newest ``limit`` runs matching ``query``, newest first."""
    here = query.cursor
    where: list[str] = [f"{column} = ?" for column in query.equal]
    params: list[Any] = list(query.equal.values())
    where += [METADATA_PAIR] * len(query.metadata)
    params += [part for pair in query.metadata.items() for part in pair]
    for op, bound in (("<", query.before), (">", query.after), (">", here.since)):
        if bound is not None:
            where.append(f"updated_at {op} ?")
            params.append(bound)
    if here.id is not None:  # the keyset: before (at, id), newest first
        where.append("updated_at <= ? AND (updated_at < ? OR id < ?)")
        params += [here.at, here.at, here.id]
    sql = f"SELECT {LISTED} FROM runs"
    if where:
        sql += " WHERE " + " AND ".join(where)
    rows = fetch_all(conn, sql + " ORDER BY updated_at DESC, id DESC LIMIT ?", [*params, max(int(limit), 0)])
    now = time.time()
    out: list[RunInfo] = []
    for row in rows:
        owner = holding(row[9], row[10], now)
        out.append(
            RunInfo(
                id=row[0], agent=row[1], status=row[2], first_message=row[3], created_at=row[4],
                updated_at=row[5], turn=int(row[6]), parent_id=row[7], root_id=row[8],
                lease_owner=f"{owner.host}:{owner.pid}" if owner else None,
                lease_expires_at=row[10] if owner else None,
                length=int(row[11]), inbox_len=int(row[12]), inbox_consumed=int(row[13]),
                metadata=orjson.loads(row[14]) if row[14] else {},
            )
        )  # fmt: skip
    return out
