"""Tests for tether.agent and the driver, in one process: the per-reply order, model errors, the status
table and recovery of DESIGN 7, continuing runs. Real processes and crashes are in tests/crash/."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

import tether
from tether import Agent, Message, ModelError, State, ToolContext, tool
from tether.permissions import ask, deny
from tether.testing import ScriptedModel, call


class Crash(BaseException):
    """Stands in for a process dying inside a model request: no Exception handler sees it, no stop is written."""


def kinds(state: State) -> list[str]:
    return [e.kind for e in state.history]


def of_kind(state: State, kind: str) -> list[Any]:
    return [e for e in state.history if e.kind == kind]


def text(entry: Any) -> str:
    return "".join(b.get("text", "") for b in entry.content if b.get("type") == "text")


def finished(state: State) -> dict[str, Any]:
    return {e.call_id: e for e in of_kind(state, "tool_finished")}


def last_tool_text(request: Any) -> str:
    """The text of the last tool result the model was shown."""
    for message in reversed(list(request.messages)):
        if message.role == "tool":
            return text_of_result(message.content[-1])
    raise AssertionError("no tool result in the request")


def text_of_result(result: dict[str, Any]) -> str:
    return "".join(b.get("text", "") for b in result["content"] if b.get("type") == "text")


def make_add(log: list[Any]) -> Any:
    @tool
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        log.append((a, b))
        return a + b

    return add


# --------------------------------------------------------------------------------------------------
# A run and the per-reply order (DESIGN 5.2)


def test_a_run_journals_each_step_and_answers(store: Any) -> None:
    ran: list[Any] = []
    model = ScriptedModel([call("add", a=2, b=3), lambda req: f"the sum is {last_tool_text(req)}"])
    state = Agent(model, tools=[make_add(ran)], store=store).run("add 2 and 3", id="sum")
    assert state.status == "completed" and state.answer == "the sum is 5"
    assert ran == [(2, 3)]
    assert kinds(state) == [
        "run_started",
        "message",
        "run_resumed",
        "model_replied",
        "tool_started",
        "tool_finished",
        "model_replied",
        "run_stopped",
    ]
    (started,) = of_kind(state, "tool_started")
    assert started.call_id == "c3_0" and started.idempotency_key == "tether:sum:c3_0" and started.attempt == 1
    assert [r.index for r in model.requests] == [0, 1]
    loaded = store.load("sum")
    assert [e.h for e in loaded.history] == [e.h for e in state.history]
    assert (loaded.status, loaded.answer, loaded.turn) == ("completed", "the sum is 5", 2)


def test_unknown_tools_and_invalid_arguments_are_input_errors_and_never_run(store: Any) -> None:
    ran: list[Any] = []
    model = ScriptedModel([[call("nope", x=1), call("add", a="x", b=1), call("add", a=1, b=2)], "done"])
    state = Agent(model, tools=[make_add(ran)], store=store).run("go")
    assert ran == [(1, 2)]
    results = finished(state)
    assert results["c3_0"].outcome == "input_error" and "tool nope is not in this agent" in text(
        results["c3_0"]
    )
    assert results["c3_1"].outcome == "input_error" and "Fix:" in text(results["c3_1"])
    assert results["c3_2"].outcome == "done"
    assert [e.call_id for e in of_kind(state, "tool_started")] == ["c3_2"], "input errors are never started"
    reply_append = state.history[3:7]
    assert [(e.kind, e.b) for e in reply_append] == [
        ("model_replied", 3),
        ("tool_finished", 2),
        ("tool_finished", 1),
        ("tool_started", 0),
    ], "the reply, its input errors and the tool_started of the call to run are one append"
    tool_message = model.requests[1].messages[-1]
    assert [r["outcome"] for r in tool_message.content] == ["input_error", "input_error", "done"]


def test_deny_and_ask_rules_come_before_starting(store: Any) -> None:
    ran: list[Any] = []

    @tool
    def wipe() -> str:
        """Wipe everything."""
        ran.append("wipe")
        return "wiped"

    @tool
    def send(to: str) -> str:
        """Send."""
        ran.append("send")
        return "sent"

    model = ScriptedModel([[call("wipe"), call("send", to="x"), call("add", a=1, b=1)], "done"])
    agent = Agent(
        model,
        tools=[wipe, send, make_add(ran)],
        store=store,
        permissions=[deny("wipe", reason="never"), ask("send")],
    )
    state = agent.run("go")
    assert ran == [(1, 1)]
    results = finished(state)
    assert results["c3_0"].outcome == "denied" and "never" in text(results["c3_0"])
    (pending,) = state.pending_approvals
    assert (pending.call_id, pending.tool, pending.args) == ("c3_1", "send", {"to": "x"})
    assert state.status == "waiting"
    assert kinds(state)[-1] == "run_released"
    assert len(model.requests) == 1, "the model is asked again only when every call has a result"


def test_parallel_sync_calls_run_concurrently(store: Any) -> None:
    barrier = threading.Barrier(2, timeout=5)

    @tool(effect="read_only")
    def left() -> str:
        """Left."""
        barrier.wait()  # only passes when the other call runs at the same time
        return "L"

    @tool(effect="read_only")
    def right() -> str:
        """Right."""
        barrier.wait()
        return "R"

    state = Agent(
        ScriptedModel([[call("left"), call("right")], "done"]), tools=[left, right], store=store
    ).run("go")
    results = finished(state)
    assert {cid: (r.outcome, text(r)) for cid, r in results.items()} == {
        "c3_0": ("done", "L"),
        "c3_1": ("done", "R"),
    }


def test_a_sync_tool_runs_only_once_its_tool_started_is_in_the_store(store: Any) -> None:
    seen: list[list[str]] = []

    @tool(effect="unsafe")
    def act(ctx: ToolContext) -> str:
        """Act once."""
        stored = store.read(ctx.run_id)  # what the store holds, not what the driver has queued
        seen.append([e.kind for e in stored if getattr(e, "call_id", None) == ctx.call_id])
        return "acted"

    state = Agent(ScriptedModel([call("act"), call("act"), "done"]), tools=[act], store=store).run("go")
    assert seen == [["tool_started"], ["tool_started"]]
    assert [(r.outcome, text(r)) for r in finished(state).values()] == [("done", "acted"), ("done", "acted")]


def test_an_interrupt_arriving_as_a_sync_tool_starts_stops_the_run(store: Any) -> None:
    drive: list[tuple[asyncio.AbstractEventLoop, asyncio.Task[Any]]] = []

    @tool(effect="unsafe")
    def act() -> str:
        """Act, and be interrupted (Ctrl+C) the moment it starts."""
        loop, task = drive[0]
        loop.call_soon_threadsafe(task.cancel)
        time.sleep(0.2)
        return "acted"

    agent = Agent(ScriptedModel([call("act"), "done"]), tools=[act], store=store, poll_interval=0.05)

    async def main() -> None:
        task = asyncio.current_task()
        assert task is not None
        drive.append((asyncio.get_running_loop(), task))
        await agent.arun("go", id="r")

    for _ in range(5):  # the interrupt lands before or after the start's append is reported: never lost
        drive.clear()
        if store.exists("r"):
            store.delete("r")
        with pytest.raises(asyncio.CancelledError):
            asyncio.run(main())
        state = store.load("r")
        assert kinds(state)[-1] == "run_released" and state.status == "running"
        (result,) = finished(state).values()
        assert result.outcome == "aborted" and "may or may not" in text(result)


def test_no_thread_for_a_started_call_runs_it_late_but_once(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tether._run import invoke as _tool_runner

    ran: list[str] = []

    @tool(effect="unsafe")
    def act(ctx: ToolContext) -> str:
        """Act once."""
        ran.append(ctx.call_id)
        return "acted"

    def no_thread(job: Any) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(_tool_runner._TOOL_THREADS, "submit", no_thread)  # the process is out of threads
    script = [[call("act"), call("act"), call("act")], "done"]
    state = Agent(ScriptedModel(script), tools=[act], store=store).run("go")
    assert state.status == "completed"
    assert sorted(ran) == ["c3_0", "c3_1", "c3_2"], "each call ran once: none lost, none run twice"
    assert [r.outcome for r in finished(state).values()] == ["done", "done", "done"]


def test_parallel_async_calls_run_concurrently(store: Any) -> None:
    arrived: list[str] = []

    async def meet(name: str) -> str:
        arrived.append(name)
        for _ in range(500):
            if len(arrived) == 2:
                return name
            await asyncio.sleep(0.01)
        raise TimeoutError("the other call never ran meanwhile")

    @tool(effect="read_only")
    async def left() -> str:
        """Left."""
        return await meet("L")

    @tool(effect="read_only")
    async def right() -> str:
        """Right."""
        return await meet("R")

    state = Agent(
        ScriptedModel([[call("left"), call("right")], "done"]), tools=[left, right], store=store
    ).run("go")
    results = finished(state)
    assert {cid: (r.outcome, text(r)) for cid, r in results.items()} == {
        "c3_0": ("done", "L"),
        "c3_1": ("done", "R"),
    }


def test_a_tool_exception_is_a_result_the_model_sees(store: Any) -> None:
    @tool
    def boom() -> str:
        """Fail."""
        raise RuntimeError("disk full")

    model = ScriptedModel([call("boom"), lambda req: "saw: " + last_tool_text(req)])
    state = Agent(model, tools=[boom], store=store).run("go")
    assert state.status == "completed"
    assert state.answer == "saw: RuntimeError: disk full"
    assert finished(state)["c3_0"].outcome == "error"


def test_the_tool_context_carries_run_call_attempt_and_key(store: Any) -> None:
    seen: list[ToolContext] = []

    @tool(effect="idempotent")
    def pay(amount: int, ctx: ToolContext) -> str:
        """Pay."""
        seen.append(ctx)
        return "paid"

    state = Agent(ScriptedModel([call("pay", amount=3), "ok"]), tools=[pay], store=store).run(
        "go", id="pay-run"
    )
    (ctx,) = seen
    assert (ctx.run_id, ctx.call_id, ctx.attempt, ctx.idempotency_key) == (
        "pay-run",
        "c3_0",
        1,
        "tether:pay-run:c3_0",
    )
    assert "ctx" not in str(pay.schema), "the context is never shown to the model"
    assert state.status == "completed"


def test_timeouts_retry_idempotent_calls_with_the_same_key_and_abort_unsafe_ones(store: Any) -> None:
    keys: list[tuple[int, str]] = []

    @tool(effect="idempotent", timeout=0.05, max_attempts=3)
    async def flaky(ctx: ToolContext) -> str:
        """Slow twice, then quick."""
        keys.append((ctx.attempt, ctx.idempotency_key))
        if ctx.attempt < 3:
            await asyncio.sleep(30)
        return "finally"

    @tool(timeout=0.05)
    async def stuck() -> str:
        """Always slow."""
        await asyncio.sleep(30)
        return "never"

    state = Agent(
        ScriptedModel([[call("flaky"), call("stuck")], "done"]), tools=[flaky, stuck], store=store
    ).run("go")
    assert [a for a, _ in keys] == [1, 2, 3] and len({k for _, k in keys}) == 1
    results = finished(state)
    assert (results["c3_0"].outcome, text(results["c3_0"])) == ("done", "finally")
    assert results["c3_1"].outcome == "aborted" and "timed out" in text(results["c3_1"])
    starts = [(e.call_id, e.attempt) for e in of_kind(state, "tool_started")]
    assert starts == [("c3_0", 1), ("c3_1", 1), ("c3_0", 2), ("c3_0", 3)]


def test_an_existing_id_is_refused_before_any_model_request(store: Any) -> None:
    Agent(ScriptedModel(["first"]), store=store).run("hi", id="taken")
    before = store.read("taken")
    model = ScriptedModel(["second"])
    with pytest.raises(ValueError, match=r"run taken already exists.*Fix:"):
        Agent(model, store=store).run("again", id="taken")
    assert model.requests == []
    assert store.read("taken") == before


def test_a_run_without_a_store_still_gets_an_id() -> None:
    state = Agent(ScriptedModel(["hello"])).run("hi")
    assert len(state.id) == 32 and state.status == "completed" and state.answer == "hello"
    with pytest.raises(ValueError, match=r"needs a store\. Fix:"):
        Agent(ScriptedModel([])).resume(state.id)


def test_run_inside_a_running_event_loop_says_to_await_arun() -> None:
    model = ScriptedModel(["never"])
    agent = Agent(model)

    async def inside() -> None:
        with pytest.raises(RuntimeError, match=r"Fix: await agent\.arun"):
            agent.run("hi")
        with pytest.raises(RuntimeError, match=r"Fix: await agent\.aresume"):
            agent.resume("some-run")

    asyncio.run(inside())
    assert model.requests == []


def test_run_of_a_new_state_uses_its_id_and_messages(store: Any) -> None:
    state = State(id="from-state", messages=[Message.user("one"), "two"])
    model = ScriptedModel(["ok"])
    out = Agent(model, store=store).run(state)
    assert out.id == "from-state" and out.status == "completed"
    assert [m.text for m in model.requests[0].messages] == ["one", "two"]


# --------------------------------------------------------------------------------------------------
# Model errors (DESIGN 5.5)


def test_a_retryable_model_error_is_journaled_and_retried(store: Any) -> None:
    model = ScriptedModel([ModelError("overloaded", retryable=True), "fine"])
    state = Agent(model, store=store, retry_delay=0.01).run("hi")
    assert state.status == "completed" and state.answer == "fine"
    (failed,) = of_kind(state, "model_failed")
    assert (failed.error_type, failed.error, failed.retryable) == ("ModelError", "overloaded", True)
    assert [r.index for r in model.requests] == [0, 1]


def test_a_non_retryable_model_error_fails_the_run_and_raises_the_original(store: Any) -> None:
    error = ModelError("invalid api key", retryable=False)
    with pytest.raises(ModelError) as info:
        Agent(ScriptedModel([error]), store=store, retry_delay=0.01).run("hi", id="auth")
    assert info.value is error
    state = store.load("auth")
    assert state.status == "failed" and "invalid api key" in (state.reason or "")
    assert kinds(state)[-2:] == ["model_failed", "run_stopped"]
    assert store.holder("auth") is None, "a failed run is released"


def test_retryable_errors_past_the_limit_fail_the_run(store: Any) -> None:
    errors = [ModelError(f"busy {i}", retryable=True) for i in range(3)]
    with pytest.raises(ModelError) as info:
        Agent(ScriptedModel(errors), store=store, retry_delay=0.01, model_retries=2).run("hi", id="busy")
    assert info.value is errors[2]
    state = store.load("busy")
    assert len(of_kind(state, "model_failed")) == 3 and state.status == "failed"


# --------------------------------------------------------------------------------------------------
# The status table and resume (DESIGN 7)


@tool
def _send(to: str) -> str:
    """Send something."""
    return f"sent to {to}"


def journal_bytes(store: Any, run_id: str) -> list[tuple[int, str]]:
    return [(e.seq, e.h) for e in store.read(run_id)]


def test_resume_of_a_completed_run_returns_it_as_it_is(store: Any) -> None:
    first = Agent(ScriptedModel(["done"]), store=store).run("hi", id="fin")
    model = ScriptedModel([])
    state = Agent(model, store=store).resume("fin")
    assert state.status == "completed" and state.answer == "done"
    assert len(state.history) == len(first.history)
    assert model.requests == []
    assert journal_bytes(store, "fin") == [(e.seq, e.h) for e in first.history]


def test_resume_of_a_completed_run_with_changed_instructions_writes_nothing(store: Any) -> None:
    Agent(ScriptedModel(["done"]), instructions="v1", store=store).run("hi", id="fin2")
    before = journal_bytes(store, "fin2")
    model = ScriptedModel(["again?"])
    state = Agent(model, instructions="v2", store=store).resume("fin2")
    assert model.requests == []
    assert state.status == "completed" and state.answer == "done"
    assert journal_bytes(store, "fin2") == before


def test_resume_of_a_cancelled_run_returns_it_as_it_is(store: Any) -> None:
    agent = Agent(
        ScriptedModel([call("_send", to="x")]), tools=[_send], store=store, permissions=[ask("_send")]
    )
    agent.run("go", id="can")
    cancelled = store.cancel("can", by="ops")
    assert cancelled is not None and cancelled.status == "cancelled"
    assert finished(cancelled)["c3_0"].outcome == "cancelled", "a call never invoked is closed cancelled"
    assert cancelled.reason is not None and "ops" in cancelled.reason
    before = journal_bytes(store, "can")
    model = ScriptedModel([])
    state = Agent(model, tools=[_send], store=store, permissions=[ask("_send")]).resume("can")
    assert state.status == "cancelled" and model.requests == []
    assert journal_bytes(store, "can") == before


def test_a_waiting_run_stays_waiting_until_a_decision_arrives(store: Any) -> None:
    agent = Agent(
        ScriptedModel([call("_send", to="x"), "sent"]), tools=[_send], store=store, permissions=[ask("_send")]
    )
    state = agent.run("go", id="wait")
    assert state.status == "waiting"
    before = journal_bytes(store, "wait")
    again = agent.resume("wait")
    assert again.status == "waiting" and journal_bytes(store, "wait") == before
    loaded = store.load("wait")
    loaded.approve("c3_0", by="alice")
    store.save(loaded)
    assert loaded.status == "running", "a journaled approval makes the run runnable"
    assert [e.kind for e in loaded.history[len(before) :]] == ["approval_decided"]
    done = agent.resume("wait")
    assert done.status == "completed" and done.answer == "sent"
    assert text(finished(done)["c3_0"]) == "sent to x"
    assert of_kind(done, "approval_decided")[0].by == "alice"


def test_a_denial_closes_the_call_denied_and_the_model_sees_the_reason(store: Any) -> None:
    agent = Agent(
        ScriptedModel([call("_send", to="x"), lambda req: last_tool_text(req)]),
        tools=[_send],
        store=store,
        permissions=[ask("_send")],
    )
    state = agent.run("go")
    state.deny("c3_0", by="bob", reason="not today")
    out = agent.run(state)
    assert out.status == "completed"
    assert finished(out)["c3_0"].outcome == "denied"
    assert "bob" in out.answer and "not today" in out.answer


def test_a_budget_stop_continues_only_when_the_resuming_agent_allows(store: Any) -> None:
    ran: list[Any] = []
    script = [call("add", a=1, b=1), call("add", a=2, b=2), "done"]
    state = Agent(ScriptedModel(script), tools=[make_add(ran)], store=store, max_turns=1).run(
        "go", id="budget"
    )
    assert state.status == "stopped" and "max_turns" in (state.reason or "")
    before = journal_bytes(store, "budget")
    model = ScriptedModel(script)
    same = Agent(model, tools=[make_add(ran)], store=store, max_turns=1).resume("budget")
    assert same.status == "stopped" and model.requests == [] and journal_bytes(store, "budget") == before
    more = Agent(ScriptedModel(script), tools=[make_add(ran)], store=store, max_turns=5).resume("budget")
    assert more.status == "completed" and more.answer == "done"
    (changed,) = of_kind(more, "budgets_changed")
    assert changed.old == {"max_turns": 1} and changed.new == {"max_turns": 5}
    assert more.turn == 3 and ran == [(1, 1), (2, 2)]


def test_a_failed_run_is_asked_again_on_resume(store: Any) -> None:
    with pytest.raises(ModelError):
        Agent(ScriptedModel([ModelError("bad request")]), store=store).run("hi", id="again")
    model = ScriptedModel([ModelError("unused"), "recovered"])
    state = Agent(model, store=store).resume("again")
    assert state.status == "completed" and state.answer == "recovered"
    assert [r.index for r in model.requests] == [1]


def test_resume_after_a_crash_in_the_model_request_asks_again_with_the_same_index(store: Any) -> None:
    model = ScriptedModel([call("add", a=1, b=2), Crash()])
    ran: list[Any] = []
    with pytest.raises(Crash):
        Agent(model, tools=[make_add(ran)], store=store).run("go", id="crash")
    state = store.load("crash")
    assert state.status == "running" and kinds(state)[-1] == "tool_finished"
    model2 = ScriptedModel([call("add", a=1, b=2), "answer"])
    out = Agent(model2, tools=[make_add(ran)], store=store).resume("crash")
    assert [r.index for r in model2.requests] == [model.requests[-1].index] == [1]
    assert out.answer == "answer" and ran == [(1, 2)]


def test_three_resumes_without_progress_fail_the_run_as_a_crash_loop(store: Any) -> None:
    model = ScriptedModel([Crash()])
    agent = Agent(model, store=store)
    with pytest.raises(Crash):
        agent.run("hi", id="loop")
    for _ in range(2):
        with pytest.raises(Crash):
            agent.resume("loop")
    assert len(model.requests) == 3
    state = agent.resume("loop")
    assert state.status == "failed" and "crash loop" in (state.reason or "")
    assert len(model.requests) == 3, "no request after the loop is found"
    assert kinds(state).count("run_resumed") == 4 and kinds(state)[-1] == "run_stopped"


# --------------------------------------------------------------------------------------------------
# Recovery from what the journal recorded


async def _interrupt_while(agent: Agent, started: asyncio.Event, prompt: str, run_id: str) -> None:
    task = asyncio.ensure_future(agent.arun(prompt, id=run_id))
    await asyncio.wait_for(started.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def test_an_interrupted_idempotent_call_is_left_open_and_retried_with_the_same_key(store: Any) -> None:
    calls: list[tuple[int, str]] = []

    def build(started: asyncio.Event | None) -> Any:
        @tool(effect="idempotent")
        async def sync_db(ctx: ToolContext) -> str:
            """Sync."""
            calls.append((ctx.attempt, ctx.idempotency_key))
            if started is not None:
                started.set()
                await asyncio.sleep(30)
            return "synced"

        return sync_db

    async def first() -> None:
        started = asyncio.Event()
        agent = Agent(ScriptedModel([call("sync_db"), "done"]), tools=[build(started)], store=store)
        await _interrupt_while(agent, started, "go", "idem")

    asyncio.run(first())
    state = store.load("idem")
    assert kinds(state)[-1] == "run_released"
    (open_call,) = state.open_calls
    assert (open_call.action, open_call.attempt) == ("retry", 1)
    out = Agent(ScriptedModel([call("sync_db"), "done"]), tools=[build(None)], store=store).resume("idem")
    assert out.status == "completed"
    assert calls == [(1, "tether:idem:c3_0"), (2, "tether:idem:c3_0")]


def test_an_interrupted_unsafe_call_is_closed_aborted(store: Any) -> None:
    async def first() -> None:
        started = asyncio.Event()

        @tool
        async def charge() -> str:
            """Charge."""
            started.set()
            await asyncio.sleep(30)
            return "charged"

        agent = Agent(ScriptedModel([call("charge"), "done"]), tools=[charge], store=store)
        await _interrupt_while(agent, started, "go", "unsafe")

    asyncio.run(first())
    state = store.load("unsafe")
    result = finished(state)["c3_0"]
    assert result.outcome == "aborted" and "may or may not have run" in text(result)
    assert kinds(state)[-1] == "run_released" and state.status == "running"


def test_a_started_call_whose_tool_is_gone_is_aborted(store: Any) -> None:
    async def first() -> None:
        started = asyncio.Event()

        @tool(effect="read_only")
        async def lookup() -> str:
            """Look up."""
            started.set()
            await asyncio.sleep(30)
            return "found"

        agent = Agent(ScriptedModel([call("lookup"), "done"]), name="bot", tools=[lookup], store=store)
        await _interrupt_while(agent, started, "go", "gone")

    asyncio.run(first())
    assert store.load("gone").open_calls[0].action == "retry"
    model = ScriptedModel([call("lookup"), lambda req: last_tool_text(req)])
    out = Agent(model, name="bot", store=store).resume("gone")
    result = finished(out)["c3_0"]
    assert result.outcome == "aborted" and "tool lookup is not in this agent" in text(result)
    assert out.status == "completed" and "not in this agent" in out.answer


def test_an_approved_call_whose_tool_is_gone_is_an_input_error(store: Any) -> None:
    agent = Agent(
        ScriptedModel([call("_send", to="x")]),
        name="bot",
        tools=[_send],
        store=store,
        permissions=[ask("_send")],
    )
    state = agent.run("go", id="gone2")
    state.approve("c3_0", by="alice")
    store.save(state)
    model = ScriptedModel([call("_send", to="x"), "ok"])
    out = Agent(model, name="bot", store=store).resume("gone2")
    assert finished(out)["c3_0"].outcome == "input_error"
    assert "c3_0" not in [e.call_id for e in of_kind(out, "tool_started")]
    assert out.status == "completed"


def test_a_changed_agent_appends_agent_changed_and_continues(store: Any) -> None:
    with pytest.raises(Crash):
        Agent(ScriptedModel([Crash()]), instructions="v1", store=store).run("hi", id="changed")
    old = store.load("changed").fingerprint
    strict = Agent(ScriptedModel(["no"]), instructions="v2", store=store, strict_resume=True)
    before = journal_bytes(store, "changed")
    with pytest.raises(ValueError, match="Fix:"):
        strict.resume("changed")
    assert journal_bytes(store, "changed") == before
    agent = Agent(ScriptedModel(["yes"]), instructions="v2", store=store)
    state = agent.resume("changed")
    (changed,) = of_kind(state, "agent_changed")
    assert changed.old == old and changed.new == agent.fingerprint() and changed.old != changed.new
    assert state.status == "completed" and state.fingerprint == agent.fingerprint()


def test_resume_with_an_agent_of_another_name_is_refused_naming_both(store: Any) -> None:
    Agent(ScriptedModel(["hi"]), name="billing", store=store).run("x", id="named")
    model = ScriptedModel(["never"])
    with pytest.raises(ValueError) as info:
        Agent(model, name="support", store=store).resume("named")
    assert (
        str(info.value) == "run named belongs to agent billing; this is support. Fix: resume it with billing"
    )
    assert model.requests == []


def test_resume_of_an_unknown_run_says_so(store: Any) -> None:
    with pytest.raises(tether.RunNotFoundError, match=r"run ghost is not in this store\. Fix:"):
        Agent(ScriptedModel([]), store=store).resume("ghost")


# --------------------------------------------------------------------------------------------------
# Continuing a run


def test_add_message_and_run_continue_a_completed_run(store: Any) -> None:
    model = ScriptedModel(
        ["sunny", lambda req: f"{len(req.messages)} messages; last: {req.messages[-1].text}"]
    )
    agent = Agent(model, store=store)
    state = agent.run("weather?")
    state.add_message(Message.user("and tomorrow?"))
    out = agent.run(state)
    assert out is state
    assert out.status == "completed" and out.answer == "3 messages; last: and tomorrow?"
    message = of_kind(out, "message")[-1]
    assert message.inbox_seq == 0
    assert store.load(state.id).answer == out.answer


def test_messages_posted_while_a_tool_runs_join_after_its_result(store: Any) -> None:
    posted = threading.Event()

    @tool(effect="read_only")
    def slow(ctx: ToolContext) -> str:
        """Slow."""
        store.post(
            ctx.run_id, {"type": "message", "role": "user", "content": [{"type": "text", "text": "hurry"}]}
        )
        posted.set()
        for _ in range(500):  # wait until the holder has journaled the message
            if any(e.kind == "message" and e.inbox_seq == 0 for e in store.read(ctx.run_id)):
                break
            threading.Event().wait(0.01)
        return "slow result"

    model = ScriptedModel([call("slow"), lambda req: "|".join(m.role for m in req.messages)])
    state = Agent(model, tools=[slow], store=store, poll_interval=0.02).run("go")
    assert posted.is_set()
    assert state.answer == "user|assistant|tool|user"
    assert model.requests[1].messages[-1].text == "hurry"
    assert kinds(state).index("message", 2) < kinds(state).index("tool_finished"), (
        "journaled while the tool ran"
    )


# --------------------------------------------------------------------------------------------------
# The inbox while the model is asked (DURABILITY 2.3)


def _message_item(text_: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "text", "text": text_}]}


def test_a_message_posted_during_a_final_reply_takes_the_place_of_the_stop(store: Any) -> None:
    async def first(request: Any) -> str:
        store.post(request.run_id, _message_item("wait, one more"))
        await asyncio.sleep(0.3)  # the holder reads its inbox meanwhile (poll_interval 0.01)
        return "first answer"

    model = ScriptedModel([first, lambda req: f"second answer to: {req.messages[-1].text}"])
    state = Agent(model, store=store, poll_interval=0.01).run("hi")
    assert state.status == "completed" and state.answer == "second answer to: wait, one more"
    assert len(model.requests) == 2
    replied = of_kind(state, "model_replied")[0]
    after = state.history[replied.seq + 1]
    assert after.kind == "message" and after.inbox_seq == 0
    assert (replied.b, after.b) == (1, 0), "journaled in the same append as the reply"
    assert kinds(state).count("run_stopped") == 1


def test_a_cancel_during_a_model_request_abandons_it_and_writes_nothing_for_it(store: Any) -> None:
    abandoned = threading.Event()

    async def slow(request: Any) -> str:
        assert store.cancel(request.run_id, by="ops") is None, "the run is held: the cancel is posted"
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            abandoned.set()
            raise
        return "too late"

    state = Agent(ScriptedModel([slow]), store=store, poll_interval=0.01).run("hi")
    assert abandoned.is_set()
    assert state.status == "cancelled"
    assert kinds(state)[-2:] == ["cancel_requested", "run_stopped"]
    assert "model_replied" not in kinds(state) and "model_failed" not in kinds(state)


def test_a_message_posted_during_a_failed_request_is_journaled_once_and_the_next_reply_stops(
    store: Any,
) -> None:
    async def fail(request: Any) -> str:
        store.post(request.run_id, _message_item("also this"))
        await asyncio.sleep(0.3)  # the holder reads its inbox meanwhile (poll_interval 0.01)
        raise ModelError("overloaded", retryable=True)

    model = ScriptedModel([fail, lambda req: f"saw: {req.messages[-1].text}", "asked a third time"])
    state = Agent(model, store=store, poll_interval=0.01, retry_delay=0.01).run("hi")
    assert [e.inbox_seq for e in of_kind(state, "message") if e.inbox_seq is not None] == [0]
    failed = of_kind(state, "model_failed")[0]
    assert state.history[failed.seq + 1].kind == "message", "journaled right after the failed request"
    assert state.answer == "saw: also this"
    assert len(model.requests) == 2


def test_a_decision_posted_while_another_call_runs_starts_the_approved_call_at_once(store: Any) -> None:
    approved_ran = threading.Event()

    @tool
    def needs_ok() -> str:
        """Needs approval."""
        approved_ran.set()
        return "ok'd"

    @tool
    def busy(ctx: ToolContext) -> str:
        """Approves the other call, then waits for it to run meanwhile."""
        decision = {"type": "decision", "call_id": "c3_1", "round": 0, "approved": True, "by": "alice"}
        store.post(ctx.run_id, decision)
        return "saw it run" if approved_ran.wait(10) else "it did not run meanwhile"

    agent = Agent(
        ScriptedModel([[call("busy"), call("needs_ok")], "done"]),
        tools=[busy, needs_ok],
        store=store,
        permissions=[ask("needs_ok")],
        poll_interval=0.01,
    )
    state = agent.run("go")
    results = finished(state)
    assert text(results["c3_0"]) == "saw it run"
    assert (results["c3_1"].outcome, text(results["c3_1"])) == ("done", "ok'd")
    decided = of_kind(state, "approval_decided")[0]
    started = state.history[decided.seq + 1]
    assert (decided.by, decided.inbox_seq) == ("alice", 0)
    assert (started.kind, started.call_id) == ("tool_started", "c3_1")
    assert (decided.b, started.b) == (1, 0), "the decision and the start are one append"


def test_an_unconsumed_message_reopens_a_completed_run_on_resume(store: Any) -> None:
    Agent(ScriptedModel(["first"]), store=store).run("hi", id="reopen")
    store.post("reopen", {**_message_item("follow-up"), "seen_seq": 4})
    model = ScriptedModel(["first", lambda req: f"re: {req.messages[-1].text}"])
    state = Agent(model, store=store).resume("reopen")
    assert state.status == "completed" and state.answer == "re: follow-up"
    assert [r.index for r in model.requests] == [1]
    added = [e for e in state.history if e.kind == "message" and e.inbox_seq == 0]
    assert len(added) == 1 and kinds(state)[added[0].seq + 1] == "run_resumed", "consumed first"


def test_a_message_posted_before_seeing_a_cancel_is_skipped(store: Any) -> None:
    agent = Agent(
        ScriptedModel([call("_send", to="x")]), tools=[_send], store=store, permissions=[ask("_send")]
    )
    agent.run("go", id="cxl")
    seen = len(store.read("cxl"))
    store.cancel("cxl")
    stopped_at = len(store.read("cxl")) - 1
    store.post("cxl", {**_message_item("too late"), "seen_seq": seen})
    model = ScriptedModel([])
    state = Agent(model, tools=[_send], store=store, permissions=[ask("_send")]).resume("cxl")
    assert state.status == "cancelled" and model.requests == []
    skipped = of_kind(state, "inbox_skipped")
    assert [(e.inbox_seq, e.reason) for e in skipped] == [(1, f"run cancelled at seq {stopped_at}")]


def test_a_failed_run_that_keeps_crashing_when_asked_again_is_a_crash_loop(store: Any) -> None:
    with pytest.raises(ModelError):
        Agent(ScriptedModel([ModelError("bad request")]), store=store).run("hi", id="failloop")
    model = ScriptedModel([ModelError("unused"), Crash()])
    agent = Agent(model, store=store)
    for _ in range(3):
        with pytest.raises(Crash):
            agent.resume("failloop")
    assert [r.index for r in model.requests] == [1, 1, 1]
    state = agent.resume("failloop")
    assert len(model.requests) == 3, "no fourth request: three resumes without progress are a crash loop"
    assert state.status == "failed" and "crash loop" in (state.reason or "")


def test_resume_of_a_waiting_run_with_changed_instructions_writes_nothing(store: Any) -> None:
    agent = Agent(
        ScriptedModel([call("_send", to="x")]),
        instructions="v1",
        tools=[_send],
        store=store,
        permissions=[ask("_send")],
    )
    assert agent.run("go", id="wait2").status == "waiting"
    before = journal_bytes(store, "wait2")
    model = ScriptedModel([])
    changed = Agent(model, instructions="v2", tools=[_send], store=store, permissions=[ask("_send")])
    state = changed.resume("wait2")
    assert state.status == "waiting" and model.requests == []
    assert journal_bytes(store, "wait2") == before


def test_the_driving_process_holds_exactly_the_entries_a_load_returns(store: Any) -> None:
    @tool(effect="read_only")
    def look(city: str) -> str:
        """Look a city up."""
        return f"{city}: sunny"

    script = [[call("look", city="Oslo"), call("look", city="Rome")], call("look", city="Lima"), "done"]
    state = Agent(ScriptedModel(script), tools=[look], store=store).run("go")
    loaded = store.load(state.id)
    assert [tether.journal.entry_to_dict(e) | {"w": e.w, "h": e.h} for e in state.history] == [
        tether.journal.entry_to_dict(e) | {"w": e.w, "h": e.h} for e in loaded.history
    ]
    assert all(e.h and e.w for e in state.history)  # every entry in the fold is the sealed one
    assert state.output == loaded.output == "done" and state.reason is None


def test_import_tether_loads_the_driver_and_asyncio_only_when_a_run_is_driven() -> None:
    code = (
        "import sys, tether\n"
        "driver = ('asyncio', 'tether._run.drive', 'tether._run.taking', 'tether.context')\n"
        "before = sorted(m for m in driver if m in sys.modules)\n"
        "import tether.testing\n"
        "agent = tether.Agent(tether.testing.ScriptedModel(['hi']))\n"
        "state = agent.run('go')\n"
        "print(before, state.status, 'tether._run.drive' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[] completed True"
