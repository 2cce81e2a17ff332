"""PostgresStore against a real server: what only PostgreSQL does (identity, schema and migrations, connection
loss and the pool, LISTEN/NOTIFY, index use), and the conformance suite. The rules it shares with SQLiteStore
are in ``test_sql_stores.py``. One fresh schema per module; skipped without a server, failed when
``TETHER_REQUIRE_POSTGRES=1``."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).with_name("crash")))

from _chaos_agents import fresh_schema, libpq, postgres_or_skip

import tether.testing
from _store_runs import _append, _batch, _first, _info, _make
from tether import journal as j
from tether.errors import (
    TetherError,
)
from tether.stores.base import Owner

if os.environ.get("TETHER_REQUIRE_POSTGRES") != "1":
    pytest.importorskip("psycopg", reason="psycopg is not installed. Fix: pip install 'tether[postgres]'")
import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tether.stores.postgres import SCHEMA_VERSION, PostgresStore, PostgresUnavailableError

pytest.register_assert_rewrite("tether._harness.conformance.suite")
StoreConformance: Any = getattr(tether.testing, "StoreConformance", None)
if StoreConformance is None:  # until tether.testing exports it
    from tether._harness.conformance.suite import StoreConformance

# --------------------------------------------------------------------------------------------------
# Helpers


@pytest.fixture(scope="module")
def dsn() -> Iterator[str]:
    with fresh_schema("tether_test_pg") as made:
        store = PostgresStore(made)
        store.migrate()
        store.close()
        yield made


@pytest.fixture
def db(dsn: str) -> Iterator[PostgresStore]:
    store = PostgresStore(dsn)
    _sql(dsn, "TRUNCATE runs, entries, inbox")
    yield store
    store.close()


def _sql(dsn: str, sql: str, params: Any = ()) -> list[Any]:
    with psycopg.connect(libpq(dsn), autocommit=True) as conn:
        cur = conn.execute(sql, params)
        return cur.fetchall() if cur.description else []


def _backends(dsn: str, app: str) -> list[int]:
    rows = _sql(dsn, "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (app,))
    return [row[0] for row in rows]


def _kill_backends(dsn: str, app: str) -> int:
    rows = _sql(
        dsn,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s "
        "AND pid <> pg_backend_pid()",
        (app,),
    )
    return len(rows)


# --------------------------------------------------------------------------------------------------
# Basics


def test_identity_hides_the_password_and_equal_stores_compare_equal(dsn: str) -> None:
    store = PostgresStore("postgresql://bob:s3cret@db.example:5433/runs?options=-csearch_path%3Dx")
    assert "s3cret" not in store.identity
    assert store.identity == "postgresql://bob@db.example:5433/runs?options=-csearch_path%3Dx&schema=tether"
    assert PostgresStore("host=db.example port=5433 user=bob password=other dbname=runs "
                         "options=-csearch_path=x") == store  # fmt: skip
    assert PostgresStore(dsn) == PostgresStore(dsn) and PostgresStore(dsn) != store
    assert PostgresStore(PostgresStore(dsn).identity).identity == PostgresStore(dsn).identity
    plain = PostgresStore("postgresql://bob@db.example/runs")  # the schema is part of what the store is
    assert plain.identity == "postgresql://bob@db.example/runs?schema=tether" and plain.schema == "tether"
    assert PostgresStore("postgresql://bob@db.example/runs?schema=app_runs") != plain
    assert PostgresStore("postgresql://bob@db.example/runs", schema="app_runs") == PostgresStore(
        "postgresql://bob@db.example/runs?schema=app_runs"
    )


def test_schema_is_versioned_migrated_once_and_a_newer_one_is_refused() -> None:
    with fresh_schema("tether_test_mig") as dsn:
        unmigrated = PostgresStore(dsn, migrate=False)
        with pytest.raises(TetherError, match="tether db migrate"):
            unmigrated.length("x")
        unmigrated.close()
        stores = [PostgresStore(dsn) for _ in range(4)]
        threads = [threading.Thread(target=s.migrate) for s in stores]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        versions = _sql(dsn, "SELECT version FROM tether_schema ORDER BY version")
        assert versions == [(v,) for v in range(1, SCHEMA_VERSION + 1)]  # each step once
        tables = {
            row[0] for row in _sql(dsn, "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")
        }
        assert {"runs", "entries", "inbox", "tether_schema"} <= tables
        indexes = {
            row[0]
            for row in _sql(dsn, "SELECT indexname FROM pg_indexes WHERE schemaname = current_schema()")
        }
        assert {"runs_updated", "runs_status", "runs_work"} <= indexes
        assert stores[0].migrate() == SCHEMA_VERSION
        _sql(dsn, "INSERT INTO tether_schema (version) VALUES (%s)", (SCHEMA_VERSION + 1,))
        newer = PostgresStore(dsn)
        with pytest.raises(TetherError, match=r"newer tether.*Fix: upgrade tether"):
            newer.length("x")
        for store in [*stores, newer]:
            store.close()


def test_a_missing_schema_is_created_by_the_migrations_or_named_in_a_clear_error(dsn: str) -> None:
    name = f"no_such_schema_{uuid.uuid4().hex[:8]}"
    unmigrated = PostgresStore(libpq(dsn), schema=name, migrate=False)
    with pytest.raises(TetherError, match=rf"schema={name} has tether schema 0.*Fix: run tether db migrate"):
        unmigrated.create("r1", _first("r1", j.new_writer_id()), _info("r1"))
    unmigrated.close()
    store = PostgresStore(libpq(dsn), schema=name)
    try:
        store.create("r1", _first("r1", j.new_writer_id()), _info("r1"))
        assert _sql(dsn, "SELECT count(*) FROM pg_tables WHERE schemaname = %s", (name,)) == [(4,)]
    finally:
        store.close()
        _sql(dsn, f"DROP SCHEMA {name} CASCADE")


def test_unreachable_server_is_a_clear_error() -> None:
    store = PostgresStore(
        "postgresql://root@127.0.0.1:1/test", connect_timeout=1, pool_timeout=1, retry_timeout=1
    )
    with pytest.raises(TetherError, match=r"no PostgreSQL server answers at 127.0.0.1:1: .*Fix: start the"):
        store.length("r1")
    store.close()


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _pool_records(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith(("psycopg", "tether.stores"))]


def _connect_attempts(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every connection psycopg is asked to make from now on (the pool's too), by connection string."""
    attempts: list[str] = []
    real = psycopg.Connection.connect

    def counted(cls: Any, conninfo: str = "", **kwargs: Any) -> Any:
        attempts.append(conninfo)
        return real.__func__(cls, conninfo, **kwargs)  # type: ignore[attr-defined]

    monkeypatch.setattr(psycopg.Connection, "connect", classmethod(counted))  # what the pool calls
    monkeypatch.setattr(psycopg, "connect", psycopg.Connection.connect)  # the alias, bound at import
    return attempts


