"""Crash tests for subagents: SIGKILL a real process while a child run works, resume the PARENT in a new
process (DESIGN 10, DURABILITY 6). "Ran once" is judged from the side file the child's tools write."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from _helpers import env_with, finished, killed, kinds, text

from tether import FileStore
from tether.testing import ExecutionLog

pytestmark = pytest.mark.crash

SCRIPT = str(Path(__file__).with_name("_subagent_scenario.py"))


def child_of(parent_id: str, call_id: str) -> str:
    return parent_id[:64] + "-" + hashlib.sha256(f"{parent_id}\x00{call_id}".encode()).hexdigest()[:24]


def run(
    mode: str, runs: Path, run_id: str, side: Path, scenario: str, **env: str
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, SCRIPT, mode, str(runs), run_id, str(side), scenario],
        env=env_with(**env),
        capture_output=True,
        timeout=60,
        check=False,
    )


def ok(proc: subprocess.CompletedProcess[bytes]) -> None:
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stderr.decode(errors='replace')[-3000:]}"


def out(side: Path) -> dict[str, Any]:
    return orjson.loads(Path(str(side) + ".out.json").read_bytes())


def starts(side: Path, **match: Any) -> list[dict[str, Any]]:
    return [
        r
        for r in ExecutionLog(side).records()
        if r.get("event") == "start" and all(r.get(k) == v for k, v in match.items())
    ]


@pytest.fixture
def where(tmp_path: Path) -> tuple[Path, Path]:
    return tmp_path / "runs", tmp_path / "side.jsonl"


def test_kill_inside_a_child_tool_then_resume_the_parent(where: tuple[Path, Path]) -> None:
    runs, side = where
    child_id = child_of("p1", "c3_0")
    first = run("start", runs, "p1", side, "kill_in_child_tool")
    assert killed(first), first.stderr.decode(errors="replace")[-3000:]
    # the child's first tool finished durably; its second was cut off inside its first attempt
    assert [(r["tool"], r["run_id"], r["attempt"]) for r in starts(side)] == [
        ("step", child_id, 1),
        ("boom", child_id, 1),
    ]
    store = FileStore(runs)
    assert store.load("p1").status == "running" and store.load(child_id).status == "running"
    assert [e.outcome for e in finished(store.load(child_id))["c3_0"]] == ["done"]

    second = run("resume", runs, "p1", side, "kill_in_child_tool")
    ok(second)
    report = out(side)
    assert report["status"] == "completed"
    assert report["answer"] == "parent: done:child: done:boom survived on attempt 2"
    # the child continued from its own journal: one request, the one after boom's result
    assert [(r["index"], r["run_id"]) for r in report["child_requests"]] == [(2, child_id)]
    assert [r["index"] for r in report["parent_requests"]] == [1]

    # finished child tools never ran again; the cut-off idempotent one ran again with the same key
    assert len(starts(side, tool="step")) == 1
    booms = starts(side, tool="boom")
    assert [b["attempt"] for b in booms] == [1, 2]
    assert {b["key"] for b in booms} == {f"tether:{child_id}:c6_0"}
    assert booms[0]["pid"] != booms[1]["pid"] == report["pid"]

    # one child run, completed, each of its calls closed once
    assert [i.id for i in store.list(parent_id="p1")] == [child_id]
    kid = store.load(child_id)
    assert kid.status == "completed" and kid.parent_id == "p1" and kid.root_id == "p1"
    assert {cid: [e.outcome for e in es] for cid, es in finished(kid).items()} == {
        "c3_0": ["done"],
        "c6_0": ["done"],
    }
    parent = store.load("p1")
    assert parent.status == "completed"
    assert [(e.call_id, e.attempt) for e in parent.history if e.kind == "tool_started"] == [
        ("c3_0", 1),
        ("c3_0", 2),
    ], "the resumable call was re-entered"
    (result,) = finished(parent)["c3_0"]
    assert result.outcome == "done" and text(result) == kid.answer
    assert result.usage == kid.usage


def test_kill_after_the_child_completed_takes_its_answer_without_asking_it_again(
    where: tuple[Path, Path],
) -> None:
    runs, side = where
    child_id = child_of("p2", "c3_0")
    # the first run_stopped written is the child's (its final reply and run_stopped are one append)
    first = run("start", runs, "p2", side, "plain", TETHER_FAILPOINT="after_append:run_stopped")
    assert killed(first), first.stderr.decode(errors="replace")[-3000:]
    store = FileStore(runs)
    assert store.load(child_id).status == "completed"
    assert "tool_finished" not in kinds(store.load("p2"))

    ok(run("resume", runs, "p2", side, "plain"))
    report = out(side)
    assert report["status"] == "completed" and report["answer"] == "parent: done:child: done:step 1 done"
    assert report["child_requests"] == [], "a stopped child is not resumed: its answer is taken"
    assert len(starts(side, tool="step")) == 1
    assert [i.id for i in store.list(parent_id="p2")] == [child_id]
    assert kinds(store.load(child_id))[-1] == "run_stopped"


def test_kill_before_the_child_was_created_creates_it_on_resume(where: tuple[Path, Path]) -> None:
    runs, side = where
    child_id = child_of("p3", "c3_0")
    # the parent's first append with tool_started is the subagent call's start, before the child exists
    first = run("start", runs, "p3", side, "plain", TETHER_FAILPOINT="after_append:tool_started")
    assert killed(first), first.stderr.decode(errors="replace")[-3000:]
    store = FileStore(runs)
    assert not store.exists(child_id)

    ok(run("resume", runs, "p3", side, "plain"))
    assert out(side)["answer"] == "parent: done:child: done:step 1 done"
    assert [i.id for i in store.list(parent_id="p3")] == [child_id]
    assert len(starts(side, tool="step")) == 1


def test_a_child_waiting_for_approval_is_approved_from_another_process(where: tuple[Path, Path]) -> None:
    runs, side = where
    child_id = child_of("p4", "c3_0")
    ok(run("start", runs, "p4", side, "child_approval"))
    report = out(side)
    assert report["status"] == "waiting"
    assert report["pending"] == [{"call_id": "c6_0", "run_id": child_id, "tool": "send"}]
    store = FileStore(runs)
    parent = store.load("p4")
    assert parent.status == "waiting" and "child_waiting" in kinds(parent)
    (pending,) = parent.pending_approvals
    assert (pending.call_id, pending.run_id) == ("c6_0", child_id)
    assert store.load(child_id).status == "waiting"
    assert starts(side, tool="send") == []

    refused = run("resume_child", runs, child_id, side, "child_approval")
    assert refused.returncode == 3
    assert out(side)["message"] == f"run {child_id} is a subagent of p4. Fix: resume p4"

    lengths = len(store.read("p4")), len(store.read(child_id))
    ok(run("approve", runs, "p4", side, "child_approval"))
    assert out(side)["approved"] == [{"call_id": "c6_0", "run_id": child_id}]
    # the approver posts to the child's inbox and drives nothing
    assert (len(store.read("p4")), len(store.read(child_id))) == lengths
    assert store.inbox_length(child_id) == 1
    assert store.load("p4").status == "waiting"

    ok(run("resume", runs, "p4", side, "child_approval"))
    report = out(side)
    assert report["status"] == "completed"
    assert report["answer"] == "parent: done:child: done:sent to ann"
    assert [(r["run_id"], r["call_id"]) for r in starts(side, tool="send")] == [(child_id, "c6_0")]
    assert len(starts(side, tool="step")) == 1
    kid = store.load(child_id)
    assert kid.status == "completed"
    (decided,) = [e for e in kid.history if e.kind == "approval_decided"]
    assert decided.approved and decided.by == "alice" and decided.inbox_seq == 0
    assert store.load("p4").status == "completed"
    assert [i.id for i in store.list(parent_id="p4")] == [child_id]
