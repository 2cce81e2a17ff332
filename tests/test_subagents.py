"""Subagents: an Agent in another agent's tools runs as a run of its own (DESIGN 10, DURABILITY 6; issue 5).

Every test runs against MemoryStore and FileStore (the ``store`` fixture). Tool executions are counted in a
list the tools append to; the crash tests (tests/crash/test_subagent_crash.py) judge them from a side file.
"""

from __future__ import annotations

import hashlib
import threading
from typing import Any

import pytest

from tether import Agent, ModelError, ModelRequest, State, Store, ToolContext, tool
from tether.testing import ScriptedModel, call


def derived(parent_id: str, call_id: str) -> str:
    """The child id as DESIGN 10 spells it."""
    return parent_id[:64] + "-" + hashlib.sha256(f"{parent_id}\x00{call_id}".encode()).hexdigest()[:24]


def last_results(request: ModelRequest) -> str:
    """The last tool message of a request, as ``outcome:text`` joined by `` | ``."""
    for message in reversed(list(request.messages)):
        if message.role == "tool":
            return " | ".join(
                f"{r['outcome']}:" + "".join(b.get("text", "") for b in r["content"]) for r in message.content
            )
    return "no tool result"


def echo(request: ModelRequest) -> str:
    return "parent saw " + last_results(request)


def entries(state: State, kind: str) -> list[Any]:
    return [e for e in state.history if e.kind == kind]


def text(entry: Any) -> str:
    return "".join(b.get("text", "") for b in entry.content if b.get("type") == "text")


class Tools:
    """Tools for the child agents; each execution is recorded as (run id, call id)."""

    def __init__(self) -> None:
        self.ran: list[tuple[str, str, str]] = []

        @tool(approval=True)
        def send(to: str, ctx: ToolContext) -> str:
            """Send a message (needs approval).

            Args:
                to: The recipient.
            """
            self.ran.append(("send", ctx.run_id, ctx.call_id))
            return f"sent to {to}"

        @tool(effect="read_only")
        def lookup(name: str, ctx: ToolContext) -> str:
            """Look a name up.

            Args:
                name: The name.
            """
            self.ran.append(("lookup", ctx.run_id, ctx.call_id))
            return f"{name} found"

        self.send = send
        self.lookup = lookup


def helper(store: Store, replies: list[Any], tools: list[Any] = (), **kw: Any) -> Agent:  # type: ignore[assignment]
    return Agent(
        ScriptedModel(replies),
        name="helper",
        description="Does a part of the work.",
        tools=tools,
        store=store,
        poll_interval=0.02,
        **kw,
    )


def boss(store: Store, child: Agent, replies: list[Any], **kw: Any) -> Agent:
    return Agent(ScriptedModel(replies), name="boss", tools=[child], store=store, poll_interval=0.02, **kw)


# --------------------------------------------------------------------------------------------------
# A child is a run of its own


@pytest.mark.parametrize("parent_id", ["p1", "p" * 128])
def test_a_child_is_a_run_of_its_own_with_the_derived_id(store: Store, parent_id: str) -> None:
    child = helper(store, ["the child's answer"])
    parent = boss(store, child, [call("helper", prompt="find the thing"), echo])
    state = parent.run("go", id=parent_id)

    assert state.status == "completed"
    assert state.answer == "parent saw done:the child's answer"
    child_id = derived(parent_id, "c3_0")
    assert len(child_id) == min(len(parent_id), 64) + 1 + 24
    kid = store.load(child_id)
    assert (kid.parent_id, kid.root_id, kid.parent_call_id) == (parent_id, parent_id, "c3_0")
    assert kid.agent == "helper" and kid.status == "completed" and kid.answer == "the child's answer"
    assert kid.messages[0].role == "user" and kid.messages[0].text == "find the thing"
    assert [info.id for info in store.list(parent_id=parent_id)] == [child_id]
    assert {info.id for info in store.list(root_id=parent_id)} >= {child_id}

    (started,) = entries(state, "tool_started")
    assert (started.call_id, started.tool, started.effect) == ("c3_0", "helper", "resumable")
    (finished,) = entries(state, "tool_finished")
    assert finished.outcome == "done" and text(finished) == "the child's answer"
    assert finished.usage == kid.usage and kid.usage["input_tokens"] > 0
    own = [e.usage for e in entries(state, "model_replied")]
    for name in ("input_tokens", "output_tokens"):
        assert state.usage[name] == sum(u[name] for u in own) + kid.usage[name]
    assert store.load(parent_id).usage == state.usage


