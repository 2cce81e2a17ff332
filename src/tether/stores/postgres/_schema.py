"""PostgresStore's schema of its own: migrations, the old place (DESIGN 8.2), and moving tables out of it.

Each function is one attempt on one connection (a ``Cx``, either face) in one transaction, serialized with
every other migration of the same schema by an advisory lock.
"""

from __future__ import annotations

import logging

from ...errors import TetherError
from ._conn import Cx
from ._primitives import schema_version
from ._sql import SCHEMA_VERSION, Tables, migrations, refuse_newer, valid_schema

__all__ = ["migrate", "move_tables", "old_place", "old_place_error"]

log = logging.getLogger("tether.stores.postgres")

_TABLES = ("runs", "entries", "inbox", "tether_schema")

_OLD_PLACE = (
    "SELECT n.nspname FROM pg_namespace AS n WHERE n.nspname = current_schema() AND n.nspname <> %s "
    "AND EXISTS (SELECT 1 FROM pg_class AS v WHERE v.relnamespace = n.oid AND v.relname = 'tether_schema' "
    "AND v.relkind = 'r') AND EXISTS (SELECT 1 FROM pg_attribute AS a JOIN pg_class AS r ON r.oid = a.attrelid "
    "WHERE r.relnamespace = n.oid AND r.relname = 'runs' AND a.attname = 'lease_token' AND NOT a.attisdropped)"
)
"""The connection's default schema, when it holds tether's tables (its ``tether_schema`` and a ``runs`` with a
``lease_token``) and is not the store's schema: where a tether before schemas kept them. An application's
own ``runs`` table has neither."""


async def _lock(cx: Cx, t: Tables) -> None:
    await cx.one("SELECT pg_advisory_xact_lock(hashtext('tether_schema:' || %s))", (t.schema,))


async def old_place(cx: Cx, t: Tables) -> str | None:
    """The schema holding tether's tables in the old place, when the store's schema has none; else None."""
    if await schema_version(cx, t) > 0:
        return None
    found = await cx.one(_OLD_PLACE, (t.schema,))
    return str(found[0]) if found else None


def old_place_error(identity: str, t: Tables, old: str) -> TetherError:
    tables = ", ".join(f"{old}.{name}" for name in _TABLES)
    return TetherError(
        f"PostgreSQL at {identity} holds tether's tables in schema {old} ({tables}), not in schema {t.schema} "
        f"where this store keeps them. Fix: move them with `tether db migrate --store URL --move-from {old}` "
        f"(or store.migrate(move_from={old!r})), or keep using them there with ?schema={old} in the URL"
    )


async def migrate(cx: Cx, t: Tables, identity: str, move_from: str | None = None, look: bool = True) -> int:
    """Create the schema and its tables, or upgrade them; with ``move_from``, first move tether's tables
    from that schema into the store's (``ALTER TABLE … SET SCHEMA``). One transaction; the version. ``look``:
    look for tether's tables in the old place (a schema chosen by default; one named is meant as it is).

    Raises:
        TetherError: the schema is newer than this tether, or tether's tables are in the old place (and
            ``move_from`` does not name it), or ``move_from`` holds no tables of tether's.
    """
    async with cx.transaction():
        await _lock(cx, t)
        await cx.count(f"CREATE SCHEMA IF NOT EXISTS {t.quoted}")
        old = await old_place(cx, t) if look else None
        if move_from is not None:
            await move_tables(cx, t, identity, move_from)
        elif old is not None:
            raise old_place_error(identity, t, old)
        await cx.count(f"CREATE TABLE IF NOT EXISTS {t.versions} (version INTEGER PRIMARY KEY, "
                       "applied_at TIMESTAMPTZ NOT NULL DEFAULT now())")  # fmt: skip
        version = await schema_version(cx, t)
        refuse_newer(identity, version)
        for number, statements in enumerate(migrations(t)[version:], start=version + 1):
            for sql in statements:
                await cx.count(sql)
            await cx.count(f"INSERT INTO {t.versions} (version) VALUES (%s)", (number,))
            log.info("%s: applied tether schema migration %d", identity, number)
    return max(version, SCHEMA_VERSION)


async def move_tables(cx: Cx, t: Tables, identity: str, move_from: str) -> None:
    """Move ``runs``, ``entries``, ``inbox`` and ``tether_schema`` (with their indexes) from ``move_from``
    into the store's schema; inside ``migrate``'s transaction."""
    old = Tables.of(valid_schema(move_from))
    if old.schema == t.schema:
        return
    if await schema_version(cx, t) > 0:
        raise TetherError(f"PostgreSQL at {identity} already has tether's tables in schema {t.schema}. Fix: "
                          f"drop --move-from (schema {old.schema} is left as it is)")  # fmt: skip
    if await schema_version(cx, old) == 0:
        raise TetherError(f"PostgreSQL at {identity} has no tether tables in schema {old.schema}. Fix: name the "
                          "schema that holds them in --move-from")  # fmt: skip
    for name in _TABLES:
        await cx.count(f"ALTER TABLE {old.quoted}.{name} SET SCHEMA {t.quoted}")
    log.info("%s: moved tether's tables from schema %s to %s", identity, old.schema, t.schema)
