"""Compaction: a summary replaces earlier turns in the context; the history keeps everything (issue 5)."""

from __future__ import annotations

from typing import Any

import pytest

from tether import Agent, Message, ModelError, ModelReply, State, Store, ToolContext, tool
from tether.testing import ScriptedModel, call


@tool(effect="read_only")
def ping(ctx: ToolContext) -> str:
    """Ping."""
    return "pong"


def kinds(state: State) -> list[str]:
    return [e.kind for e in state.history]


def roles_and_texts(messages: Any) -> list[tuple[str, str]]:
    out = []
    for m in messages:
        if m.role == "tool":
            out.append(("tool", ",".join(r["outcome"] for r in m.content)))
        elif m.tool_calls:
            out.append((m.role, "calls " + ",".join(c["name"] for c in m.tool_calls)))
        else:
            out.append((m.role, m.text))
    return out


SUMMARY_HEAD = "Summary of the conversation so far:\n"


def test_compact_journals_the_summary_and_the_next_context_starts_from_it(store: Store) -> None:
    model = ScriptedModel(
        [call("ping"), "first answer", "THE SUMMARY", call("ping"), "second answer"], name="m"
    )
    agent = Agent(model, name="c", tools=[ping], store=store)
    state = agent.run("hello there", id="r")
    assert state.status == "completed"
    before = len(state.history)
    full_context = list(state.context_messages)

    compacted = agent.compact("r")
    assert kinds(compacted)[before:] == ["run_resumed", "compacted"]
    entry = compacted.history[-1]
    assert entry.summary == "THE SUMMARY"
    assert compacted.status == "completed" and compacted.answer == "first answer"
    # the summary request: request index 2, the whole context then a request to summarize, no tools
    summary_request = model.requests[2]
    assert summary_request.index == 2 and summary_request.tools == []
    assert list(summary_request.messages)[: len(full_context)] == full_context
    assert summary_request.messages[-1].role == "user" and "ummar" in summary_request.messages[-1].text
    assert roles_and_texts(compacted.context_messages) == [
        ("user", "hello there"),
        ("user", SUMMARY_HEAD + "THE SUMMARY"),
    ]

    loaded = store.load("r")
    loaded.add_message("and again?")
    done = agent.run(loaded)
    assert done.status == "completed" and done.answer == "second answer"
    assert roles_and_texts(model.requests[3].messages) == [
        ("user", "hello there"),
        ("user", SUMMARY_HEAD + "THE SUMMARY"),
        ("user", "and again?"),
    ]
    assert roles_and_texts(model.requests[4].messages) == [
        ("user", "hello there"),
        ("user", SUMMARY_HEAD + "THE SUMMARY"),
        ("user", "and again?"),
        ("assistant", "calls ping"),
        ("tool", "done"),
    ]
    # the history and the messages keep everything
    assert kinds(done)[:before] == kinds(state)
    assert roles_and_texts(done.messages) == [
        ("user", "hello there"),
        ("assistant", "calls ping"),
        ("tool", "done"),
        ("assistant", "first answer"),
        ("user", "and again?"),
        ("assistant", "calls ping"),
        ("tool", "done"),
        ("assistant", "second answer"),
    ]
    assert len(done.context_messages) < len(done.messages)
    assert done.usage["input_tokens"] == 10 * 5, "the summary request's usage counts"


def test_compaction_survives_load(store: Store) -> None:
    model = ScriptedModel([call("ping"), "answer", "SUM", call("ping"), "later"], name="m")
    agent = Agent(model, name="c", tools=[ping], store=store)
    agent.run("hi", id="r")
    live = agent.compact("r")
    assert list(store.load("r").context_messages) == list(live.context_messages)
    state = store.load("r")
    state.add_message("more")
    live = agent.run(state)
    loaded = store.load("r")
    assert list(loaded.context_messages) == list(live.context_messages)
    assert roles_and_texts(loaded.context_messages)[:2] == [("user", "hi"), ("user", SUMMARY_HEAD + "SUM")]
    assert len(loaded.history) == len(live.history) and loaded.messages == live.messages


def test_compact_with_a_state_catches_the_state_up(store: Store) -> None:
    agent = Agent(ScriptedModel(["answer", "SUM"], name="m"), name="c", store=store)
    state = agent.run("hi", id="r")
    returned = agent.compact(state)
    assert kinds(state)[-1] == "compacted" and kinds(returned)[-1] == "compacted"
    assert roles_and_texts(state.context_messages) == [("user", "hi"), ("user", SUMMARY_HEAD + "SUM")]


