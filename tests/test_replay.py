"""A loaded State is the State a live drive folded: every field, on every store (the load's fold is its own)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tether import (
    Agent,
    FileStore,
    HumanDecision,
    MemoryStore,
    ModelError,
    ScriptedHuman,
    SQLiteStore,
    State,
    Store,
    ToolContext,
    tool,
)
from tether import journal as j
from tether.testing import ScriptedModel, call

# Set by the driver or by a caller, not folded from the journal.
_NOT_FOLDED = {"_output_spec", "_typed_output"}


@tool(effect="read_only")
def look(n: int, ctx: ToolContext) -> str:
    """Look a number up.

    Args:
        n: The number.
    """
    if n < 0:
        raise ValueError("no negative numbers")
    return f"result {n}"


@tool(approval=True)
def send(to: str) -> str:
    """Send something.

    Args:
        to: The recipient.
    """
    return f"sent to {to}"


@pytest.fixture(params=["memory", "file", "sqlite"])
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    made: Store
    if request.param == "memory":
        made = MemoryStore()
    elif request.param == "file":
        made = FileStore(tmp_path / "runs")
    else:
        made = SQLiteStore(tmp_path / "runs.db")
    yield made
    made.close()


def fields(state: State) -> dict[str, Any]:
    return {name: value for name, value in vars(state).items() if name not in _NOT_FOLDED}


def assert_same(live: State, loaded: State) -> None:
    want, got = fields(live), fields(loaded)
    assert sorted(want) == sorted(got)
    for name in want:
        assert got[name] == want[name], f"{name} differs between the loaded State and the live one"
    assert loaded.history == live.history
    assert [e.seq for e in loaded.history] == list(range(len(live.history)))
    assert (loaded.status, loaded.answer, loaded.open_calls) == (live.status, live.answer, live.open_calls)
    assert list(loaded.context_messages) == list(live.context_messages)


def test_a_loaded_state_equals_the_live_one_field_by_field(any_store: Store) -> None:
    human = ScriptedHuman({"send": HumanDecision(True, "dana", "fine")})
    model = ScriptedModel(
        [
            [call("look", n=1), call("look", n=-1)],  # two calls a reply, one of them failing
            ModelError("overloaded", retryable=True),
            call("send", to="ann"),  # approved by a person
            call("look", n=2),
            "first answer",
            "THE SUMMARY",  # the compaction's request
            [call("look", n=3), call("look", n=4)],
            "second answer",
        ],
        name="m",
    )
    agent = Agent(model, name="a", tools=[look, send], store=any_store, human=human, poll_interval=0.01)
    live = agent.run("hello", id="r")
    assert live.status == "completed"
    assert_same(live, any_store.load("r"))

    live = agent.compact("r")
    assert_same(live, any_store.load("r"))

    loaded = any_store.load("r")
    loaded.add_message("and more")
    live = agent.run(loaded)
    assert live.status == "completed" and live.answer == "second answer"
    kinds = [e.kind for e in live.history]
    assert {"model_failed", "approval_decided", "compacted", "run_resumed"} <= set(kinds)
    assert_same(live, any_store.load("r"))
    again = State.replay("r", live.history)
    again.store_identity = live.store_identity  # a store's load sets it; a bare replay knows no store
    assert_same(live, again)


def test_a_waiting_run_and_a_stopped_one_that_reopened_load_as_folded() -> None:
    state = State(id="w")
    entries: list[j.Entry] = [
        j.RunStarted(seq=0, at=j.now_iso(), agent="a", root_id="w"),
        j.MessageAdded(seq=1, at=j.now_iso(), content=[{"type": "text", "text": "hi"}]),
        j.ModelReplied(seq=2, at=j.now_iso(), content=[{"type": "text", "text": "x"}]),
        j.RunStopped(seq=3, at=j.now_iso(), status="completed", answer="x"),
        j.RunResumed(seq=4, at=j.now_iso(), writer="w1", pid=1),
        j.MessageAdded(seq=5, at=j.now_iso(), content=[{"type": "text", "text": "more"}], inbox_seq=0),
        j.RunResumed(seq=6, at=j.now_iso(), writer="w1", pid=1),
        j.ModelReplied(
            seq=7,
            at=j.now_iso(),
            content=[{"type": "tool_call", "id": "c7_0", "name": "send", "args": {"to": "x"}}],
            usage={"input_tokens": 3, "output_tokens": True},
        ),
        j.ApprovalRequested(seq=8, at=j.now_iso(), call_id="c7_0", tool="send", args={"to": "x"}),
        j.RunReleased(seq=9, at=j.now_iso(), reason="waiting"),
        j.RunResumed(seq=10, at=j.now_iso(), writer="w2", pid=2),
    ]
    for entry in entries:
        state.apply(entry)
    loaded = State.replay("w", entries)
    assert_same(state, loaded)
    assert loaded.status == "waiting" and loaded.resumes_since_progress == 1 and loaded.requests == 2