def test_a_grandchild_has_the_root_of_its_tree(store: Store) -> None:
    grandchild = Agent(
        ScriptedModel(["deep answer"]), name="leaf", description="The deepest worker.", store=store
    )
    child = Agent(
        ScriptedModel([call("leaf", prompt="go deeper"), echo]),
        name="helper",
        description="Does a part of the work.",
        tools=[grandchild],
        store=store,
    )
    parent = boss(store, child, [call("helper", prompt="go"), echo])
    state = parent.run("go", id="root")
    assert state.status == "completed"
    assert state.answer == "parent saw done:parent saw done:deep answer"
    child_id = derived("root", "c3_0")
    leaf_id = derived(child_id, "c3_0")
    leaf = store.load(leaf_id)
    assert (leaf.parent_id, leaf.root_id, leaf.parent_call_id) == (child_id, "root", "c3_0")
    assert [i.id for i in store.list(parent_id=child_id)] == [leaf_id]
    assert {i.id for i in store.list(root_id="root")} >= {child_id, leaf_id}
    # usage flows up the tree: the root's total includes the leaf's
    assert state.usage["input_tokens"] == 10 * (2 + 2 + 1)


def test_a_failed_child_is_an_error_result_with_its_status_and_reason(store: Store) -> None:
    child = helper(store, [ModelError("invalid api key", retryable=False)])
    parent = boss(store, child, [call("helper", prompt="try"), echo])
    state = parent.run("go", id="p1")
    assert state.status == "completed"
    kid = store.load(derived("p1", "c3_0"))
    assert kid.status == "failed" and "invalid api key" in (kid.reason or "")
    (finished,) = entries(state, "tool_finished")
    assert finished.outcome == "error"
    assert "failed" in text(finished) and "invalid api key" in text(finished)
    assert state.answer is not None and state.answer.startswith("parent saw error:")


def test_a_child_that_runs_tools_reports_them_once(store: Store) -> None:
    tools = Tools()
    child = helper(store, [call("lookup", name="ann"), echo], tools=[tools.lookup])
    parent = boss(store, child, [call("helper", prompt="look ann up"), echo])
    state = parent.run("go", id="p1")
    child_id = derived("p1", "c3_0")
    assert state.answer == "parent saw done:parent saw done:ann found"
    assert tools.ran == [("lookup", child_id, "c3_0")]
    # the child's work is in the child's journal, not the parent's
    assert [e.call_id for e in entries(state, "tool_started")] == ["c3_0"]
    assert [e.tool for e in entries(store.load(child_id), "tool_started")] == ["lookup"]


# --------------------------------------------------------------------------------------------------
# A child waiting for approval


def test_a_waiting_child_makes_the_parent_wait_and_run_id_approval_finishes_both(store: Store) -> None:
    tools = Tools()
    child = helper(store, [call("send", to="ann"), echo], tools=[tools.send])
    parent = boss(store, child, [call("helper", prompt="tell ann"), echo])
    state = parent.run("go", id="p1")
    child_id = derived("p1", "c3_0")

    assert state.status == "waiting"
    assert store.load(child_id).status == "waiting"
    assert tools.ran == []
    (waiting,) = entries(state, "child_waiting")
    assert (waiting.call_id, waiting.child_id) == ("c3_0", child_id)
    for seen in (state, store.load("p1")):
        (pending,) = seen.pending_approvals
        assert (pending.call_id, pending.run_id, pending.tool, pending.args) == (
            "c3_0",
            child_id,
            "send",
            {"to": "ann"},
        )
    assert [i.status for i in store.list(parent_id="p1")] == ["waiting"]

    loaded = store.load("p1")
    loaded.approve("c3_0", run_id=child_id, by="alice", reason="fine")
    store.save(loaded)
    assert store.load("p1").status == "waiting", "a save never drives the parent"

    done = parent.resume("p1")
    assert done.status == "completed"
    assert done.answer == "parent saw done:parent saw done:sent to ann"
    kid = store.load(child_id)
    assert kid.status == "completed"
    (decided,) = entries(kid, "approval_decided")
    assert decided.approved and decided.by == "alice" and decided.inbox_seq == 0
    assert tools.ran == [("send", child_id, "c3_0")]
    assert len(store.list(parent_id="p1")) == 1
    # resuming a completed tree does nothing
    length = len(store.read("p1")), len(store.read(child_id))
    again = parent.resume("p1")
    assert again.status == "completed"
    assert (len(store.read("p1")), len(store.read(child_id))) == length