def test_a_run_with_open_calls_is_not_compacted(store: Store) -> None:
    @tool(approval=True)
    def gated(ctx: ToolContext) -> str:
        """Needs approval."""
        return "ok"

    model = ScriptedModel([call("gated"), "SUM"], name="m")
    agent = Agent(model, name="c", tools=[gated], store=store)
    assert agent.run("hi", id="r").status == "waiting"
    length = len(store.read("r"))
    with pytest.raises(ValueError, match="compaction falls between turns"):
        agent.compact("r")
    assert len(model.requests) == 1, "no summary was asked"
    assert len(store.read("r")) == length and "compacted" not in kinds(store.load("r"))
    assert store.holder("r") is None, "the refused compaction let the run go"
    assert store.load("r").status == "waiting"


def _big_call(request: Any) -> ModelReply:
    return ModelReply(
        [{"type": "tool_call", "name": "ping", "args": {}, "provider_id": "t1"}],
        "tool_use",
        {"input_tokens": 600, "output_tokens": 10},
    )


def test_compact_at_compacts_automatically_before_a_request(store: Store) -> None:
    model = ScriptedModel([_big_call, "AUTO SUMMARY", "done"], name="m")
    agent = Agent(model, name="c", tools=[ping], store=store, compact_at=0.5, context_window=1000)
    state = agent.run("hello", id="r")
    assert state.status == "completed" and state.answer == "done"
    assert kinds(state)[3:] == [
        "model_replied",
        "tool_started",
        "tool_finished",
        "compacted",
        "model_replied",
        "run_stopped",
    ]
    assert state.history[6].summary == "AUTO SUMMARY"
    assert model.requests[1].tools == [], "request 1 is the summary request"
    assert roles_and_texts(model.requests[2].messages) == [
        ("user", "hello"),
        ("user", SUMMARY_HEAD + "AUTO SUMMARY"),
    ]
    assert list(store.load("r").context_messages) == list(state.context_messages)


def test_a_small_context_is_not_compacted(store: Store) -> None:
    model = ScriptedModel([call("ping"), "done"], name="m")  # 15 tokens a reply
    agent = Agent(model, name="c", tools=[ping], store=store, compact_at=0.5, context_window=1000)
    state = agent.run("hello")
    assert state.answer == "done" and "compacted" not in kinds(state)


def test_compact_at_needs_a_context_window() -> None:
    with pytest.raises(ValueError, match="context_window"):
        Agent(ScriptedModel([], name="unknown-model"), compact_at=0.8)
    with pytest.raises(ValueError, match="compact_at"):
        Agent(ScriptedModel([], name="m"), compact_at=1.5, context_window=1000)
    assert Agent(ScriptedModel([], name="claude-sonnet-4-5"), compact_at=0.8).context_window == 200_000


def test_the_context_after_compaction_is_what_the_resuming_process_sends(store: Store) -> None:
    first = Agent(ScriptedModel(["answer", "SUM"], name="m"), name="c", store=store)
    first.run("hi", id="r")
    first.compact("r")
    state = store.load("r")
    state.add_message(Message.user("next"))
    store.save(state)
    # another agent object (as another process would build) resumes from the journal alone
    model = ScriptedModel(["x", "y", "continued"], name="m")
    resumed = Agent(model, name="c", store=store).resume("r")
    assert resumed.answer == "continued"
    (request,) = model.requests
    assert request.index == 2
    assert roles_and_texts(request.messages) == [
        ("user", "hi"),
        ("user", SUMMARY_HEAD + "SUM"),
        ("user", "next"),
    ]


def test_a_failed_summary_request_leaves_a_completed_run_completed(store: Store) -> None:
    agent = Agent(
        ScriptedModel(["the answer", ModelError("invalid api key", retryable=False)], name="m"),
        name="c",
        store=store,
    )
    agent.run("hi", id="r")
    with pytest.raises(ModelError):
        agent.compact("r")
    state = store.load("r")
    assert state.status == "completed" and state.answer == "the answer"
    assert "compacted" not in kinds(state)


def test_a_retryable_failure_of_the_summary_request_is_retried(store: Store) -> None:
    model = ScriptedModel(["the answer", ModelError("overloaded", retryable=True), "SUM"], name="m")
    agent = Agent(model, name="c", store=store, retry_delay=0.01)
    agent.run("hi", id="r")
    state = agent.compact("r")
    assert kinds(state)[-1] == "compacted" and state.history[-1].summary == "SUM"
    assert state.status == "completed" and state.answer == "the answer"
    assert store.load("r").status == "completed"
