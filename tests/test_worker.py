"""Worker: claims runs that need work and drives them, on SQLite and PostgreSQL (DESIGN 11)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).with_name("crash")))

from _chaos_agents import fresh_schema, libpq, make_agent, open_test_store

from tether import Agent, tool
from tether import journal as j
from tether.stores.base import Owner, Store
from tether.testing import ExecutionLog, ScriptedModel, call
from tether.worker import Worker

SCRIPT = str(Path(__file__).with_name("crash") / "_chaos_agents.py")


@pytest.fixture(scope="module")
def pg_dsn() -> Iterator[str]:
    with fresh_schema("tether_test_worker") as dsn:
        yield dsn


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A store URL for each test: a SQLite file, and a PostgreSQL schema emptied for the test."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'runs.db'}"
        return
    dsn = request.getfixturevalue("pg_dsn")
    store = open_test_store(dsn)
    store.migrate()  # type: ignore[attr-defined]
    store.close()
    import psycopg

    with psycopg.connect(libpq(dsn), autocommit=True) as conn:
        conn.execute("TRUNCATE runs, entries, inbox")
    yield dsn


def _adder(store: Store, log: ExecutionLog, name: str = "adder") -> Agent:
    @tool(effect="idempotent")
    def add(a: int, b: int) -> int:
        """Add two numbers.

        Args:
            a: one.
            b: the other.
        """
        log.record(tool="add", a=a, b=b)
        time.sleep(0.02)
        return a + b

    return Agent(
        ScriptedModel([call("add", a=1, b=2), "The sum is 3."]),
        name=name,
        tools=[add],
        store=store,
        poll_interval=0.1,
    )


def test_a_worker_drives_20_submitted_runs_to_completion(
    url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = open_test_store(url)
    log = ExecutionLog(tmp_path / "exec.jsonl")
    agent = _adder(store, log)
    other = _adder(store, log, name="other")  # runs of an agent the worker lacks are left alone
    ids = [agent.submit(f"add {i}").id for i in range(20)]
    stranger = other.submit("not mine").id
    assert all(store.holder(run_id) is None for run_id in ids)
    worker = Worker([agent], store, concurrency=4, poll_interval=0.2)
    with caplog.at_level(logging.INFO, logger="tether.worker"):
        worker.run(stop_when_idle=True)
    for run_id in ids:
        state = store.load(run_id)
        assert (state.status, state.answer) == ("completed", "The sum is 3."), run_id
        assert store.holder(run_id) is None
    assert worker.claimed == 20 and worker.lost == 0
    assert log.count(tool="add") == 20  # one execution per run
    assert store.load(stranger).status == "running" and len(store.read(stranger)) == 2
    claims = [r for r in caplog.records if "claimed run" in r.getMessage()]
    stops = [r for r in caplog.records if "stopped run" in r.getMessage() and "completed" in r.getMessage()]
    assert len(claims) == 20 and len(stops) == 20
    store.close()


def test_a_postgres_worker_fills_its_free_slots_with_one_batch_claim(pg_dsn: str, tmp_path: Path) -> None:
    import psycopg

    store = open_test_store(pg_dsn)
    store.migrate()  # type: ignore[attr-defined]
    with psycopg.connect(libpq(pg_dsn), autocommit=True) as conn:
        conn.execute("TRUNCATE runs, entries, inbox")
    agent = _adder(store, ExecutionLog(tmp_path / "exec.jsonl"))
    ids = [agent.submit(f"add {i}").id for i in range(10)]
    batches: list[int] = []
    real_batch = store.aclaim_next_batch  # type: ignore[attr-defined]

    async def batch(owners: Any, *args: Any, **kwargs: Any) -> Any:
        batches.append(len(owners))
        return await real_batch(owners, *args, **kwargs)

    async def single(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a worker on PostgresStore claims in batches")

    store.aclaim_next_batch = batch  # type: ignore[attr-defined]
    store.aclaim_next = single  # type: ignore[method-assign]
    worker = Worker([agent], store, concurrency=4, poll_interval=0.2)
    worker.run(stop_when_idle=True)
    assert all(store.load(run_id).status == "completed" for run_id in ids) and worker.claimed == 10
    assert batches[0] == 4  # the four free slots at the start: one statement
    store.close()


def test_a_worker_with_two_agents_matches_runs_by_name(url: str, tmp_path: Path) -> None:
    store = open_test_store(url)
    log = ExecutionLog(tmp_path / "exec.jsonl")
    first, second = _adder(store, log, "first"), _adder(store, log, "second")
    ids = [first.submit("a").id, second.submit("b").id, first.submit("c").id]
    Worker([first, second], store, concurrency=2, poll_interval=0.2).run(stop_when_idle=True)
    assert [store.load(run_id).status for run_id in ids] == ["completed"] * 3
    assert [store.load(run_id).agent for run_id in ids] == ["first", "second", "first"]
    store.close()


def _info(run_id: str, **fields: Any) -> dict[str, Any]:
    return {
        "agent": "adder", "status": "running", "turn": 0, "created_at": j.now_iso(), "updated_at": j.now_iso(),
        "first_message": "hi", "parent_id": None, "root_id": run_id, "inbox_consumed": -1, **fields,
    }  # fmt: skip


def test_a_worker_never_claims_a_child_run(
    url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = open_test_store(url)
    agent = _adder(store, ExecutionLog(tmp_path / "exec.jsonl"))
    writer = j.new_writer_id()
    at = j.now_iso()
    root = j.seal([j.RunStarted(seq=0, at=at, agent="adder", root_id="root")], writer, run_id="root")
    store.create("root", root, _info("root", status="completed"))
    child = j.seal(
        [
            j.RunStarted(seq=0, at=at, agent="adder", parent_id="root", root_id="root"),
            j.MessageAdded(seq=1, at=at, content=[{"type": "text", "text": "sub task"}]),
        ],
        writer,
        run_id="child",
    )
    store.create("child", child, _info("child", parent_id="root"))  # running, no holder: but a child
    worker = Worker([agent], store, concurrency=2, poll_interval=0.1)
    with caplog.at_level(logging.INFO, logger="tether.worker"):
        worker.run(stop_when_idle=True)
    assert worker.claimed == 0
    assert store.length("child") == 2 and store.holder("child") is None
    assert not [r for r in caplog.records if "claimed run child" in r.getMessage()]
    assert store.claim_next(Owner.here()) is None  # the store never offers it either
    store.close()


def test_stop_from_another_thread_ends_an_idle_worker(url: str, tmp_path: Path) -> None:
    store = open_test_store(url)
    worker = Worker([_adder(store, ExecutionLog(tmp_path / "x"))], store, poll_interval=30)
    thread = threading.Thread(target=worker.run)
    thread.start()
    time.sleep(0.3)
    worker.stop()
    thread.join(10)
    assert not thread.is_alive()
    store.close()


def test_bad_settings_are_refused(tmp_path: Path) -> None:
    from tether import FileStore

    store = open_test_store(f"sqlite:///{tmp_path / 'runs.db'}")
    agent = _adder(store, ExecutionLog(tmp_path / "x"))
    with pytest.raises(ValueError, match="at least one agent"):
        Worker([], store)
    with pytest.raises(ValueError, match="two agents are named adder"):
        Worker([agent, agent], store)
    with pytest.raises(ValueError, match="concurrency"):
        Worker([agent], store, concurrency=0)
    with pytest.raises(ValueError, match="poll_interval"):
        Worker([agent], store, poll_interval=0)
    files = FileStore(tmp_path / "files")
    if not callable(getattr(files, "claim_next", None)):
        with pytest.raises(ValueError, match="claim_next"):
            Worker([agent], files)
    store.close()


def _spawn_worker(url: str, side: Path, kind: str, ttl: float = 5.0) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, SCRIPT, "worker", url, str(side), kind, str(ttl), "2"],
        stdout=subprocess.PIPE,
        stderr=open(f"{side}.stderr", "wb"),
        env={k: v for k, v in os.environ.items() if k != "TETHER_FAILPOINT"},
    )


def _wait_for(predicate: Any, timeout: float = 60, what: str = "a condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.slow
@pytest.mark.crash
def test_sigterm_mid_tool_exits_cleanly_and_leaves_the_run_released_and_resumable(
    url: str, tmp_path: Path
) -> None:
    side = tmp_path / "side.jsonl"
    store = open_test_store(url)
    agent = make_agent("hold", store, side)
    run_id = agent.submit("hold on").id
    proc = _spawn_worker(url, side, "hold")
    try:
        log = ExecutionLog(side)
        _wait_for(lambda: log.count(event="start") == 2, what="both hold tools to start")
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    stderr = Path(f"{side}.stderr").read_text()
    assert proc.returncode == 0, stderr[-3000:]
    assert b"WORKER EXIT" in out
    assert f"claimed run {run_id}" in stderr and f"released run {run_id} (worker stopping)" in stderr
    state = store.load(run_id)
    assert state.history[-1].kind == "run_released" and state.status == "running"
    finished = {e.call_id: e.outcome for e in state.history if e.kind == "tool_finished"}  # type: ignore[attr-defined]
    assert finished == {"c3_0": "aborted"}  # the unsafe call in flight; the idempotent one is left open
    assert [(c.call_id, c.action) for c in state.open_calls] == [("c3_1", "retry")]
    assert store.holder(run_id) is None
    Path(f"{side}.release").touch()
    Worker([agent], store, poll_interval=0.2).run(stop_when_idle=True)
    final = store.load(run_id)
    assert final.status == "completed"
    starts = [r for r in ExecutionLog(side).records() if r["event"] == "start"]
    assert sorted((r["call_id"], r["attempt"]) for r in starts) == [("c3_0", 1), ("c3_1", 1), ("c3_1", 2)]
    store.close()


@pytest.mark.slow
def test_a_worker_recovers_when_its_postgres_backends_are_killed_mid_run(pg_dsn: str, tmp_path: Path) -> None:
    import psycopg

    app = f"tether-worker-kill-{os.getpid()}"
    dsn = f"{pg_dsn}&application_name={app}"
    store = open_test_store(dsn, ttl=5.0)
    side = tmp_path / "side.jsonl"
    agent = make_agent("chaos", store, side)
    ids = [agent.submit(f"task {i}").id for i in range(12)]
    stop = threading.Event()
    kills: list[int] = []

    def kill_backends() -> None:
        with psycopg.connect(libpq(pg_dsn), autocommit=True) as conn:
            while not stop.wait(0.4):
                rows = conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
                    (app,),
                ).fetchall()
                kills.append(len(rows))

    def approve() -> None:
        while not stop.wait(0.2):
            for info in store.list(status="waiting"):
                state = store.load(info.id)
                for pending in state.pending_approvals:
                    state.approve(pending.call_id, by="test")
                if state.take_local_changes():
                    store.save(state)

    threads = [threading.Thread(target=kill_backends), threading.Thread(target=approve)]
    for thread in threads:
        thread.start()
    worker = Worker([agent], store, concurrency=4, poll_interval=0.2)
    runner = threading.Thread(target=worker.run)
    runner.start()
    try:
        _wait_for(lambda: all(store.load(r).status == "completed" for r in ids), 120, "every run to complete")
    finally:
        stop.set()
        worker.stop()
        runner.join(60)
        for thread in threads:
            thread.join(30)
    assert sum(kills) >= 3, kills
    records = ExecutionLog(side).records()
    starts = [(r["run_id"], r["call_id"]) for r in records if r["event"] == "start"]
    assert sorted(starts) == sorted(set(starts))  # nothing ran twice: every append was retried in place
    assert len(starts) == 12 * 4
    for run_id in ids:
        state = store.load(run_id)
        assert [e.outcome for e in state.history if e.kind == "tool_finished"] == ["done"] * 4  # type: ignore[attr-defined]
    store.close()


PAUSED_WORKER = """
import logging, os, sys, time
from tether import Agent, SQLiteStore, tool
from tether.testing import ScriptedModel, call
from tether.worker import Worker