def test_approve_without_run_id_when_the_call_id_is_unique_in_the_tree(store: Store) -> None:
    tools = Tools()
    # the child's approval call is c6_0 (after its lookup call c3_0); the parent has only c3_0
    child = helper(
        store,
        [call("lookup", name="ann"), call("send", to="ann"), echo],
        tools=[tools.lookup, tools.send],
    )
    parent = boss(store, child, [call("helper", prompt="find and tell ann"), echo])
    state = parent.run("go", id="p1")
    child_id = derived("p1", "c3_0")
    assert state.status == "waiting"
    (pending,) = state.pending_approvals
    assert (pending.call_id, pending.run_id) == ("c6_0", child_id)

    state.approve("c6_0", by="bob")
    store.save(state)
    done = parent.resume("p1")
    assert done.status == "completed" and done.answer == "parent saw done:parent saw done:sent to ann"
    assert [r[0] for r in tools.ran] == ["lookup", "send"]


def test_an_ambiguous_call_id_needs_run_id(store: Store) -> None:
    tools = Tools()
    child = helper(store, [call("send", to="ann"), echo], tools=[tools.send])
    parent = boss(store, child, [call("helper", prompt="tell ann"), echo])
    state = parent.run("go", id="p1")
    assert [p.call_id for p in state.pending_approvals] == ["c3_0"]  # c3_0 is also the parent's own call
    with pytest.raises(ValueError, match="run_id="):
        state.approve("c3_0")
    with pytest.raises(ValueError, match="run_id="):
        state.deny("c3_0", reason="no")
    assert state.take_local_changes() == []
    state.deny("c3_0", run_id=derived("p1", "c3_0"), by="carol", reason="not now")
    store.save(state)
    done = parent.resume("p1")
    assert done.status == "completed"
    assert done.answer is not None and "denied by carol: not now" in done.answer
    assert tools.ran == []


def test_a_decision_for_a_run_outside_the_tree_is_refused(store: Store) -> None:
    tools = Tools()
    child = helper(store, [call("send", to="ann"), echo], tools=[tools.send])
    parent = boss(store, child, [call("helper", prompt="tell ann"), echo])
    state = parent.run("go", id="p1")
    with pytest.raises(ValueError, match="pending_approvals"):
        state.approve("c3_0", run_id="someone-else")


def test_resuming_a_child_is_refused_naming_its_parent(store: Store) -> None:
    tools = Tools()
    child = helper(store, [call("send", to="ann"), echo], tools=[tools.send])
    parent = boss(store, child, [call("helper", prompt="tell ann"), echo])
    parent.run("go", id="p1")
    child_id = derived("p1", "c3_0")
    length = len(store.read(child_id))
    with pytest.raises(ValueError) as info:
        child.resume(child_id)
    assert str(info.value) == f"run {child_id} is a subagent of p1. Fix: resume p1"
    assert len(store.read(child_id)) == length
    assert store.holder(child_id) is None, "the refused take let the child go"


# --------------------------------------------------------------------------------------------------
# Budgets and cancels


def test_a_child_gets_the_parents_remaining_budget(store: Store) -> None:
    tools = Tools()
    child = helper(store, [call("lookup", name=f"n{i}") for i in range(10)], tools=[tools.lookup])
    parent = boss(store, child, [call("helper", prompt="look many up"), echo], max_turns=3)
    state = parent.run("go", id="p1")
    kid = store.load(derived("p1", "c3_0"))
    # the parent used 1 of its 3 turns before the call: the child may use 2
    assert kid.status == "stopped" and kid.turn == 2
    assert kid.reason is not None and "max_turns" in kid.reason
    assert len(tools.ran) == 2
    (finished,) = entries(state, "tool_finished")
    assert finished.outcome == "error" and "stopped" in text(finished) and "max_turns" in text(finished)
    assert finished.usage == kid.usage
    assert state.status == "completed" and state.turn == 2


def test_a_child_within_the_parents_budget_completes(store: Store) -> None:
    child = helper(store, ["small job done"])
    parent = boss(store, child, [call("helper", prompt="small job"), echo], max_turns=3)
    state = parent.run("go", id="p1")
    assert state.status == "completed" and state.answer == "parent saw done:small job done"


def _waiting_tree(store: Store) -> tuple[Agent, Tools, str]:
    tools = Tools()
    child = helper(store, [call("send", to="ann"), echo], tools=[tools.send])
    parent = boss(store, child, [call("helper", prompt="tell ann"), echo])
    assert parent.run("go", id="p1").status == "waiting"
    return parent, tools, derived("p1", "c3_0")


def test_cancelling_a_waiting_parent_closes_the_subagent_call_aborted(store: Store) -> None:
    _, tools, _ = _waiting_tree(store)
    store.cancel("p1", by="alice")
    state = store.load("p1")
    assert state.status == "cancelled"
    assert state.open_calls == []
    (finished,) = entries(state, "tool_finished")
    assert finished.call_id == "c3_0" and finished.outcome == "aborted"
    assert "subagent cancelled" in text(finished)
    assert tools.ran == []


