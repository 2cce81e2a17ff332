"""The rules SQLiteStore and PostgresStore share as SQL stores (DESIGN 8.2; DURABILITY 2.2, 3, 4): ttl leases
judged by the store's clock, rows checked and changed by hand, and real processes and kills on one storage.

Each test runs on both: SQLite on a file in ``tmp_path``, PostgreSQL in one fresh schema for the module
(emptied before each test). The PostgreSQL cases skip without a server, and fail when
``TETHER_REQUIRE_POSTGRES=1``. What every store must keep is in the conformance suite
(``tether._harness.conformance``); what only one backend does is in ``test_sqlite.py`` / ``test_postgres.py``.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).with_name("crash")))

from _chaos_agents import fresh_schema, libpq

from _store_runs import _append, _batch, _first, _info, _make
from tether import journal as j
from tether import open_store
from tether.errors import CorruptJournalError, RunBusyError, RunNotFoundError
from tether.stores.base import Owner, Store

# --------------------------------------------------------------------------------------------------
# The two backends: a store on the storage, its URL, raw SQL on a connection of the test's own, its clock


class SQLiteBackend:
    name = "sqlite"
    clock_slack = 2.0
    """How far a lease's ``expires_at`` may be from ``clock() + ttl`` (the clock is this process's)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.url = f"sqlite:///{path}"

    def open(self, **kw: Any) -> Store:
        from tether.stores.sqlite import SQLiteStore

        return SQLiteStore(self.path, **kw)

    def sql(self, query: str, params: Any = ()) -> list[Any]:
        conn = sqlite3.connect(self.path, isolation_level=None, timeout=5)
        try:
            return conn.execute(query, params).fetchall()
        finally:
            conn.close()

    def clock(self) -> float:
        return time.time()


class PostgresBackend:
    name = "postgres"
    clock_slack = 5.0
    """How far a lease's ``expires_at`` may be from ``clock() + ttl`` (the clock is the server's)."""

    def __init__(self, dsn: str) -> None:
        self.url = dsn

    def open(self, **kw: Any) -> Store:
        from tether.stores.postgres import PostgresStore

        return PostgresStore(self.url, **kw)

    def sql(self, query: str, params: Any = ()) -> list[Any]:
        import psycopg

        with psycopg.connect(libpq(self.url), autocommit=True) as conn:
            cur = conn.execute(query.replace("?", "%s"), params)  # type: ignore[arg-type]
            return cur.fetchall() if cur.description else []

    def clock(self) -> float:
        return float(self.sql("SELECT extract(epoch FROM now())::float8")[0][0])


Backend = SQLiteBackend | PostgresBackend


@pytest.fixture(scope="module")
def postgres_dsn() -> Iterator[str]:
    """One fresh, migrated schema for the module (skipped without a server; failed when it is required)."""
    if os.environ.get("TETHER_REQUIRE_POSTGRES") != "1":
        pytest.importorskip("psycopg", reason="psycopg is not installed. Fix: pip install 'tether[postgres]'")
    from tether.stores.postgres import PostgresStore

    with fresh_schema("tether_test_sql") as made:
        store = PostgresStore(made)
        store.migrate()
        store.close()
        yield made


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    if request.param == "sqlite":
        return SQLiteBackend(tmp_path / "runs.db")
    made = PostgresBackend(request.getfixturevalue("postgres_dsn"))
    made.sql("TRUNCATE runs, entries, inbox")
    return made


@pytest.fixture
def db(backend: Backend) -> Iterator[Store]:
    store = backend.open()
    yield store
    store.close()


