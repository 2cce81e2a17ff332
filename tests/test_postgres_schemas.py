"""PostgresStore in a schema of its own (DESIGN 8.2) and its native async face (DESIGN 8.1), against a real
server: two schemas in one database, an application's own ``runs`` table, tables left in the old place, the
event loop never blocked by a store call, and a cancelled call leaving the pool good. Skipped without a
server, failed when ``TETHER_REQUIRE_POSTGRES=1``."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).with_name("crash")))

from _chaos_agents import libpq, postgres_or_skip

from tether import State
from tether.errors import TetherError
from tether.stores import open_store

if os.environ.get("TETHER_REQUIRE_POSTGRES") != "1":
    pytest.importorskip("psycopg", reason="psycopg is not installed. Fix: pip install 'tether[postgres]'")
import psycopg

from tether.stores.postgres import PostgresStore
from tether.stores.postgres import _sql as pg_sql


def _sql(dsn: str, sql: str, params: Any = ()) -> list[Any]:
    with psycopg.connect(libpq(dsn), autocommit=True) as conn:
        cur = conn.execute(sql, params)
        return cur.fetchall() if cur.description else []


@pytest.fixture
def schemas() -> Iterator[Any]:
    """Makes unique schema names (``schemas("app")``) and drops every one of them afterwards."""
    base = postgres_or_skip()
    made: list[str] = []

    def name(prefix: str) -> str:
        made.append(f"tether_t_{prefix}_{uuid.uuid4().hex[:8]}")
        return made[-1]

    name.base = base  # type: ignore[attr-defined]
    yield name
    for schema in made:
        _sql(base, f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def _tables(base: str, schema: str) -> set[str]:
    return {row[0] for row in _sql(base, "SELECT tablename FROM pg_tables WHERE schemaname = %s", (schema,))}


def test_two_schemas_in_one_database_hold_independent_runs(schemas: Any) -> None:
    base, a, b = schemas.base, schemas("a"), schemas("b")
    one, two = open_store(f"{base}?schema={a}"), PostgresStore(base, schema=b)
    assert one != two and one.identity.endswith(f"schema={a}")
    one.save(State(id="r1", messages=["in a"]))
    two.save(State(id="r1", messages=["in b"]))  # the same id: another store
    assert [(i.id, i.first_message) for i in one.list()] == [("r1", "in a")]
    assert [(i.id, i.first_message) for i in two.list()] == [("r1", "in b")]
    one.delete("r1")
    assert one.list() == [] and two.load("r1").messages[0].content[0]["text"] == "in b"  # type: ignore[index]
    assert _tables(base, a) == _tables(base, b) == {"runs", "entries", "inbox", "tether_schema"}
    one.close()
    two.close()


def test_a_bad_schema_name_is_refused_with_the_fix(schemas: Any) -> None:
    with pytest.raises(ValueError, match=r"schema 'x; DROP TABLE runs' is not a plain PostgreSQL name.*Fix:"):
        PostgresStore(schemas.base, schema="x; DROP TABLE runs")
    with pytest.raises(ValueError, match=r"schema 'bad-name' .*Fix:"):
        open_store(f"{schemas.base}?schema=bad-name")
    with pytest.raises(ValueError, match=r"schema='a' and a URL with \?schema=b\. Fix: name the schema once"):
        PostgresStore(f"{schemas.base}?schema=b", schema="a")


def test_an_application_table_named_runs_is_left_untouched(
    schemas: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    base, app, default = schemas.base, schemas("app"), schemas("default")
    _sql(base, f"CREATE SCHEMA {app}")
    _sql(base, f"CREATE TABLE {app}.runs (id SERIAL PRIMARY KEY, title TEXT NOT NULL)")
    _sql(base, f"INSERT INTO {app}.runs (title) VALUES ('the application''s own row')")
    monkeypatch.setattr(pg_sql, "DEFAULT_SCHEMA", default)  # tether's default, unique to this test
    url = f"{base}?options=-csearch_path%3D{app}"  # the application's schema is the connection's default
    store = open_store(url)
    store.save(State(id="r1", messages=["hello"]))  # no error: the application's runs is not tether's
    assert store.identity.endswith(f"schema={default}") and [i.id for i in store.list()] == ["r1"]
    assert _sql(base, f"SELECT id, title FROM {app}.runs") == [(1, "the application's own row")]
    columns = _sql(base, "SELECT column_name FROM information_schema.columns WHERE table_schema = %s AND "
                   "table_name = 'runs' ORDER BY ordinal_position", (app,))  # fmt: skip
    assert columns == [("id",), ("title",)] and _tables(base, app) == {"runs"}
    store.close()


def test_tables_in_the_old_place_are_named_with_the_migration_that_moves_them(
    schemas: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from tether._cli.app import app as cli

    base, old, default = schemas.base, schemas("old"), schemas("new")
    url = f"{base}?options=-csearch_path%3D{old}"  # ``old`` plays public: the connection's default schema
    _sql(base, f"CREATE SCHEMA {old}")
    before = PostgresStore(url, schema=old)  # where a tether before schemas put its tables
    before.save(State(id="kept", messages=["from before"]))
    before.close()
    monkeypatch.setattr(pg_sql, "DEFAULT_SCHEMA", default)
    store = open_store(url)
    with pytest.raises(TetherError) as caught:
        store.load("kept")
    message = str(caught.value)
    assert f"in schema {old} ({old}.runs, {old}.entries, {old}.inbox, {old}.tether_schema)" in message
    assert f"Fix: move them with `tether db migrate --store URL --move-from {old}`" in message
    assert _tables(base, default) == set()  # nothing was created beside them
    store.close()
    result = CliRunner().invoke(cli, ["db", "migrate", "--store", url, "--move-from", old])
    assert result.exit_code == 0, result.output
    assert _tables(base, old) == set() and _tables(base, default) == {
        "runs",
        "entries",
        "inbox",
        "tether_schema",
    }
    moved = open_store(url)
    assert moved.load("kept").messages[0].content[0]["text"] == "from before"  # type: ignore[index]
    moved.close()


# --------------------------------------------------------------------------------------------------
# The native async face


@pytest.fixture
def pg(schemas: Any) -> Iterator[tuple[str, str]]:
    """A URL whose schema is fresh (and the schema's name), with one run ``r1`` saved in it."""
    schema = schemas("async")
    url = f"{schemas.base}?schema={schema}&application_name=tether-async-{uuid.uuid4().hex[:6]}"
    store = PostgresStore(url)
    store.save(State(id="r1", messages=["hello"]))
    store.close()
    yield url, schema


def _lock_entries(url: str, schema: str) -> psycopg.Connection[Any]:
    """A connection holding an exclusive lock on the schema's entries table (until its rollback)."""
    conn = psycopg.connect(libpq(url))
    conn.execute(f"LOCK TABLE {schema}.entries IN ACCESS EXCLUSIVE MODE")
    return conn


def test_a_native_twin_never_blocks_the_loop(pg: tuple[str, str]) -> None:
    url, schema = pg
    store = PostgresStore(url)
    assert PostgresStore.async_native
    locker = _lock_entries(url, schema)  # aload waits for the server until the ticker lets it go
    released_by: list[str] = []
    lock = threading.Lock()

    def release(by: str) -> None:
        with lock:
            if not released_by:
                released_by.append(by)
                locker.rollback()

    fallback = threading.Timer(20, release, ("timer",))  # a blocked loop would never tick: this ends it
    fallback.start()

    async def main() -> State:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1
                if ticks == 5:
                    await asyncio.to_thread(release, "ticker")

        task = asyncio.create_task(ticker())
        try:
            return await store.aload("r1")
        finally:
            task.cancel()
            await store.aclose()

    state = asyncio.run(main())
    fallback.cancel()
    locker.close()
    assert released_by == ["ticker"] and state.status == "running" and len(state.history) == 2


def test_a_cancelled_call_mid_query_leaves_the_pool_good(pg: tuple[str, str]) -> None:
    url, schema = pg
    app = dict(p.split("=") for p in url.split("?")[1].split("&"))["application_name"]
    store = PostgresStore(url, pool_min=1, pool_max=1)  # one connection: a broken one would break every call

    def waiting() -> list[Any]:
        return _sql(url, "SELECT pid FROM pg_stat_activity WHERE application_name = %s AND state = 'active' "
                    "AND wait_event_type = 'Lock'", (app,))  # fmt: skip

    async def main() -> list[int]:
        await store.aload("r1")  # the pool is open and ready
        locker = _lock_entries(url, schema)
        try:
            for _ in range(3):
                call = asyncio.create_task(store.aread("r1"))
                while not waiting():  # the read is on the server, waiting for the lock
                    await asyncio.sleep(0.01)
                call.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await call
                while waiting():  # the statement was cancelled on the server too
                    await asyncio.sleep(0.01)
        finally:
            locker.rollback()
            locker.close()
        lengths = [len(await store.aread("r1")) for _ in range(5)]  # the pool's connection works
        await store.apost("r1", {"type": "message", "role": "user", "content": []})
        lengths.append(await store.ainbox_length("r1"))
        await store.aclose()
        return lengths

    assert asyncio.run(main()) == [2, 2, 2, 2, 2, 1]


def test_sync_and_async_faces_share_one_process_and_one_run(pg: tuple[str, str]) -> None:
    url, _ = pg
    store = PostgresStore(url)

    async def main() -> State | None:
        state = await store.aload("r1")
        state.add_message("more")
        await store.asave(state)
        return await store.acancel("r1", by="ops")

    cancelled = asyncio.run(main())
    assert cancelled is not None and cancelled.status == "cancelled"
    assert store.load("r1").history == cancelled.history  # the sync face reads what the async face wrote
    store.close()


def test_pools_of_event_loops_that_ended_leave_no_connections(pg: tuple[str, str]) -> None:
    url, _ = pg
    app = dict(p.split("=") for p in url.split("?")[1].split("&"))["application_name"]
    store = PostgresStore(url)
    for _ in range(4):  # each asyncio.run is an event loop of its own, with a pool of its own
        assert asyncio.run(store.aload("r1")).status == "running"
    store.close()  # closes what the ended loops' pools held, with the sync pool

    def ours() -> list[Any]:
        return _sql(url, "SELECT pid FROM pg_stat_activity WHERE application_name = %s AND pid <> "
                    "pg_backend_pid()", (app,))  # fmt: skip

    for _ in range(500):  # the server drops a backend a moment after its client closes
        if not ours():
            break
        threading.Event().wait(0.01)
    assert ours() == []


def test_aclose_loop_closes_that_loops_pool_and_the_store_goes_on(pg: tuple[str, str]) -> None:
    url, _ = pg
    app = dict(p.split("=") for p in url.split("?")[1].split("&"))["application_name"]
    store = PostgresStore(url)
    assert store.load("r1").status == "running"  # the sync pool only

    def ours() -> int:
        return len(_sql(url, "SELECT pid FROM pg_stat_activity WHERE application_name = %s AND pid <> "
                        "pg_backend_pid()", (app,)))  # fmt: skip

    sync_only = ours()

    async def load_then_close() -> str:
        try:
            return (await store.aload("r1")).status
        finally:
            await store.aclose_loop()  # what an ASGI app's shutdown (and Worker.run) does

    assert asyncio.run(load_then_close()) == "running"
    for _ in range(500):  # the server drops a backend a moment after its client closes
        if ours() == sync_only:
            break
        threading.Event().wait(0.01)
    assert ours() == sync_only, "the ended loop's async connections are closed; the sync pool's are kept"
    assert asyncio.run(load_then_close()) == "running"  # a later loop opens a pool of its own
    assert store.load("r1").status == "running"
    store.close()
