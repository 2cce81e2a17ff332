"""SQLiteStore on real files: what only SQLite does (the file, its modes, pragmas and connections, the schema
version and its migrations, index use), with real processes. The rules it shares with PostgresStore are in
``test_sql_stores.py``; the store contract in the conformance suite (``test_conformance.py``)."""

from __future__ import annotations

import gc
import multiprocessing
import sqlite3
import stat
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

from _store_runs import _append, _batch, _make
from tether import journal as j
from tether.errors import (
    TetherError,
)
from tether.stores.base import Owner
from tether.stores.sqlite import SCHEMA_VERSION, SQLiteStore

# --------------------------------------------------------------------------------------------------
# Helpers


@pytest.fixture
def db(tmp_path: Path) -> Iterator[SQLiteStore]:
    store = SQLiteStore(tmp_path / "runs.db")
    yield store
    store.close()


# --------------------------------------------------------------------------------------------------
# Basics


def test_identity_is_the_resolved_path_and_equal_stores_compare_equal(
    db: SQLiteStore, tmp_path: Path
) -> None:
    assert db.identity == f"sqlite:///{(tmp_path / 'runs.db').resolve()}"
    assert SQLiteStore(tmp_path / "runs.db") == db


def test_file_modes(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "er" / "runs.db"
    store = SQLiteStore(path)
    _make(store, "r1")
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    for suffix in ("", "-wal", "-shm"):
        file = Path(f"{path}{suffix}")
        assert file.exists(), suffix
        assert stat.S_IMODE(file.stat().st_mode) == 0o600, suffix
    store.close()


def test_pragmas_are_set_on_every_connection(db: SQLiteStore) -> None:
    def check(out: list[tuple[Any, ...]]) -> None:
        conn = db._conn()
        out.append(
            (
                conn.execute("PRAGMA journal_mode").fetchone()[0],
                conn.execute("PRAGMA synchronous").fetchone()[0],
                conn.execute("PRAGMA busy_timeout").fetchone()[0],
                conn.execute("PRAGMA foreign_keys").fetchone()[0],
                conn.execute("PRAGMA user_version").fetchone()[0],
                conn.isolation_level,
                id(conn),
            )
        )

    seen: list[tuple[Any, ...]] = []
    check(seen)
    thread = threading.Thread(target=check, args=(seen,))
    thread.start()
    thread.join()
    assert [s[:6] for s in seen] == [("wal", 2, 5000, 1, SCHEMA_VERSION, None)] * 2
    assert seen[0][6] != seen[1][6]  # one connection per thread


def test_connections_of_finished_threads_are_not_kept(db: SQLiteStore) -> None:
    _make(db, "r1")
    for _ in range(20):  # as a renewal thread per drive would
        thread = threading.Thread(target=db.length, args=("r1",))
        thread.start()
        thread.join()
    gc.collect()
    assert len(db._conns) == 1


def test_schema_is_versioned_and_a_newer_one_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    SQLiteStore(path).close()
    conn = sqlite3.connect(path)
    tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
    assert {"runs", "entries", "inbox", "runs_updated", "runs_status", "runs_work"} <= tables
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(TetherError, match=r"newer tether.*Fix: upgrade tether"):
        SQLiteStore(path)


def test_a_file_that_is_not_a_database_is_refused_clearly(tmp_path: Path) -> None:
    (tmp_path / "junk.db").write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(TetherError, match=r"junk\.db is not a usable store .*Fix: check the path"):
        SQLiteStore(tmp_path / "junk.db")
    (tmp_path / "folder.db").mkdir()
    with pytest.raises(TetherError, match="not a usable store"):
        SQLiteStore(tmp_path / "folder.db")


# --------------------------------------------------------------------------------------------------
# The inbox


def test_threads_share_a_store(db: SQLiteStore) -> None:
    _make(db, "r1")
    seqs: list[int] = []
    lock = threading.Lock()

    def post(tag: str) -> None:
        for i in range(25):
            seq = db.post("r1", {"type": "cancel"}, item_id=f"{tag}{i}")
            with lock:
                seqs.append(seq)

    threads = [threading.Thread(target=post, args=(f"t{n}-",)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(seqs) == list(range(100))


# --------------------------------------------------------------------------------------------------
# claim_next


def test_claim_next_uses_the_partial_index(db: SQLiteStore) -> None:
    from tether.stores.sqlite.store import _NEXT

    plan = str(
        db._conn().execute(f"EXPLAIN QUERY PLAN {_NEXT} ORDER BY updated_at, id LIMIT 1", (1, 1)).fetchall()
    )
    assert "USING INDEX runs_work" in plan and "TEMP B-TREE" not in plan


# --------------------------------------------------------------------------------------------------
# Listing


def test_listing_reads_an_index_in_order(db: SQLiteStore) -> None:
    """The newest 50 of many runs come from an index, never a sort of every row (bench/listing.py times it)."""
    base = datetime(2025, 1, 1, tzinfo=UTC)
    rows = [
        (f"run{i:05d}", "a" if i % 2 else "b", "completed" if i % 3 else "running",
         (base + timedelta(seconds=i)).strftime("%Y-%m-%dT%H:%M:%S.%fZ"), f"run{i:05d}")
        for i in range(5000)
    ]  # fmt: skip
    conn = db._conn()
    conn.execute("BEGIN IMMEDIATE")
    conn.executemany(
        "INSERT INTO runs (id, agent, status, updated_at, root_id, length) VALUES (?, ?, ?, ?, ?, 2)", rows
    )
    conn.execute("COMMIT")
    statements: list[str] = []
    conn.set_trace_callback(statements.append)
    newest = db.list(limit=50)
    page, cursor = db.list_page(limit=50, cursor=db.list_page(limit=50)[1])
    db.list(status="running", limit=50)
    db.list(agent="a", limit=50)
    db.list(root_id="run00007", limit=50)
    conn.set_trace_callback(None)
    assert [i.id for i in newest] == [f"run{i:05d}" for i in range(4999, 4949, -1)]
    assert [i.id for i in page] == [f"run{i:05d}" for i in range(4949, 4899, -1)] and cursor is not None
    selects = [sql for sql in statements if sql.startswith("SELECT id, agent")]
    assert len(selects) >= 5
    for sql in selects:
        plan = str(conn.execute(f"EXPLAIN QUERY PLAN {sql}").fetchall())
        assert "USING INDEX" in plan and "TEMP B-TREE" not in plan, (sql, plan)


# --------------------------------------------------------------------------------------------------
# Processes


def _append_in_threes(path: str, batches: int) -> None:
    store = SQLiteStore(path)
    lease = store.claim("r1", Owner.here())
    for i in range(batches):
        batch = _batch(2 + 3 * i, 3, lease.owner.writer, text=f"{i}" * 100)
        _append(store, "r1", lease, batch)
    store.abandon(lease)
    store.close()


@pytest.mark.slow
def test_a_follower_sees_only_complete_appends(db: SQLiteStore) -> None:
    _make(db, "r1")
    proc = multiprocessing.get_context("spawn").Process(target=_append_in_threes, args=(str(db.path), 150))
    proc.start()
    last: list[j.Entry] = []
    lengths = set()
    while True:
        done = not proc.is_alive()
        last = last + db.read("r1", after_seq=len(last) - 1)  # tails, as follow() does
        lengths.add(len(last))
        assert (len(last) - 2) % 3 == 0 and db.length("r1") >= len(last)
        if done:
            break
    proc.join()
    assert proc.exitcode == 0
    assert last == db.read("r1") and len(last) == 452 and len(lengths) > 1


def test_save_load_and_settle_through_the_base_class(db: SQLiteStore) -> None:
    from tether import Message, State

    state = State(id="r1", messages=[Message.user("hi")])
    db.save(state)
    assert db.load("r1").history == state.history
    state = db.load("r1")
    state.add_message("again")
    db.save(state)  # posted, then settled: no one holds the run
    loaded = SQLiteStore(db.path).load("r1")
    assert [e.kind for e in loaded.history] == ["run_started", "message", "message"]
    assert loaded.history[-1].inbox_seq == 0 and loaded.inbox_consumed == 0  # type: ignore[attr-defined]
    assert db.cancel("r1") is not None
    assert db.load("r1").status == "cancelled" and db.list()[0].status == "cancelled"
    assert db.holder("r1") is None


# --------------------------------------------------------------------------------------------------
# An agent on SQLite


def test_an_agent_runs_to_completion_and_resume_writes_nothing(tmp_path: Path) -> None:
    from tether import Agent, tool
    from tether.testing import ExecutionLog, ScriptedModel, call

    log = ExecutionLog(tmp_path / "executions.log")

    @tool(effect="read_only")
    def get_weather(city: str) -> str:
        """Get the weather.

        Args:
            city: The city.
        """
        log.record(tool="get_weather", city=city)
        return f"sunny in {city}"

    store = SQLiteStore(tmp_path / "runs.db")
    agent = Agent(
        ScriptedModel([call("get_weather", city="London"), "Sunny in London."]),
        name="weather",
        tools=[get_weather],
        store=store,
    )
    state = agent.run("Weather in London?", id="w1")
    assert state.status == "completed" and state.answer == "Sunny in London."
    assert store.holder("w1") is None
    conn = store._conn()
    before = conn.execute("SELECT seq, body FROM entries WHERE run_id = 'w1' ORDER BY seq").fetchall()
    again = agent.resume("w1")
    assert again.status == "completed"
    assert conn.execute("SELECT seq, body FROM entries WHERE run_id = 'w1' ORDER BY seq").fetchall() == before
    assert log.count(tool="get_weather") == 1
    (info,) = store.list()
    assert (info.id, info.agent, info.status, info.turn, info.length) == (
        "w1",
        "weather",
        "completed",
        2,
        len(before),
    )
    store.close()


CLAIMER = textwrap.dedent(
    """
    import sys
    from tether import Owner
    from tether.errors import RunBusyError
    from tether.stores.sqlite import SQLiteStore

    store = SQLiteStore(sys.argv[1])
    try:
        lease = store.claim(sys.argv[2], Owner.here())
    except RunBusyError as exc:
        print("BUSY", exc)
    else:
        print("CLAIMED", lease.token)
    """
)


@pytest.mark.slow
def test_a_driver_renews_its_lease_while_a_slow_tool_runs(tmp_path: Path) -> None:
    from tether import Agent, tool
    from tether.testing import ScriptedModel, call

    started, may_finish = threading.Event(), threading.Event()

    @tool(effect="read_only")
    def slow(seconds: float) -> str:
        """Take a while.

        Args:
            seconds: at least this long.
        """
        started.set()
        time.sleep(seconds)
        may_finish.wait(60)  # and until the other process has tried its claim
        return "done"

    store = SQLiteStore(tmp_path / "runs.db")
    agent = Agent(
        ScriptedModel([call("slow", seconds=2.0), "Finished."]),
        name="slow",
        tools=[slow],
        store=store,
        lease_ttl=0.5,
        poll_interval=0.1,
    )
    result: dict[str, Any] = {}
    driver = threading.Thread(target=lambda: result.update(state=agent.run("go", id="r1")))
    driver.start()
    try:
        assert started.wait(30)
        time.sleep(1.0)  # twice the ttl: only renewals keep the lease now
        claim = subprocess.run(
            [sys.executable, "-c", CLAIMER, str(tmp_path / "runs.db"), "r1"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        may_finish.set()
        driver.join(60)
    assert claim.returncode == 0, claim.stderr
    assert claim.stdout.startswith("BUSY run r1 is driven by pid"), claim.stdout
    state = result["state"]
    assert state.status == "completed" and state.answer == "Finished."
    resumed = [e for e in state.history if isinstance(e, j.RunResumed)]
    assert len(resumed) == 1  # one drive from start to end: the lease was never lost
    assert store.holder("r1") is None
    store.close()


def test_a_schema_1_file_is_migrated_and_keeps_its_runs(tmp_path: Path) -> None:
    from tether.stores.sqlite.store import _MIGRATIONS

    path = tmp_path / "runs.db"
    conn = sqlite3.connect(path)
    for sql in _MIGRATIONS[0]:
        conn.execute(sql)
    conn.execute("PRAGMA user_version = 1")
    conn.execute(
        "INSERT INTO runs (id, agent, status, updated_at, root_id, parent_id) VALUES "
        "('root', 'a', 'waiting', '2025-01-01T00:00:00.000000Z', 'root', NULL), "
        "('kid', 'a', 'running', '2025-01-01T00:00:01.000000Z', 'root', 'root')"
    )
    conn.commit()
    conn.close()
    store = SQLiteStore(path)
    conn = store._conn()
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 3
    columns = [row[2] for row in conn.execute("PRAGMA index_info(runs_parent)")]
    assert columns == ["parent_id", "updated_at", "id"]
    assert [i.id for i in store.list(root_id="root")] == ["kid", "root"]
    store.close()