def test_no_server_at_the_port_is_one_clear_error_at_once_without_the_pools_log_lines(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = _closed_port()
    store = PostgresStore(f"postgresql://root@127.0.0.1:{port}/test")  # the default timeouts
    caplog.set_level(logging.DEBUG)
    attempts = _connect_attempts(monkeypatch)
    with pytest.raises(PostgresUnavailableError) as caught:
        store.list()
    assert len(attempts) == 1, "fails at the first connection, not after the pool's and the retries' attempts"
    assert str(caught.value).startswith(
        f"no PostgreSQL server answers at 127.0.0.1:{port}: Connection refused"
    )
    assert "Fix: start the server, or correct the host and port in the URL" in str(caught.value)
    assert _pool_records(caplog) == [], "no 'error connecting' lines from psycopg_pool"
    store.close()


def test_a_missing_database_is_named_with_createdb_not_an_unreachable_server(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = postgres_or_skip()
    params = conninfo_to_dict(base)
    params["dbname"] = "tether_no_such_database"
    store = PostgresStore(make_conninfo("", **params))
    caplog.set_level(logging.DEBUG)
    attempts = _connect_attempts(monkeypatch)
    with pytest.raises(TetherError) as caught:
        store.length("r1")
    assert len(attempts) == 1, "fails at the first connection, not after the pool's and the retries' attempts"
    text = str(caught.value)
    assert not isinstance(caught.value, PostgresUnavailableError)
    assert text.startswith(
        f"PostgreSQL at {params.get('host', 'localhost')}:{params.get('port', 5432)} has no "
    )
    assert "has no database tether_no_such_database (" in text
    assert "Fix: create it (createdb tether_no_such_database" in text and "server runs" not in text
    assert _pool_records(caplog) == []
    store.close()


def test_nul_characters_in_listing_fields_are_kept_out_of_text_columns(db: PostgresStore) -> None:
    writer = j.new_writer_id()
    db.create("r1", _first("r1", writer), _info("r1", first_message="a\x00b"))
    assert db.list()[0].first_message == "ab"


# --------------------------------------------------------------------------------------------------
# Connection loss


def _append_through(face: str, db: PostgresStore, lease: Any, batch: list[j.Entry]) -> None:
    """``_append`` through the sync face, or the same append awaited through the async one."""
    if face == "sync":
        _append(db, "r1", lease, batch)
        return
    info = _info("r1")
    call = db.aappend(
        "r1", batch, expected_seq=batch[0].seq, writer=batch[0].w, lease_token=lease.token, info=info
    )
    asyncio.run(_then_close(db, call))


async def _then_close(db: PostgresStore, call: Any) -> Any:
    try:
        return await call
    finally:
        await db.aclose()  # this loop's pool closes with it (and the sync pool: reopened below)


@pytest.mark.parametrize("face", ["sync", "async"])
def test_an_append_whose_commit_outcome_is_unknown_is_settled_by_the_same_writer_rule(
    face: str, dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _sql(dsn, "TRUNCATE runs, entries, inbox")
    db = PostgresStore(dsn)
    writer, lease = _make(db, "r1", held=True)
    assert lease is not None
    name = "_run" if face == "sync" else "_arun"
    real = getattr(db, name)
    attempts: list[int] = []

    def cut_after_commit(fn: Any, **kw: Any) -> Any:
        async def once(cx: Any, attempt: int) -> Any:
            result = await fn(cx, attempt)  # the transaction commits here
            attempts.append(attempt)
            if attempt == 0:  # ... and the connection drops before the reply is read
                raise psycopg.OperationalError("server closed the connection unexpectedly")
            return result

        return real(once, **kw)

    monkeypatch.setattr(db, name, cut_after_commit)
    _append_through(face, db, lease, _batch(2, 2, writer))
    monkeypatch.undo()
    db.close()
    assert attempts == [0, 1]
    again = PostgresStore(dsn)
    assert [e.seq for e in again.read("r1")] == [
        0,
        1,
        2,
        3,
    ]  # retried on a new connection: skipped, not doubled
    assert again.list()[0].length == 4
    again.close()


@pytest.mark.parametrize("face", ["sync", "async"])
def test_a_backend_killed_during_an_append_is_retried_on_a_new_connection(face: str, dsn: str) -> None:
    _sql(dsn, "TRUNCATE runs, entries, inbox")
    app = f"tether-mid-append-{os.getpid()}-{face}"
    db = PostgresStore(f"{dsn}&application_name={app}")
    writer, lease = _make(db, "r1", held=True)
    assert lease is not None
    errors: list[BaseException] = []

    def append() -> None:
        try:
            _append_through(face, db, lease, _batch(2, 3, writer))
        except BaseException as exc:
            errors.append(exc)

    with psycopg.connect(libpq(dsn)) as locker:  # holds the run's row: the append's fence waits for it
        locker.execute("SELECT 1 FROM runs WHERE id = 'r1' FOR UPDATE")
        appending = threading.Thread(target=append)
        appending.start()
        deadline, waiting = time.monotonic() + 20, []
        while not waiting and time.monotonic() < deadline:
            time.sleep(0.02)
            waiting = _sql(dsn, "SELECT pid FROM pg_stat_activity WHERE application_name = %s AND "
                           "wait_event_type = 'Lock'", (app,))  # fmt: skip
        assert waiting, "the append never waited on the run's row"
        _sql(dsn, "SELECT pg_terminate_backend(%s)", (waiting[0][0],))  # killed mid-statement: rolled back
        locker.rollback()
    appending.join(30)
    assert not appending.is_alive() and not errors, errors
    db.close()
    again = PostgresStore(dsn)
    assert [e.seq for e in again.read("r1")] == [0, 1, 2, 3, 4]  # retried on a new connection, once
    assert again.list()[0].length == 5
    again.close()


def test_killed_idle_connections_and_posts_are_retried(dsn: str) -> None:
    app = f"tether-kill-{os.getpid()}"
    store = PostgresStore(f"{dsn}&application_name={app}", pool_min=3, pool_max=3)
    writer, lease = _make(store, "k1", held=True)
    assert lease is not None
    seq = 2
    for round_ in range(5):
        time.sleep(0.1)
        assert _kill_backends(dsn, app) >= 1  # every pooled connection dies while idle
        _append(store, "k1", lease, _batch(seq, 2, writer, run_id="k1"))
        seq += 2
        assert store.post("k1", {"type": "message"}, item_id=f"m{round_}") == round_
        assert store.post("k1", {"type": "message"}, item_id=f"m{round_}") == round_
        lease = store.renew(lease)
    assert store.length("k1") == seq and store.inbox_length("k1") == 5
    assert [i.inbox_seq for i in store.read_inbox("k1")] == list(range(5))
    store.close()


# --------------------------------------------------------------------------------------------------
# The inbox


def test_the_same_item_id_posted_by_many_threads_at_once_is_stored_once(db: PostgresStore) -> None:
    _make(db, "r1")
    seqs: list[int] = []
    barrier = threading.Barrier(6)

    def post() -> None:
        barrier.wait()
        seqs.append(db.post("r1", {"type": "cancel"}, item_id="same"))

    threads = [threading.Thread(target=post) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert seqs == [0] * 6 and db.inbox_length("r1") == 1


def test_posts_submitted_runs_and_releases_with_work_left_notify(db: PostgresStore, dsn: str) -> None:
    tag = f"n{os.getpid()}x{time.monotonic_ns()}"  # the channel is the database's: other schemas notify too
    with psycopg.connect(libpq(dsn), autocommit=True) as conn:
        conn.execute("LISTEN tether_work")

        def heard() -> list[str]:
            return [n.payload for n in conn.notifies(timeout=0.3) if n.payload.startswith(tag)]

        _, lease = _make(db, f"{tag}-held", held=True)
        assert heard() == []  # a run created held needs no worker
        db.post(f"{tag}-held", {"type": "message"})
        assert heard() == [f"{tag}-held"]
        assert lease is not None and not db.release(lease, at_seq=2, inbox_len=0)
        assert heard() == []
        db.abandon(lease)  # given up with an unconsumed item: a worker may take it
        assert heard() == [f"{tag}-held"]
        _make(db, f"{tag}-new")  # a submitted run
        assert heard() == [f"{tag}-new"]
        _, done = _make(db, f"{tag}-done", held=True, status="completed")
        assert done is not None and db.release(done, at_seq=2, inbox_len=0)  # nothing left to do
        _make(db, f"{tag}-kid", parent_id=f"{tag}-done", root_id=f"{tag}-done")
        assert heard() == []  # a child is never claimed: nothing to wake a worker for
        db.post(f"{tag}-kid", {"type": "message"})
        assert heard() == [f"{tag}-done"]  # the payload is the root's id


def test_wait_for_work_listens_on_its_own_connection_and_wakes_on_a_post(db: PostgresStore, dsn: str) -> None:
    listener = PostgresStore(dsn, pool_min=0)
    assert listener.wait_for_work(0.1) is True  # the first call starts listening: look now
    _make(db, "r1")
    woke: list[bool] = []
    thread = threading.Thread(target=lambda: woke.append(listener.wait_for_work(60)))
    thread.start()
    time.sleep(0.2)
    db.post("r1", {"type": "message"})
    thread.join(60)
    assert woke == [True]
    assert listener._pools == {}  # no pooled connection was used for listening
    listener.close()
    assert listener.wait_for_work(5) is False  # a closed store does not listen


# --------------------------------------------------------------------------------------------------
# claim_next


def test_claim_next_uses_the_partial_index(db: PostgresStore, dsn: str) -> None:
    from tether.stores.postgres._sql import FREE, WORK

    rows = [(f"x{i:05d}", "completed" if i % 50 else "running") for i in range(5000)]
    with psycopg.connect(libpq(dsn), autocommit=True) as conn:
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO runs (id, agent, status, updated_at, root_id) VALUES (%s, 'a', %s, "
                'to_char(now(), \'YYYY-MM-DD"T"HH24:MI:SS.US"Z"\'), %s)',
                [(rid, status, rid) for rid, status in rows],
            )
        conn.execute("ANALYZE runs")
        plan = conn.execute(
            f"EXPLAIN SELECT id FROM {db._t.runs} AS r WHERE {WORK} AND {FREE} AND {db._t.needs} "
            "ORDER BY updated_at, id LIMIT 1 FOR UPDATE OF r SKIP LOCKED"
        ).fetchall()
    assert "runs_work" in str(plan)
    taken = db.claim_next(Owner.here())
    assert taken is not None and taken.run_id == "x00000"


def _claimed_by_threads(dsn: str, threads: int, claim: Any) -> list[str]:
    """Every run id ``claim(store)`` hands out in ``threads`` threads, each on a store of its own, claiming
    until it gets none."""
    got: list[str] = []
    lock = threading.Lock()

    def claim_all() -> None:
        store = PostgresStore(dsn)
        while leases := claim(store):
            with lock:
                got.extend(lease.run_id for lease in leases)
        store.close()

    running = [threading.Thread(target=claim_all) for _ in range(threads)]
    for thread in running:
        thread.start()
    for thread in running:
        thread.join()
    return got


def test_concurrent_claim_next_never_hands_out_one_run_twice(db: PostgresStore, dsn: str) -> None:
    for i in range(40):
        _make(db, f"q{i:02d}")

    def one(store: PostgresStore) -> list[Any]:
        lease = store.claim_next(Owner.here())
        return [] if lease is None else [lease]

    got = _claimed_by_threads(dsn, 6, one)
    assert sorted(got) == [f"q{i:02d}" for i in range(40)]


def test_claim_next_batch_pairs_each_claimed_root_with_one_owner(db: PostgresStore) -> None:
    for i in range(5):
        _make(db, f"b{i}")
    _make(db, "b-held", held=True)
    _make(db, "b-other-agent", agent="z")
    owners = [Owner.here() for _ in range(3)]
    leases = db.claim_next_batch(owners, agents=["a"])
    assert [lease.run_id for lease in leases] == ["b0", "b1", "b2"]  # the oldest free roots first
    assert sorted(lease.owner.writer for lease in leases) == sorted(o.writer for o in owners)
    for lease in leases:
        assert db.holder(lease.run_id) == lease.owner and lease.token == 1 and lease.expires_at is not None
        db.renew(lease)  # each lease is the run's: its token and owner hold
    rest = db.claim_next_batch([Owner.here() for _ in range(4)], agents=["a"])
    assert [lease.run_id for lease in rest] == ["b3", "b4"]  # fewer: no more were free
    assert db.claim_next_batch([Owner.here()], agents=["a"]) == []
    assert (
        db.claim_next_batch([], agents=["a"]) == [] and db.claim_next_batch([Owner.here()], agents=[]) == []
    )
    assert [lease.run_id for lease in db.claim_next_batch([Owner.here()])] == ["b-other-agent"]


def test_claim_next_batch_retried_after_a_lost_commit_returns_its_own_claims(db: PostgresStore) -> None:
    from tether.stores.base import run_sync
    from tether.stores.postgres import _primitives as p
    from tether.stores.postgres._conn import SyncCx

    for i in range(3):
        _make(db, f"r{i}")
    owners = [Owner.here() for _ in range(2)]
    first = db.claim_next_batch(owners)
    with db._pool().connection() as conn:  # the same owners again, as a retry (its COMMIT's outcome unknown)
        again = run_sync(p.claim_next_batch(SyncCx(conn), db._t, 1, owners, 30.0, None))
    assert sorted((lease.run_id, lease.token, lease.owner) for lease in again) == sorted(
        (lease.run_id, lease.token, lease.owner) for lease in first
    )
    assert db.holder("r2") is None  # nothing more was claimed


def test_concurrent_claim_next_batches_never_hand_out_one_run_twice(db: PostgresStore, dsn: str) -> None:
    for i in range(60):
        _make(db, f"c{i:02d}")
    got = _claimed_by_threads(dsn, 4, lambda store: store.claim_next_batch([Owner.here() for _ in range(7)]))
    assert sorted(got) == [f"c{i:02d}" for i in range(60)]


def test_claim_next_batch_takes_a_root_left_by_a_dead_process_of_this_host(
    db: PostgresStore, dsn: str
) -> None:
    _make(db, "dead-held")
    dead = Owner("w-dead", 2**22 + 12345, socket.gethostname(), j.now_iso())  # no such pid
    taken = db.claim("dead-held", dead)
    assert taken.token == 1
    leases = db.claim_next_batch([Owner.here(), Owner.here()])
    assert [lease.run_id for lease in leases] == ["dead-held"] and leases[0].token == 2


# --------------------------------------------------------------------------------------------------
# The conformance suite


def _open_store_opens_postgres() -> bool:
    from tether.stores import open_store

    try:
        return isinstance(open_store("postgresql://tether@127.0.0.1:1/none"), PostgresStore)
    except ValueError:
        return False


class TestPostgresConformance(StoreConformance):
    multiprocess_skip_reason = (
        None if _open_store_opens_postgres() else "open_store() does not open postgresql:// URLs yet"
    )

    @pytest.fixture(autouse=True)
    def _empty_schema(self, dsn: str) -> None:
        self.dsn = dsn
        _sql(dsn, "TRUNCATE runs, entries, inbox")

    def make_store(self, tmp_path: Path) -> PostgresStore:
        return PostgresStore(self.dsn)

    def store_url(self, tmp_path: Path) -> str:
        return self.dsn

    def reopen(self, store: Any, tmp_path: Path) -> PostgresStore:
        return PostgresStore(self.dsn)