path, marks, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s %(message)s")

class SlowToRenew(SQLiteStore):
    def renew(self, lease):
        if os.path.exists(os.path.join(marks, "slow")):
            time.sleep(3)  # a store slow to answer once the worker runs again: SIGTERM's stop comes first
        return super().renew(lease)

@tool(effect="idempotent")
def slow_step() -> str:
    '''A slow step.'''
    open(os.path.join(marks, f"started-{os.getpid()}"), "w").close()
    time.sleep(seconds)
    return "stepped"

store = SlowToRenew(path)
agent = Agent(ScriptedModel([call("slow_step"), "finished"]), name="pause", tools=[slow_step], store=store)
Worker([agent], store, lease_ttl=1.0, poll_interval=0.2).run(install_signal_handlers=True)
print("WORKER EXIT", flush=True)
"""


@pytest.mark.slow
def test_a_paused_worker_stopped_after_another_took_its_run_logs_the_lost_lease_not_a_release(
    tmp_path: Path,
) -> None:
    from tether import SQLiteStore

    @tool(effect="idempotent")
    def slow_step() -> str:
        """A slow step."""
        return "stepped"

    path, marks = tmp_path / "runs.db", tmp_path / "marks"
    marks.mkdir()
    store = SQLiteStore(path)
    agent = Agent(
        ScriptedModel([call("slow_step"), "finished"]), name="pause", tools=[slow_step], store=store
    )
    run_id = agent.submit("step slowly").id
    stderr = tmp_path / "a.log"
    with stderr.open("wb") as err:
        worker = subprocess.Popen(
            [sys.executable, "-c", PAUSED_WORKER, str(path), str(marks), "60"],
            stdout=subprocess.PIPE,
            stderr=err,
        )
    try:
        _wait_for(lambda: (marks / f"started-{worker.pid}").exists(), what="worker A to start its step")
        worker.send_signal(signal.SIGSTOP)
        _wait_for(lambda: store.holder(run_id) is None, what="A's lease to lapse")
        done = agent.resume(run_id)  # another process would do the same: take the run and finish it
        assert done.status == "completed"
        (marks / "slow").touch()
        worker.send_signal(signal.SIGTERM)  # stopped before A ran again (a deploy, a scale-down)
        worker.send_signal(signal.SIGCONT)
        out, _ = worker.communicate(timeout=60)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    log = stderr.read_text()
    assert worker.returncode == 0 and b"WORKER EXIT" in out, log[-3000:]
    assert f"released run {run_id}" not in log, log
    assert f"lost its lease on run {run_id}" in log, log
    assert store.load(run_id).status == "completed" and store.holder(run_id) is None
