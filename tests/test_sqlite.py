"""SQLiteStore on real files: the append, inbox and lease rules (DURABILITY 2-4), with real processes."""

from __future__ import annotations

import gc
import multiprocessing
import os
import signal
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

from _store_runs import _append, _batch, _first, _info, _make
from tether import journal as j
from tether.errors import (
    CorruptJournalError,
    RunBusyError,
    RunNotFoundError,
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


def test_round_trip(db: SQLiteStore, tmp_path: Path) -> None:
    writer, lease = _make(db, "r1", held=True)
    assert lease is not None and lease.token == 1 and lease.expires_at is not None
    assert lease.expires_at == pytest.approx(time.time() + db.ttl, abs=2)  # type: ignore[operator]
    more = _batch(2, 3, writer)
    _append(db, "r1", lease, more, turn=3, status="waiting")
    read = db.read("r1")
    assert [e.seq for e in read] == [0, 1, 2, 3, 4]
    assert read[2:] == more
    assert [e.seq for e in db.read("r1", after_seq=2)] == [3, 4]
    assert db.read("r1", after_seq=4) == []
    assert db.length("r1") == 5 and db.inbox_length("r1") == 0
    assert db.identity == f"sqlite:///{(tmp_path / 'runs.db').resolve()}"
    assert SQLiteStore(tmp_path / "runs.db") == db
    (info,) = db.list()
    assert (info.id, info.status, info.turn, info.agent, info.length) == ("r1", "waiting", 3, "a", 5)
    assert info.lease_owner == f"{lease.owner.host}:{os.getpid()}"
    assert info.lease_expires_at == pytest.approx(lease.expires_at)
    state = db.load("r1")
    assert len(state.history) == 5 and state.store_identity == db.identity
    for missing in (db.read, db.length, db.inbox_length, db.read_inbox, db.holder, db.delete):
        with pytest.raises(RunNotFoundError):
            missing("nope")


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


def test_a_damaged_entry_is_corruption(db: SQLiteStore) -> None:
    _make(db, "r1")
    conn = db._conn()
    body = conn.execute("SELECT body FROM entries WHERE run_id = 'r1' AND seq = 1").fetchone()[0]
    conn.execute("UPDATE entries SET body = ? WHERE run_id = 'r1' AND seq = 1", (body.replace(b"hi", b"ho"),))
    with pytest.raises(CorruptJournalError, match="seq 1"):
        db.read("r1")
    with pytest.raises(CorruptJournalError, match="seq 1"):
        db.read("r1", after_seq=0)


# --------------------------------------------------------------------------------------------------
# Leases and the fence


def test_a_dead_holder_on_this_host_does_not_block_a_take(db: SQLiteStore) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    dead = Owner(j.new_writer_id(), int(proc.stdout), Owner.here().host, j.now_iso())
    db.create("r1", _first("r1", dead.writer), _info("r1"), owner=dead)
    assert db.holder("r1") is None
    assert db.list()[0].lease_owner is None
    assert db.claim("r1", Owner.here()).token == 2


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
# claim_next, prune, delete


def _age(store: SQLiteStore, run_id: str, seconds: float) -> None:
    at = (datetime.now(UTC) - timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    store._conn().execute("UPDATE runs SET updated_at = ? WHERE id = ?", (at, run_id))


def test_claim_next_takes_the_oldest_root_needing_work(db: SQLiteStore) -> None:
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
        _age(db, run_id, age)
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
    db.post("child", {"type": "message"})
    db.abandon(second)
    db._conn().execute("UPDATE runs SET status = 'waiting' WHERE id = 'root'")
    again = db.claim_next(me)  # a waiting root whose child has unconsumed items
    assert again is not None and again.run_id == "root" and again.token == 2


def test_claim_next_uses_the_partial_index(db: SQLiteStore) -> None:
    from tether.stores.sqlite.store import _NEXT

    plan = str(
        db._conn().execute(f"EXPLAIN QUERY PLAN {_NEXT} ORDER BY updated_at, id LIMIT 1", (1, 1)).fetchall()
    )
    assert "USING INDEX runs_work" in plan and "TEMP B-TREE" not in plan


def test_prune_rules(db: SQLiteStore) -> None:
    _make(db, "old-done", status="completed")
    _make(db, "old-failed", status="failed")
    _make(db, "old-running")
    _make(db, "new-done", status="completed")
    _make(db, "old-held", status="completed", held=True)
    _make(db, "tree", status="completed")
    _make(db, "tree-kid", status="cancelled", parent_id="tree", root_id="tree")
    _make(db, "kept", status="completed")
    _make(db, "kept-kid", status="waiting", parent_id="kept", root_id="kept")
    _make(db, "p2", status="running")
    _make(db, "p2-kid", status="completed", parent_id="p2", root_id="p2")
    for run_id in (
        "old-done",
        "old-failed",
        "old-running",
        "old-held",
        "tree",
        "tree-kid",
        "kept",
        "kept-kid",
        "p2",
        "p2-kid",
    ):
        _age(db, run_id, 7200)
    db.post("old-done", {"type": "cancel"})  # an unconsumed item may reopen it: kept
    cutoff = datetime.now(UTC) - timedelta(hours=1)
    assert db.prune(cutoff, dry_run=True) == ["old-failed"]  # trees need children=True
    expected = ["old-failed", "tree", "tree-kid"]
    assert db.prune(cutoff, children=True, dry_run=True) == expected
    assert db.length("old-failed") == 2
    assert db.prune(timedelta(hours=1), statuses=("completed",), children=True, dry_run=True) == [
        "tree",
        "tree-kid",
    ]
    assert db.prune(cutoff.isoformat(), children=True) == expected
    left = {info.id for info in db.list()}
    assert left == {"old-done", "old-running", "new-done", "old-held", "kept", "kept-kid", "p2", "p2-kid"}
    conn = db._conn()
    assert conn.execute("SELECT COUNT(*) FROM entries WHERE run_id = 'tree-kid'").fetchone()[0] == 0
    assert conn.execute("SELECT COUNT(*) FROM inbox WHERE run_id = 'old-done'").fetchone()[0] == 1
    assert db.prune(cutoff, children=True) == []
    with pytest.raises(ValueError, match="not stops"):
        db.prune(cutoff, statuses=("running",))


def test_delete_refuses_a_held_run(db: SQLiteStore) -> None:
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
    conn = db._conn()
    for table in ("entries", "inbox", "runs"):
        assert conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0] == 0
    _make(db, "r1")  # the id is free again
    assert db.inbox_length("r1") == 0


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


def _append_for(path: str, run_id: str, seconds: float) -> int:
    store = SQLiteStore(path)
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


@pytest.mark.slow
def test_four_processes_append_to_one_file(db: SQLiteStore) -> None:
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(4) as pool:
        lengths = pool.starmap(_append_for, [(str(db.path), f"w{i}", 3.0) for i in range(4)])
    for i, length in enumerate(lengths):
        run_id = f"w{i}"
        entries = db.read(run_id)
        assert len(entries) == length == db.length(run_id) > 10
        assert all(e.content[0]["text"].startswith(f"{run_id}-") for e in entries[2:])  # type: ignore[attr-defined]
        assert db.holder(run_id) is None


def _post_and_settle(path: str, worker: int, count: int) -> None:
    store = SQLiteStore(path)
    for i in range(count):
        text = [{"type": "text", "text": f"{worker}-{i}"}]
        store.post("r1", {"type": "message", "role": "user", "content": text}, item_id=f"{worker}-{i}")
        store.settle("r1")  # DURABILITY 2.1: try once more to take the run after posting
    store.close()


@pytest.mark.slow
def test_posters_that_settle_leave_no_item_unjournaled(db: SQLiteStore) -> None:
    _make(db, "r1")
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_post_and_settle, args=(str(db.path), w, 25)) for w in range(4)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(120)
        assert proc.exitcode == 0
    state = db.load("r1")
    journaled = [
        e.inbox_seq for e in state.history if isinstance(e, j.MessageAdded) and e.inbox_seq is not None
    ]
    assert journaled == list(range(100))  # each item once, in inbox order, none left behind
    assert db.inbox_length("r1") == 100 and db.holder("r1") is None
    assert db.list()[0].inbox_consumed == 99


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


