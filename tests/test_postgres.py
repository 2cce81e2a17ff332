"""PostgresStore against a real server: the append, inbox and lease rules (DURABILITY 2-4), connection loss,
LISTEN/NOTIFY, with real processes. One fresh schema per module; skipped without a server, failed when
``TETHER_REQUIRE_POSTGRES=1``."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).with_name("crash")))

from _chaos_agents import fresh_schema

import tether.testing
from _store_runs import _append, _batch, _first, _info, _make
from tether import journal as j
from tether.errors import (
    CorruptJournalError,
    RunBusyError,
    RunNotFoundError,
    TetherError,
)
from tether.stores.base import Owner

if os.environ.get("TETHER_REQUIRE_POSTGRES") != "1":
    pytest.importorskip("psycopg", reason="psycopg is not installed. Fix: pip install 'tether[postgres]'")
import psycopg

from tether.stores.postgres import SCHEMA_VERSION, PostgresStore

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
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(sql, params)
        return cur.fetchall() if cur.description else []


def _age(dsn: str, run_id: str, seconds: float) -> None:
    at = (datetime.now(UTC) - timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    _sql(dsn, "UPDATE runs SET updated_at = %s WHERE id = %s", (at, run_id))


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


def test_round_trip(db: PostgresStore, dsn: str) -> None:
    writer, lease = _make(db, "r1", held=True)
    assert lease is not None and lease.token == 1 and lease.expires_at is not None
    server_now = _sql(dsn, "SELECT extract(epoch FROM now())::float8")[0][0]
    assert lease.expires_at == pytest.approx(server_now + db.ttl, abs=5)  # type: ignore[operator]
    more = _batch(2, 3, writer)
    _append(db, "r1", lease, more, turn=3, status="waiting")
    read = db.read("r1")
    assert [e.seq for e in read] == [0, 1, 2, 3, 4]
    assert read[2:] == more
    assert [e.seq for e in db.read("r1", after_seq=2)] == [3, 4]
    assert db.read("r1", after_seq=4) == []
    assert db.length("r1") == 5 and db.inbox_length("r1") == 0
    (info,) = db.list()
    assert (info.id, info.status, info.turn, info.agent, info.length) == ("r1", "waiting", 3, "a", 5)
    assert info.lease_owner == f"{lease.owner.host}:{os.getpid()}"
    assert info.lease_expires_at == pytest.approx(lease.expires_at)
    state = db.load("r1")
    assert len(state.history) == 5 and state.store_identity == db.identity
    for missing in (db.read, db.length, db.inbox_length, db.read_inbox, db.holder, db.delete):
        with pytest.raises(RunNotFoundError):
            missing("nope")


def test_identity_hides_the_password_and_equal_stores_compare_equal(dsn: str) -> None:
    store = PostgresStore("postgresql://bob:s3cret@db.example:5433/runs?options=-csearch_path%3Dx")
    assert "s3cret" not in store.identity
    assert store.identity == "postgresql://bob@db.example:5433/runs?options=-csearch_path%3Dx"
    assert PostgresStore("host=db.example port=5433 user=bob password=other dbname=runs "
                         "options=-csearch_path=x") == store  # fmt: skip
    assert PostgresStore(dsn) == PostgresStore(dsn) and PostgresStore(dsn) != store
    assert PostgresStore(PostgresStore(dsn).identity).identity == PostgresStore(dsn).identity


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
        assert _sql(dsn, "SELECT version FROM tether_schema") == [(SCHEMA_VERSION,)]
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


def test_a_missing_schema_is_a_clear_error(dsn: str) -> None:
    store = PostgresStore(dsn.replace("search_path%3D", "search_path%3Dno_such_schema_"))
    with pytest.raises(
        TetherError, match=r"refused: no schema .*Fix: check the DSN's database, user and schema"
    ):
        store.create("r1", _first("r1", j.new_writer_id()), _info("r1"))
    store.close()


def test_unreachable_server_is_a_clear_error() -> None:
    store = PostgresStore(
        "postgresql://root@127.0.0.1:1/test", connect_timeout=1, pool_timeout=1, retry_timeout=1
    )
    with pytest.raises(TetherError, match=r"unreachable .*Fix: check that the server runs"):
        store.length("r1")
    store.close()


def test_a_damaged_entry_is_corruption(db: PostgresStore, dsn: str) -> None:
    _make(db, "r1")
    (body,) = _sql(dsn, "SELECT body FROM entries WHERE run_id = 'r1' AND seq = 1")[0]
    _sql(
        dsn,
        "UPDATE entries SET body = %s WHERE run_id = 'r1' AND seq = 1",
        (bytes(body).replace(b"hi", b"ho"),),
    )
    with pytest.raises(CorruptJournalError, match="seq 1"):
        db.read("r1")
    with pytest.raises(CorruptJournalError, match="seq 1"):
        db.read("r1", after_seq=0)


def test_nul_characters_in_listing_fields_are_kept_out_of_text_columns(db: PostgresStore) -> None:
    writer = j.new_writer_id()
    db.create("r1", _first("r1", writer), _info("r1", first_message="a\x00b"))
    assert db.list()[0].first_message == "ab"


# --------------------------------------------------------------------------------------------------
# Leases and the fence


def test_a_dead_holder_on_this_host_does_not_block_a_take(db: PostgresStore) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    dead = Owner(j.new_writer_id(), int(proc.stdout), Owner.here().host, j.now_iso())
    db.create("r1", _first("r1", dead.writer), _info("r1"), owner=dead)
    db.create("r2", _first("r2", dead.writer), _info("r2"), owner=dead)
    assert db.holder("r1") is None
    assert {i.id: i.lease_owner for i in db.list()} == {"r1": None, "r2": None}
    assert db.claim("r1", Owner.here()).token == 2
    taken = db.claim_next(Owner.here())  # claim_next takes a dead process's root too
    assert taken is not None and (taken.run_id, taken.token) == ("r2", 2)


# --------------------------------------------------------------------------------------------------
# Connection loss


def test_an_append_whose_commit_outcome_is_unknown_is_settled_by_the_same_writer_rule(
    db: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer, lease = _make(db, "r1", held=True)
    assert lease is not None
    real = db._run
    attempts: list[int] = []

    def cut_after_commit(fn: Any, **kw: Any) -> Any:
        def once(conn: Any, attempt: int) -> Any:
            result = fn(conn, attempt)  # the transaction commits here
            attempts.append(attempt)
            if attempt == 0:  # ... and the connection drops before the reply is read
                raise psycopg.OperationalError("server closed the connection unexpectedly")
            return result

        return real(once, **kw)

    monkeypatch.setattr(db, "_run", cut_after_commit)
    _append(db, "r1", lease, _batch(2, 2, writer))
    monkeypatch.undo()
    assert attempts == [0, 1]
    assert [e.seq for e in db.read("r1")] == [0, 1, 2, 3]  # retried on a new connection: skipped, not doubled
    assert db.list()[0].length == 4


def test_a_backend_killed_during_an_append_is_retried_on_a_new_connection(
    db: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer, lease = _make(db, "r1", held=True)
    assert lease is not None
    real_insert = PostgresStore._insert
    killed: list[int] = []

    def insert_then_die(conn: Any, run_id: str, entries: Any) -> None:
        real_insert(conn, run_id, entries)
        if not killed:  # the backend dies mid-transaction: the server rolls the append back
            killed.append(conn.info.backend_pid)
            conn.execute("SELECT pg_terminate_backend(pg_backend_pid())")

    monkeypatch.setattr(PostgresStore, "_insert", staticmethod(insert_then_die))
    _append(db, "r1", lease, _batch(2, 3, writer))
    monkeypatch.undo()
    assert killed and [e.seq for e in db.read("r1")] == [0, 1, 2, 3, 4]
    assert db.list()[0].length == 5


def test_killed_idle_connections_and_posts_are_retried(dsn: str) -> None:
    app = f"tether-kill-{os.getpid()}"
    store = PostgresStore(f"{dsn}&application_name={app}", pool_min=3, pool_max=3)
    writer, lease = _make(store, "k1", held=True)
    assert lease is not None
    seq = 2
    for round_ in range(5):
        time.sleep(0.1)
        assert _kill_backends(dsn, app) >= 1  # every pooled connection dies while idle
        _append(store, "k1", lease, _batch(seq, 2, writer))
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
    with psycopg.connect(dsn, autocommit=True) as conn:
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
# claim_next, prune, delete


def test_claim_next_takes_the_oldest_root_needing_work(db: PostgresStore, dsn: str) -> None:
    _make(db, "done", status="completed")
    _make(db, "child", parent_id="root", root_id="root")  # running, but a child: never claimed itself
    _make(db, "held", held=True)
    _make(db, "root", agent="b")
    _make(db, "waiting", status="waiting", agent="c")
    _make(db, "posted", status="completed", agent="c")
    for run_id, age in [
        ("done", 90),
        ("child", 80),
        ("held", 70),
        ("root", 60),
        ("waiting", 50),
        ("posted", 40),
    ]:
        _age(dsn, run_id, age)
    db.post("posted", {"type": "message"})
    me = Owner.here()
    assert db.claim_next(me, agents=[]) is None
    assert db.claim_next(me, agents=["zzz"]) is None
    first = db.claim_next(me, agents=["c", "a"])
    assert first is not None and first.run_id == "posted"  # "root" is agent b; "waiting" has no work
    assert first.token == 1 and db.holder("posted") == me
    second = db.claim_next(me)
    assert second is not None and second.run_id == "root"
    assert db.claim_next(me) is None  # "child" is reached through its root only; "held" is held
    assert _sql(dsn, "SELECT lease_token FROM runs WHERE id = 'child'") == [(0,)]
    db.post("child", {"type": "message"})
    db.abandon(second)
    _sql(dsn, "UPDATE runs SET status = 'waiting' WHERE id = 'root'")
    again = db.claim_next(me)  # a waiting root whose child has unconsumed items
    assert again is not None and again.run_id == "root" and again.token == 2
    db.abandon(again)
    _sql(dsn, "UPDATE runs SET inbox_consumed = inbox_len - 1 WHERE id = 'child'")
    assert db.claim_next(me) is None  # the child is consumed and still running, updated before the root
    _sql(dsn, "UPDATE runs SET status = 'completed' WHERE id = 'child'")
    _age(dsn, "child", 1)
    moved = db.claim_next(me)  # the child moved on after the root was updated
    assert moved is not None and moved.run_id == "root"
    assert _sql(dsn, "SELECT lease_token FROM runs WHERE id = 'child'") == [(0,)]


def test_claim_next_uses_the_partial_index(db: PostgresStore, dsn: str) -> None:
    from tether.stores.postgres._sql import FREE, NEEDS, WORK

    rows = [(f"x{i:05d}", "completed" if i % 50 else "running") for i in range(5000)]
    with psycopg.connect(dsn, autocommit=True) as conn:
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO runs (id, agent, status, updated_at, root_id) VALUES (%s, 'a', %s, "
                'to_char(now(), \'YYYY-MM-DD"T"HH24:MI:SS.US"Z"\'), %s)',
                [(rid, status, rid) for rid, status in rows],
            )
        conn.execute("ANALYZE runs")
        plan = conn.execute(
            f"EXPLAIN SELECT id FROM runs AS r WHERE {WORK} AND {FREE} AND {NEEDS} "
            "ORDER BY updated_at, id LIMIT 1 FOR UPDATE OF r SKIP LOCKED"
        ).fetchall()
    assert "runs_work" in str(plan)
    taken = db.claim_next(Owner.here())
    assert taken is not None and taken.run_id == "x00000"


def test_concurrent_claim_next_never_hands_out_one_run_twice(db: PostgresStore, dsn: str) -> None:
    for i in range(40):
        _make(db, f"q{i:02d}")
    got: list[str] = []
    lock = threading.Lock()

    def claim_all() -> None:
        store = PostgresStore(dsn)
        while (lease := store.claim_next(Owner.here())) is not None:
            with lock:
                got.append(lease.run_id)
        store.close()

    threads = [threading.Thread(target=claim_all) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(got) == [f"q{i:02d}" for i in range(40)]


def test_prune_rules(db: PostgresStore, dsn: str) -> None:
    _make(db, "old-done", status="completed")
    _make(db, "old-failed", status="failed")
    _make(db, "old-running")
    _make(db, "new-done", status="completed")
    _make(db, "old-held", status="completed", held=True)
    _make(db, "old-posted", status="completed")
    _make(db, "tree", status="completed")
    _make(db, "tree-kid", status="cancelled", parent_id="tree", root_id="tree")
    _make(db, "kept", status="completed")
    _make(db, "kept-kid", status="waiting", parent_id="kept", root_id="kept")
    for run_id in ("old-done", "old-failed", "old-running", "old-held", "old-posted", "tree", "tree-kid",
                   "kept", "kept-kid"):  # fmt: skip
        _age(dsn, run_id, 7200)
    db.post("old-posted", {"type": "message"})  # an unconsumed item may reopen it: kept
    cutoff = datetime.now(UTC) - timedelta(hours=1)
    assert db.prune(cutoff, dry_run=True) == ["old-done", "old-failed"]  # trees only with children=True
    assert db.length("old-done") == 2
    assert db.prune(timedelta(hours=1), statuses=("failed",), dry_run=True) == ["old-failed"]
    assert db.prune(cutoff, children=True, dry_run=True) == ["old-done", "old-failed", "tree", "tree-kid"]
    assert db.prune(cutoff.isoformat(), children=True) == ["old-done", "old-failed", "tree", "tree-kid"]
    left = {info.id for info in db.list()}
    assert left == {"old-running", "new-done", "old-held", "old-posted", "kept", "kept-kid"}
    assert _sql(dsn, "SELECT count(*) FROM entries WHERE run_id = 'old-done'") == [(0,)]
    assert _sql(dsn, "SELECT count(*) FROM inbox WHERE run_id = 'old-posted'") == [(1,)]
    assert db.prune(cutoff, children=True) == []
    with pytest.raises(ValueError, match="not stops"):
        db.prune(cutoff, statuses=("running",))


def test_delete_refuses_a_held_run_and_takes_children_only_when_asked(db: PostgresStore, dsn: str) -> None:
    _, lease = _make(db, "r1", held=True)
    assert lease is not None
    db.post("r1", {"type": "cancel"})
    with pytest.raises(RunBusyError, match="Fix: wait for it"):
        db.delete("r1")
    assert db.length("r1") == 2
    db.abandon(lease)
    db.delete("r1")
    with pytest.raises(RunNotFoundError):
        db.read("r1")
    for table in ("entries", "inbox", "runs"):
        assert _sql(dsn, f"SELECT count(*) FROM {table}") == [(0,)]
    _make(db, "r1")  # the id is free again
    assert db.inbox_length("r1") == 0
    _make(db, "p", status="completed")
    _make(db, "p-kid", status="completed", parent_id="p", root_id="p")
    _, held = _make(db, "p-kid2", held=True, status="running", parent_id="p-kid", root_id="p")
    with pytest.raises(ValueError, match="subagent of p"):
        db.delete("p-kid")
    with pytest.raises(ValueError, match="children=True"):
        db.delete("p")
    with pytest.raises(RunBusyError):
        db.delete("p", children=True)
    assert {i.id for i in db.list(root_id="p")} == {"p", "p-kid", "p-kid2"}
    assert held is not None
    db.abandon(held)
    db.delete("p", children=True)
    assert {i.id for i in db.list()} == {"r1"}


# --------------------------------------------------------------------------------------------------
# Listing


# --------------------------------------------------------------------------------------------------
# Processes, and an agent on PostgreSQL


def _append_for(dsn: str, run_id: str, seconds: float) -> int:
    store = PostgresStore(dsn)
    writer, lease = _make(store, run_id, held=True)
    assert lease is not None
    seq = 2
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        count = 1 + seq % 3
        _append(store, run_id, lease, _batch(seq, count, writer, text=f"{run_id}-{seq}"))
        seq += count
    assert store.release(lease, at_seq=seq, inbox_len=0)
    store.close()
    return seq


def _post_and_settle(dsn: str, worker: int, count: int) -> None:
    store = PostgresStore(dsn)
    for i in range(count):
        text = [{"type": "text", "text": f"{worker}-{i}"}]
        store.post("r1", {"type": "message", "role": "user", "content": text}, item_id=f"{worker}-{i}")
        store.settle("r1")  # DURABILITY 2.1: try once more to take the run after posting
    store.close()


@pytest.mark.slow
def test_processes_append_and_post_at_once(db: PostgresStore, dsn: str) -> None:
    _make(db, "r1")
    ctx = multiprocessing.get_context("spawn")
    posters = [ctx.Process(target=_post_and_settle, args=(dsn, w, 25)) for w in range(4)]
    for proc in posters:
        proc.start()
    with ctx.Pool(3) as pool:
        lengths = pool.starmap(_append_for, [(dsn, f"w{i}", 2.0) for i in range(3)])
    for proc in posters:
        proc.join(120)
        assert proc.exitcode == 0
    for i, length in enumerate(lengths):
        entries = db.read(f"w{i}")
        assert len(entries) == length == db.length(f"w{i}") > 10
        assert all(e.content[0]["text"].startswith(f"w{i}-") for e in entries[2:])  # type: ignore[attr-defined]
    state = db.load("r1")
    journaled = [
        e.inbox_seq for e in state.history if isinstance(e, j.MessageAdded) and e.inbox_seq is not None
    ]
    assert journaled == list(range(100))  # each item once, in inbox order, none left behind
    assert db.holder("r1") is None and db.list(root_id="r1")[0].inbox_consumed == 99


AGENT_SCRIPT = textwrap.dedent(
    '''
    import os, sys
    from tether import Agent, tool
    from tether.stores.postgres import PostgresStore
    from tether.testing import ExecutionLog, ScriptedModel, call

    LOG = ExecutionLog(os.environ["EXEC_LOG"])


    @tool(effect="unsafe")
    def charge(amount: int) -> str:
        """Charge a card.

        Args:
            amount: how much.
        """
        LOG.record(tool="charge", amount=amount)
        return f"charged {amount}"


    agent = Agent(
        ScriptedModel([call("charge", amount=5), "Charged 5."]),
        name="biller",
        tools=[charge],
        store=PostgresStore(sys.argv[1]),
    )
    state = agent.run("Charge 5", id="bill-1") if sys.argv[2] == "run" else agent.resume("bill-1")
    print("STATUS", state.status, state.answer)
    '''
)


def _script(
    tmp_path: Path, dsn: str, mode: str, failpoint: str | None = None
) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "biller.py"
    script.write_text(AGENT_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != "TETHER_FAILPOINT"}
    env["EXEC_LOG"] = str(tmp_path / "executions.log")
    if failpoint:
        env["TETHER_FAILPOINT"] = failpoint
    return subprocess.run(
        [sys.executable, str(script), dsn, mode], env=env, capture_output=True, text=True, timeout=60
    )


@pytest.mark.crash
@pytest.mark.parametrize("point", ["after_append", "torn_append", "before_append"])
def test_killed_at_an_append_then_resumed_runs_the_unsafe_tool_at_most_once(
    tmp_path: Path, db: PostgresStore, dsn: str, point: str
) -> None:
    from tether.testing import ExecutionLog

    crashed = _script(tmp_path, dsn, "run", f"{point}:tool_finished")
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    kinds = [e.kind for e in db.read("bill-1")]
    assert kinds[-1] == ("tool_finished" if point == "after_append" else "tool_started")
    resumed = _script(tmp_path, dsn, "resume")  # at once: the dead holder's lease does not block
    assert resumed.returncode == 0, resumed.stderr
    assert "STATUS completed" in resumed.stdout
    assert ExecutionLog(tmp_path / "executions.log").count(tool="charge") == 1
    finished = [e for e in db.read("bill-1") if e.kind == "tool_finished"]
    assert [e.outcome for e in finished] == (["done"] if point == "after_append" else ["aborted"])  # type: ignore[attr-defined]


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
