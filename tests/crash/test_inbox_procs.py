"""The inbox under real concurrency: many processes posting while a holder drives, and cancels."""

from __future__ import annotations

import multiprocessing
import threading
from pathlib import Path
from typing import Any

import pytest
from _helpers import finished, out, spawn, starts, text, wait_for
from _scenario import post_items

from tether import Agent, FileStore, ToolContext, tool
from tether.testing import ScriptedModel, call

pytestmark = pytest.mark.crash

POSTERS = 8
EACH = 200


@pytest.mark.slow
def test_eight_processes_posting_while_the_holder_drives_journal_every_item_once_in_order(
    tmp_path: Path,
) -> None:
    runs, side = tmp_path / "runs", tmp_path / "side.jsonl"
    holder = spawn("start", runs, "busy", side, "inbox", TETHER_INBOX_TOTAL=str(POSTERS * EACH))
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(POSTERS)
    posters = [
        ctx.Process(target=post_items, args=(str(runs), "busy", p, EACH, barrier)) for p in range(POSTERS)
    ]
    try:
        wait_for(lambda: starts(side, tool="wait_tool"), what="the holder to run its first tool")
        for p in posters:
            p.start()
        for p in posters:
            p.join(60)
            assert p.exitcode == 0
        holder.wait(60)
    finally:
        for p in posters:
            if p.is_alive():
                p.kill()
        if holder.poll() is None:
            holder.kill()
    assert holder.returncode == 0, holder.stderr.read().decode()[-3000:]
    assert out(side)["answer"] == f"all {POSTERS * EACH} in"

    store = FileStore(runs)
    state = store.load("busy")
    assert state.status == "completed"
    consumed = [e for e in state.history if getattr(e, "inbox_seq", None) is not None]
    seqs = [e.inbox_seq for e in consumed]
    assert seqs == list(range(POSTERS * EACH)), "every item once, in inbox order"
    assert {e.kind for e in consumed} <= {"message", "inbox_skipped"}
    texts = [e.content[0]["text"] for e in consumed if e.kind == "message"]
    assert sorted(texts) == sorted(f"item {p}-{i}" for p in range(POSTERS) for i in range(EACH))
    inbox = store.read_inbox("busy")
    assert [i.inbox_seq for i in inbox] == list(range(POSTERS * EACH))
    assert [i.body["content"][0]["text"] for i in inbox] == texts, "journaled in the inbox's order"
    for p in range(POSTERS):  # each poster's items keep its order
        mine = [int(t.rsplit("-", 1)[1]) for t in texts if t.startswith(f"item {p}-")]
        assert mine == list(range(EACH))
    assert store.holder("busy") is None


def test_a_cancel_posted_while_a_tool_runs_stops_the_run_without_waiting_for_the_tool(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    store = FileStore(runs)
    started = threading.Event()
    let_go = threading.Event()
    returned: list[str] = []

    @tool
    def block(ctx: ToolContext) -> str:
        """Blocks until the test lets it go."""
        started.set()
        let_go.wait(30)
        returned.append(ctx.call_id)
        return "late result"

    @tool(approval=True)
    def needs_ok() -> str:
        """Needs a person's approval."""
        return "approved"

    cancelled: list[Any] = []

    def canceller() -> None:
        started.wait(30)
        cancelled.append(FileStore(runs).cancel("stop-me", by="ops"))

    thread = threading.Thread(target=canceller)
    thread.start()
    model = ScriptedModel([[call("block"), call("needs_ok")], "never asked"])
    state = Agent(model, tools=[block, needs_ok], store=store, poll_interval=0.05).run("go", id="stop-me")
    tool_still_running = not let_go.is_set() and not returned
    let_go.set()
    thread.join(30)
    assert tool_still_running, "the run stopped while the tool still ran: it did not wait for the tool"
    (seen,) = cancelled  # None: left to the holder; a State: the holder journaled it and let go meanwhile
    assert seen is None or (seen.status == "cancelled" and len(seen.history) == len(state.history))
    assert len([e for e in state.history if e.kind == "cancel_requested"]) == 1
    assert state.status == "cancelled" and "ops" in (state.reason or "")
    results = finished(state)
    assert [e.outcome for e in results["c3_0"]] == ["aborted"], "the running call is aborted"
    assert [e.outcome for e in results["c3_1"]] == ["cancelled"], "the call never invoked is cancelled"
    kinds = [e.kind for e in state.history]
    assert kinds[-4:] == ["cancel_requested", "tool_finished", "tool_finished", "run_stopped"]
    assert len(model.requests) == 1
    wait_for(lambda: returned, what="the blocked tool to return")
    assert [e.kind for e in store.load("stop-me").history] == kinds, "the late result is dropped"
    assert "may or may not" in text(results["c3_0"][0])


def test_a_cancel_from_another_process_stops_a_held_run(tmp_path: Path) -> None:
    runs, side = tmp_path / "runs", tmp_path / "side.jsonl"
    holder = spawn("start", runs, "held", side, "hold")
    try:
        wait_for(lambda: starts(side, tool="hold"), what="the hold tool to start")
        seen = FileStore(runs).cancel("held", by="ops")
        # None: the holder will journal it; a State: the holder journaled it and let go within the take's retry
        assert seen is None or seen.status == "cancelled"
        holder.wait(30)
    finally:
        Path(str(side) + ".release").touch()
        if holder.poll() is None:
            holder.wait(30)
    assert holder.returncode == 0, holder.stderr.read().decode()[-3000:]
    report = out(side)
    assert report["status"] == "cancelled"
    state = FileStore(runs).load("held")
    assert [e.outcome for e in finished(state)["c3_0"]] == ["aborted"]
    assert state.history[-1].kind == "run_stopped"
    resumed = spawn("resume", runs, "held", side, "hold")
    resumed.wait(30)
    assert resumed.returncode == 0
    assert out(side)["status"] == "cancelled" and out(side)["requests"] == []
    assert len(starts(side, tool="hold")) == 1