def _age(backend: Backend, run_id: str, seconds: float) -> None:
    at = (datetime.now(UTC) - timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    backend.sql("UPDATE runs SET updated_at = ? WHERE id = ?", (at, run_id))


# --------------------------------------------------------------------------------------------------
# Basics


def test_a_held_run_round_trips_through_append_read_list_and_load(backend: Backend, db: Store) -> None:
    writer, lease = _make(db, "r1", held=True)
    assert lease is not None and lease.token == 1 and lease.expires_at is not None
    assert lease.expires_at == pytest.approx(backend.clock() + db.ttl, abs=backend.clock_slack)  # type: ignore[operator]
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


def test_a_damaged_entry_row_is_corruption(backend: Backend, db: Store) -> None:
    _make(db, "r1")
    (body,) = backend.sql("SELECT body FROM entries WHERE run_id = 'r1' AND seq = 1")[0]
    backend.sql(
        "UPDATE entries SET body = ? WHERE run_id = 'r1' AND seq = 1", (bytes(body).replace(b"hi", b"ho"),)
    )
    with pytest.raises(CorruptJournalError, match="seq 1"):
        db.read("r1")
    with pytest.raises(CorruptJournalError, match="seq 1"):
        db.read("r1", after_seq=0)


# --------------------------------------------------------------------------------------------------
# Leases: a lease row whose owner died


def _dead_owner() -> Owner:
    proc = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    return Owner(j.new_writer_id(), int(proc.stdout), Owner.here().host, j.now_iso())


def test_a_dead_holder_on_this_host_does_not_block_a_claim(db: Store) -> None:
    dead = _dead_owner()
    db.create("r1", _first("r1", dead.writer), _info("r1"), owner=dead)
    db.create("r2", _first("r2", dead.writer), _info("r2"), owner=dead)
    assert db.holder("r1") is None
    assert {i.id: i.lease_owner for i in db.list()} == {"r1": None, "r2": None}
    assert db.claim("r1", Owner.here()).token == 2


def test_claim_next_takes_a_root_whose_holder_died_on_this_host(db: Store) -> None:
    dead = _dead_owner()
    db.create("r1", _first("r1", dead.writer), _info("r1"), owner=dead)
    db.create("r2", _first("r2", dead.writer), _info("r2"), owner=dead)
    assert db.claim("r1", Owner.here()).token == 2
    taken = db.claim_next(Owner.here())  # claim_next takes a dead process's root too
    assert taken is not None and (taken.run_id, taken.token) == ("r2", 2)


# --------------------------------------------------------------------------------------------------
# claim_next, prune and delete, on rows changed by hand


def test_claim_next_takes_the_oldest_root_needing_work(backend: Backend, db: Store) -> None:
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
        _age(backend, run_id, age)
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
    assert backend.sql("SELECT lease_token FROM runs WHERE id = 'child'") == [(0,)]
    db.post("child", {"type": "message"})
    db.abandon(second)
    backend.sql("UPDATE runs SET status = 'waiting' WHERE id = 'root'")
    again = db.claim_next(me)  # a waiting root whose child has unconsumed items
    assert again is not None and again.run_id == "root" and again.token == 2
    db.abandon(again)
    backend.sql("UPDATE runs SET inbox_consumed = inbox_len - 1 WHERE id = 'child'")
    assert db.claim_next(me) is None  # the child is consumed and still running, updated before the root
    backend.sql("UPDATE runs SET status = 'completed' WHERE id = 'child'")
    _age(backend, "child", 1)
    moved = db.claim_next(me)  # the child moved on after the root was updated
    assert moved is not None and moved.run_id == "root"
    assert backend.sql("SELECT lease_token FROM runs WHERE id = 'child'") == [(0,)]


def test_prune_rules_and_the_rows_it_removes(backend: Backend, db: Store) -> None:
    _make(db, "old-done", status="completed")
    _make(db, "old-failed", status="failed")
    _make(db, "old-running")
    _make(db, "new-done", status="completed")
    _make(db, "old-held", status="completed", held=True)
    _make(db, "old-posted", status="completed")
    _make(db, "old-cancel-posted", status="completed")
    _make(db, "tree", status="completed")
    _make(db, "tree-kid", status="cancelled", parent_id="tree", root_id="tree")
    _make(db, "kept", status="completed")
    _make(db, "kept-kid", status="waiting", parent_id="kept", root_id="kept")
    _make(db, "p2", status="running")
    _make(db, "p2-kid", status="completed", parent_id="p2", root_id="p2")
    for run_id in ("old-done", "old-failed", "old-running", "old-held", "old-posted", "old-cancel-posted", "tree",
                   "tree-kid", "kept", "kept-kid", "p2", "p2-kid"):  # fmt: skip
        _age(backend, run_id, 7200)
    db.post("old-posted", {"type": "message"})  # an unconsumed item may reopen it: kept
    db.post("old-cancel-posted", {"type": "cancel"})  # whatever the item is
    cutoff = datetime.now(UTC) - timedelta(hours=1)
    assert db.prune(cutoff, dry_run=True) == ["old-done", "old-failed"]  # trees only with children=True
    assert db.length("old-done") == 2 and db.length("old-failed") == 2
    assert db.prune(timedelta(hours=1), statuses=("failed",), dry_run=True) == ["old-failed"]
    assert db.prune(timedelta(hours=1), statuses=("completed",), children=True, dry_run=True) == [
        "old-done",
        "tree",
        "tree-kid",
    ]
    expected = ["old-done", "old-failed", "tree", "tree-kid"]
    assert db.prune(cutoff, children=True, dry_run=True) == expected
    assert db.prune(cutoff.isoformat(), children=True) == expected
    left = {info.id for info in db.list()}
    assert left == {"old-running", "new-done", "old-held", "old-posted", "old-cancel-posted", "kept", "kept-kid",
                    "p2", "p2-kid"}  # fmt: skip
    for gone in ("old-done", "tree-kid"):
        assert backend.sql("SELECT count(*) FROM entries WHERE run_id = ?", (gone,)) == [(0,)]
    for posted in ("old-posted", "old-cancel-posted"):
        assert backend.sql("SELECT count(*) FROM inbox WHERE run_id = ?", (posted,)) == [(1,)]
    assert db.prune(cutoff, children=True) == []
    with pytest.raises(ValueError, match="not stops"):
        db.prune(cutoff, statuses=("running",))


def test_delete_refuses_a_held_run_removes_every_row_and_takes_children_only_when_asked(
    backend: Backend, db: Store
) -> None:
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
        assert backend.sql(f"SELECT count(*) FROM {table}") == [(0,)]
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
# Processes on one storage (spawned; each opens the store from its URL)


def _append_for(url: str, run_id: str, seconds: float) -> int:
    store = open_store(url)
    writer, lease = _make(store, run_id, held=True)
    assert lease is not None
    seq = 2
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        count = 1 + seq % 3
        _append(store, run_id, lease, _batch(seq, count, writer, text=f"{run_id}-{seq}", run_id=run_id))
        seq += count
    assert store.release(lease, at_seq=seq, inbox_len=0)
    store.close()
    return seq


def _post_and_settle(url: str, worker: int, count: int) -> None:
    store = open_store(url)
    for i in range(count):
        text = [{"type": "text", "text": f"{worker}-{i}"}]
        store.post("r1", {"type": "message", "role": "user", "content": text}, item_id=f"{worker}-{i}")
        store.settle("r1")  # DURABILITY 2.1: try once more to take the run after posting
    store.close()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("backend", "appenders", "seconds", "at_once"),
    [
        # Each backend keeps the scenario its own test had: on SQLite (one writer at a time for the whole
        # file) appenders racing settling posters made 3 appends in 3 s on a loaded machine.
        pytest.param("sqlite", 4, 3.0, False, id="sqlite-posters-after-appenders"),
        pytest.param("postgres", 3, 2.0, True, id="postgres-posters-with-appenders"),
    ],
    indirect=["backend"],
)
def test_processes_that_append_and_posters_that_settle_lose_nothing(
    backend: Backend, db: Store, appenders: int, seconds: float, at_once: bool
) -> None:
    _make(db, "r1")
    ctx = multiprocessing.get_context("spawn")
    posters = [ctx.Process(target=_post_and_settle, args=(backend.url, w, 25)) for w in range(4)]
    if at_once:
        for proc in posters:
            proc.start()
    with ctx.Pool(appenders) as pool:
        lengths = pool.starmap(_append_for, [(backend.url, f"w{i}", seconds) for i in range(appenders)])
    if not at_once:
        for proc in posters:
            proc.start()
    for proc in posters:
        proc.join(120)
        assert proc.exitcode == 0
    for i, length in enumerate(lengths):
        run_id = f"w{i}"
        entries = db.read(run_id)
        assert len(entries) == length == db.length(run_id) > 10
        assert all(e.content[0]["text"].startswith(f"{run_id}-") for e in entries[2:])  # type: ignore[attr-defined]
        assert db.holder(run_id) is None
    state = db.load("r1")
    journaled = [
        e.inbox_seq for e in state.history if isinstance(e, j.MessageAdded) and e.inbox_seq is not None
    ]
    assert journaled == list(range(100))  # each item once, in inbox order, none left behind
    assert db.inbox_length("r1") == 100 and db.holder("r1") is None
    assert db.list(root_id="r1")[0].inbox_consumed == 99