AGENT_SCRIPT = textwrap.dedent(
    '''
    import os, sys
    from tether import Agent, tool
    from tether.stores.sqlite import SQLiteStore
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
        store=SQLiteStore(sys.argv[1]),
    )
    state = agent.run("Charge 5", id="bill-1") if sys.argv[2] == "run" else agent.resume("bill-1")
    print("STATUS", state.status, state.answer)
    '''
)


def _script(tmp_path: Path, mode: str, failpoint: str | None = None) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "biller.py"
    script.write_text(AGENT_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != "TETHER_FAILPOINT"}
    env["EXEC_LOG"] = str(tmp_path / "executions.log")
    if failpoint:
        env["TETHER_FAILPOINT"] = failpoint
    return subprocess.run(
        [sys.executable, str(script), str(tmp_path / "runs.db"), mode],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


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


@pytest.mark.crash
def test_killed_after_a_tool_result_then_resumed_runs_the_tool_once(tmp_path: Path) -> None:
    crashed = _script(tmp_path, "run", "after_append:tool_finished")
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    store = SQLiteStore(tmp_path / "runs.db")
    kinds = [e.kind for e in store.read("bill-1")]
    assert kinds[-1] == "tool_finished" and "run_stopped" not in kinds
    resumed = _script(tmp_path, "resume")  # at once: the dead holder's lease does not block
    assert resumed.returncode == 0, resumed.stderr
    assert "STATUS completed Charged 5." in resumed.stdout
    from tether.testing import ExecutionLog

    assert ExecutionLog(tmp_path / "executions.log").count(tool="charge") == 1
    assert store.read("bill-1")[-1].kind == "run_stopped"
    store.close()


@pytest.mark.crash
def test_a_torn_append_is_all_or_nothing(tmp_path: Path) -> None:
    crashed = _script(tmp_path, "run", "torn_append:tool_finished")
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    store = SQLiteStore(tmp_path / "runs.db")
    entries = store.read("bill-1")
    assert entries[-1].kind == "tool_started" and store.length("bill-1") == len(entries)
    resumed = _script(tmp_path, "resume")
    assert resumed.returncode == 0, resumed.stderr
    state = store.load("bill-1")
    assert state.status == "completed"
    finished = [e for e in state.history if e.kind == "tool_finished"]
    assert [e.outcome for e in finished] == ["aborted"]  # type: ignore[attr-defined]  # unsafe: never re-run
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
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 2
    columns = [row[2] for row in conn.execute("PRAGMA index_info(runs_parent)")]
    assert columns == ["parent_id", "updated_at", "id"]
    assert [i.id for i in store.list(root_id="root")] == ["kid", "root"]
    store.close()
