"""Crash tests: SIGKILL a real process at a journal boundary or inside a tool or model request, then resume
in a new process. "Ran once" is judged from the side file the tools write, never from the journal alone."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from _helpers import finished, killed, kinds, ok, out, run, snapshot, spawn, starts, text, wait_for

from tether import Agent, ConflictError, FileStore, RunBusyError
from tether.testing import ScriptedModel

pytestmark = pytest.mark.crash


@pytest.fixture
def where(tmp_path: Path) -> tuple[Path, Path]:
    return tmp_path / "runs", tmp_path / "side.jsonl"


def test_kill_after_a_durable_tool_finished_does_not_run_the_tool_again(where: tuple[Path, Path]) -> None:
    runs, side = where
    first = run("start", runs, "r1", side, "basic", TETHER_FAILPOINT="after_append:tool_finished")
    assert killed(first)
    state = FileStore(runs).load("r1")
    assert kinds(state)[-1] == "tool_finished" and state.status == "running"
    second = run("resume", runs, "r1", side, "basic")
    ok(second)
    report = out(side)
    assert report["status"] == "completed" and report["answer"] == "answer: done:5"
    assert [r["index"] for r in report["requests"]] == [1], "the resume asks only the next request"
    assert len(starts(side, call_id="c3_0")) == 1
    assert FileStore(runs).load("r1").status == "completed"


def test_kill_inside_an_unsafe_tool_closes_it_aborted_and_never_runs_it_again(
    where: tuple[Path, Path],
) -> None:
    runs, side = where
    assert killed(run("start", runs, "r2", side, "unsafe_kill"))
    assert len(starts(side, call_id="c3_0")) == 1
    ok(run("resume", runs, "r2", side, "unsafe_kill"))
    assert len(starts(side, call_id="c3_0")) == 1, "an unsafe call cut off by a crash never runs again"
    state = FileStore(runs).load("r2")
    (result,) = finished(state)["c3_0"]
    assert result.outcome == "aborted" and "may or may not have run" in text(result)
    report = out(side)
    assert report["status"] == "completed"
    last = report["requests"][-1]["messages"]
    assert last[-1]["role"] == "tool"
    (tool_result,) = last[-1]["content"]
    assert tool_result["call_id"] == "c3_0" and tool_result["outcome"] == "aborted"
    assert "may or may not have run" in tool_result["content"][0]["text"]
    assert report["answer"].startswith(
        "answer: aborted:unknown: the run stopped before this result was saved"
    )


def test_kill_inside_an_idempotent_tool_runs_it_again_with_the_same_key(where: tuple[Path, Path]) -> None:
    runs, side = where
    assert killed(run("start", runs, "r3", side, "idem_once"))
    ok(run("resume", runs, "r3", side, "idem_once"))
    execs = starts(side, call_id="c3_0")
    assert [e["attempt"] for e in execs] == [1, 2]
    assert {e["key"] for e in execs} == {"tether:r3:c3_0"}
    assert execs[0]["pid"] != execs[1]["pid"]
    assert out(side)["answer"] == "answer: done:synced on attempt 2"
    state = FileStore(runs).load("r3")
    assert [(e.attempt, e.idempotency_key) for e in state.history if e.kind == "tool_started"] == [
        (1, "tether:r3:c3_0"),
        (2, "tether:r3:c3_0"),
    ]


@pytest.mark.slow
def test_an_idempotent_tool_that_always_kills_gives_up_after_max_attempts(where: tuple[Path, Path]) -> None:
    runs, side = where
    assert killed(run("start", runs, "r4", side, "idem_always"))
    for _ in range(2):
        assert killed(run("resume", runs, "r4", side, "idem_always"))
    ok(run("resume", runs, "r4", side, "idem_always"))
    execs = starts(side, call_id="c3_0")
    assert [e["attempt"] for e in execs] == [1, 2, 3]
    assert {e["key"] for e in execs} == {"tether:r4:c3_0"}
    state = FileStore(runs).load("r4")
    (result,) = finished(state)["c3_0"]
    assert result.outcome == "aborted" and "gave up after 3 attempts" in text(result)
    assert state.status == "completed" and "gave up after 3 attempts" in (state.answer or "")


def test_kill_during_a_model_request_asks_again_with_the_same_index(where: tuple[Path, Path]) -> None:
    runs, side = where
    assert killed(run("start", runs, "r5", side, "model_kill"))
    marker = orjson.loads(Path(str(side) + ".model_marker").read_bytes())
    state = FileStore(runs).load("r5")
    assert state.requests == marker["index"] == 1, "nothing was written for the request cut off"
    ok(run("resume", runs, "r5", side, "model_kill"))
    report = out(side)
    assert [r["index"] for r in report["requests"]] == [marker["index"]]
    assert report["answer"] == "answer: done:3"
    assert len(starts(side, call_id="c3_0")) == 1


def test_parallel_calls_a_finished_result_is_never_run_again(where: tuple[Path, Path]) -> None:
    runs, side = where
    assert killed(run("start", runs, "r6", side, "parallel"))
    state = FileStore(runs).load("r6")
    assert [e.outcome for e in finished(state)["c3_0"]] == ["done"]
    assert "c3_1" not in finished(state), "the slow call was cut off"
    ok(run("resume", runs, "r6", side, "parallel"))
    assert len(starts(side, call_id="c3_0")) == 1, "the fast call finished and is never re-run"
    assert len(starts(side, call_id="c3_1")) == 1, "the slow call is unsafe: not re-run either"
    state = FileStore(runs).load("r6")
    assert [e.outcome for e in finished(state)["c3_0"]] == ["done"]
    assert [e.outcome for e in finished(state)["c3_1"]] == ["aborted"]
    assert out(side)["answer"].startswith("answer: done:fast done | aborted:unknown")


def test_resume_of_a_finished_run_writes_nothing_and_asks_nothing(where: tuple[Path, Path]) -> None:
    runs, side = where
    ok(run("start", runs, "r7", side, "basic"))
    first = out(side)
    before = snapshot(runs)
    journal = (runs / "r7.jsonl").read_bytes()
    ok(run("resume", runs, "r7", side, "basic"))
    again = out(side)
    assert again["status"] == "completed" and again["answer"] == first["answer"]
    assert again["history_len"] == first["history_len"]
    assert again["requests"] == []
    assert len(starts(side)) == 1
    assert (runs / "r7.jsonl").read_bytes() == journal
    assert {k: v for k, v in snapshot(runs).items() if not k.endswith(".lock")} == {
        k: v for k, v in before.items() if not k.endswith(".lock")
    }


def test_resume_of_a_run_held_by_a_live_process_names_its_pid(where: tuple[Path, Path]) -> None:
    runs, side = where
    holder = spawn("start", runs, "r8", side, "hold")
    try:
        wait_for(lambda: starts(side, tool="hold"), what="the hold tool to start")
        store = FileStore(runs)
        model = ScriptedModel(["never"])
        before = (runs / "r8.jsonl").read_bytes()
        with pytest.raises(RunBusyError) as info:
            Agent(model, name="crash", store=store).resume("r8")
        assert (
            f"pid {holder.pid}" in str(info.value)
            and "that process is alive" in str(info.value)
            and "Fix:" in str(info.value)
        )
        assert model.requests == []
        assert store.holder("r8").pid == holder.pid
        assert store.load("r8").status == "running", "looking at a held run is allowed"
        assert (runs / "r8.jsonl").read_bytes() == before
    finally:
        Path(str(side) + ".release").touch()
        holder.wait(30)
    assert holder.returncode == 0, holder.stderr.read().decode()
    assert out(side)["status"] == "completed"


def test_load_of_a_crashed_run_writes_nothing(where: tuple[Path, Path]) -> None:
    runs, side = where
    assert killed(run("start", runs, "r9", side, "basic", TETHER_FAILPOINT="after_append:tool_started"))
    before = snapshot(runs)
    state = FileStore(runs).load("r9")
    assert kinds(state)[-1] == "tool_started"
    assert [c.action for c in state.open_calls] == ["abort"], (
        "load says what a resume would do, and does nothing"
    )
    assert snapshot(runs) == before
    assert starts(side) == [], "killed after tool_started was durable, before the tool ran"


def test_driving_a_stale_state_is_a_conflict_and_leaves_the_journal_intact(where: tuple[Path, Path]) -> None:
    runs, side = where
    ok(run("start", runs, "r10", side, "chat"))
    store = FileStore(runs)
    stale = store.load("r10")
    ok(run("add_message", runs, "r10", side, "chat"))
    journal = (runs / "r10.jsonl").read_bytes()
    assert len(store.load("r10").history) == len(stale.history) + 1
    model = ScriptedModel(["first answer", "second answer"])
    agent = Agent(model, name="crash", instructions="crash tests", store=store)
    with pytest.raises(ConflictError) as info:
        agent.run(stale)
    assert "r10" in str(info.value) and "Fix:" in str(info.value)
    assert model.requests == []
    assert (runs / "r10.jsonl").read_bytes() == journal
    assert store.holder("r10") is None, "the refused driver let the run go"
    fresh = store.load("r10")
    assert fresh.messages[-1].text == "one more thing"


def test_an_existing_id_is_refused_before_any_model_request(where: tuple[Path, Path]) -> None:
    runs, side = where
    ok(run("start", runs, "r11", side, "chat"))
    journal = (runs / "r11.jsonl").read_bytes()
    model = ScriptedModel(["never"])
    with pytest.raises(ValueError, match="already exists"):
        Agent(model, name="crash", store=FileStore(runs)).run("again", id="r11")
    assert model.requests == []
    assert (runs / "r11.jsonl").read_bytes() == journal


def test_a_resume_after_a_crash_consumes_the_inbox_before_recovering(where: tuple[Path, Path]) -> None:
    runs, side = where
    assert killed(run("start", runs, "r12", side, "unsafe_kill"))
    store = FileStore(runs)
    item = {
        "type": "message",
        "role": "user",
        "content": [{"type": "text", "text": "status?"}],
        "seen_seq": 5,
    }
    assert store.post("r12", item) == 0
    length = len(store.read("r12"))
    ok(run("resume", runs, "r12", side, "unsafe_kill"))
    state = store.load("r12")
    assert kinds(state)[length : length + 3] == ["message", "run_resumed", "tool_finished"], "consume first"
    assert state.history[length].inbox_seq == 0
    roles = [(m["role"], m["content"][0].get("text")) for m in out(side)["requests"][0]["messages"]]
    assert [r for r, _ in roles] == ["user", "assistant", "tool", "user"], (
        "the message comes after the results"
    )
    assert roles[-1] == ("user", "status?")


def test_cancel_of_a_crashed_run_is_journaled_at_once_and_resume_leaves_it(where: tuple[Path, Path]) -> None:
    runs, side = where
    assert killed(run("start", runs, "r13", side, "unsafe_kill"))
    store = FileStore(runs)
    state = store.cancel("r13", by="ops")
    assert state is not None and state.status == "cancelled"
    assert [e.outcome for e in finished(state)["c3_0"]] == ["aborted"], "a started call is closed aborted"
    assert store.holder("r13") is None
    journal = (runs / "r13.jsonl").read_bytes()
    ok(run("resume", runs, "r13", side, "unsafe_kill"))
    assert out(side)["status"] == "cancelled" and out(side)["requests"] == []
    assert (runs / "r13.jsonl").read_bytes() == journal
    assert len(starts(side, call_id="c3_0")) == 1