AGENT_SCRIPT = textwrap.dedent(
    '''
    import os, sys
    from tether import Agent, open_store, tool
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
        store=open_store(sys.argv[1]),
    )
    state = agent.run("Charge 5", id="bill-1") if sys.argv[2] == "run" else agent.resume("bill-1")
    print("STATUS", state.status, state.answer)
    '''
)


def _script(
    tmp_path: Path, url: str, mode: str, failpoint: str | None = None
) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "biller.py"
    script.write_text(AGENT_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != "TETHER_FAILPOINT"}
    env["EXEC_LOG"] = str(tmp_path / "executions.log")
    if failpoint:
        env["TETHER_FAILPOINT"] = failpoint
    return subprocess.run(
        [sys.executable, str(script), url, mode], env=env, capture_output=True, text=True, timeout=60
    )


@pytest.mark.crash
@pytest.mark.parametrize("point", ["after_append", "torn_append", "before_append"])
def test_killed_at_an_append_then_resumed_runs_the_unsafe_tool_at_most_once(
    tmp_path: Path, backend: Backend, db: Store, point: str
) -> None:
    from tether.testing import ExecutionLog

    crashed = _script(tmp_path, backend.url, "run", f"{point}:tool_finished")
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    entries = db.read("bill-1")  # a torn append is all or nothing
    kinds = [e.kind for e in entries]
    assert kinds[-1] == ("tool_finished" if point == "after_append" else "tool_started")
    assert "run_stopped" not in kinds and db.length("bill-1") == len(entries)
    resumed = _script(tmp_path, backend.url, "resume")  # at once: the dead holder's lease does not block
    assert resumed.returncode == 0, resumed.stderr
    assert "STATUS completed Charged 5." in resumed.stdout
    assert ExecutionLog(tmp_path / "executions.log").count(tool="charge") == 1
    assert db.read("bill-1")[-1].kind == "run_stopped"
    state = db.load("bill-1")
    assert state.status == "completed"
    finished = [e for e in state.history if e.kind == "tool_finished"]
    assert [e.outcome for e in finished] == (["done"] if point == "after_append" else ["aborted"])  # type: ignore[attr-defined]  # unsafe: never re-run