def test_cancelling_a_waiting_parent_cancels_the_child_first(store: Store) -> None:
    _, tools, child_id = _waiting_tree(store)
    store.cancel("p1", by="alice")
    kid = store.load(child_id)
    assert kid.status == "cancelled"
    assert [e.kind for e in kid.history][-2:] == ["tool_finished", "run_stopped"]
    assert entries(kid, "cancel_requested")
    (closed,) = entries(kid, "tool_finished")
    assert closed.outcome == "cancelled", "the child's approval call never started"
    assert store.inbox_length(child_id) == kid.inbox_consumed + 1, "the child's cancel is journaled"
    parent = store.load("p1")
    assert parent.status == "cancelled"
    (finished,) = entries(parent, "tool_finished")
    assert finished.outcome == "aborted" and "subagent cancelled" in text(finished)
    assert kid.history[-1].at <= finished.at, "the child is cancelled before its call is closed"
    assert tools.ran == []


def test_a_cancel_found_by_the_parents_driver_cancels_its_waiting_child(store: Store) -> None:
    parent, tools, child_id = _waiting_tree(store)
    store.post("p1", {"type": "cancel", "by": "alice", "seen_seq": len(store.read("p1"))})
    state = parent.resume("p1")
    assert state.status == "cancelled" and state.open_calls == []
    kid = store.load(child_id)
    assert kid.status == "cancelled"
    (finished,) = entries(state, "tool_finished")
    assert finished.outcome == "aborted" and "subagent cancelled" in text(finished)
    assert tools.ran == []


def test_cancelling_a_parent_while_its_child_runs_cancels_the_child_first(store: Store) -> None:
    started, release = threading.Event(), threading.Event()

    @tool
    def hold(ctx: ToolContext) -> str:
        """Blocks until released (unsafe)."""
        started.set()
        release.wait(20)
        return "held"

    child = helper(store, [call("hold"), "child done"], tools=[hold])
    parent = boss(store, child, [call("helper", prompt="hold on"), echo])
    out: dict[str, Any] = {}

    def drive() -> None:
        try:
            out["state"] = parent.run("go", id="p1")
        except BaseException as exc:  # reported below
            out["error"] = exc

    thread = threading.Thread(target=drive)
    thread.start()
    try:
        assert started.wait(20)
        assert store.cancel("p1", by="alice") is None, "the driver holds the parent: the cancel is posted"
        thread.join(30)
    finally:
        release.set()
        thread.join(30)
    assert "error" not in out, out.get("error")
    state = out["state"]
    assert state.status == "cancelled"
    kid = store.load(derived("p1", "c3_0"))
    assert kid.status == "cancelled"
    (kid_closed,) = entries(kid, "tool_finished")
    assert kid_closed.outcome == "aborted", "the child's unsafe tool was cut off by the cancel"
    (finished,) = entries(store.load("p1"), "tool_finished")
    assert finished.outcome == "aborted" and "subagent cancelled" in text(finished)
    assert kid.history[-1].at <= finished.at
    assert store.load("p1").open_calls == []


def test_an_item_posted_to_a_finished_subagent_is_skipped_and_the_root_stops_needing_work(
    tmp_path: Any,
) -> None:
    import asyncio

    from tether import Owner, SQLiteStore, tool

    @tool(approval=True)
    def publish(text: str) -> str:
        """Publish.

        Args:
            text: The text.
        """
        return "published"

    store = SQLiteStore(tmp_path / "runs.db")
    child = Agent(ScriptedModel(["child done"]), name="helper", description="Helps.", store=store)
    model = ScriptedModel([[call("helper", prompt="help"), call("publish", text="x")], "parent done"])
    parent = Agent(model, name="boss", tools=[child, publish], store=store)
    state = parent.run("go", id="root-o")
    assert state.status == "waiting", "the child finished; publish waits for a person"
    (child_info,) = store.list(parent_id="root-o")
    assert store.load(child_info.id).status == "completed"
    store.post(
        child_info.id, {"type": "message", "role": "user", "content": [{"type": "text", "text": "late"}]}
    )
    lease = store.claim_next(Owner.here(), agents=["boss"])
    assert lease is not None and lease.run_id == "root-o", (
        "the child's unconsumed item makes its root need work"
    )
    asyncio.run(parent.adrive(store, lease))
    skipped = [e for e in store.load(child_info.id).history if e.kind == "inbox_skipped"]
    assert [e.reason for e in skipped] == ["the subagent call is closed"]
    assert store.load(child_info.id).status == "completed"
    assert store.claim_next(Owner.here(), agents=["boss"]) is None, "nothing is left to do"
    assert store.load("root-o").status == "waiting"
    store.close()
