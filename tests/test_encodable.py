"""Strings no UTF-8 can encode (lone surrogates) and values no journal can hold: journaled or refused
clearly, never a crashed run (issue 13, item 2). The live State always equals what a load returns."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from tether import Agent, State, ToolContext, tool
from tether._encodable import REPLACEMENT, clean, journal_safe
from tether.errors import UnencodableError
from tether.messages import text_of
from tether.testing import ScriptedModel, call

ODD = "caf\udce9.txt"  # what os.listdir returns for the file name b"caf\xe9.txt" on a UTF-8 system
SHOWN = f"caf{REPLACEMENT}.txt"


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    where = tmp_path / "files"
    where.mkdir()
    with open(os.path.join(os.fsencode(where), b"caf\xe9.txt"), "wb") as file:  # a Latin-1 name: not UTF-8
        file.write(b"abc")
    assert os.listdir(where) == [ODD]
    return where


def results(state: State) -> dict[str, tuple[str, str]]:
    """Each call's outcome and result text, from the journal."""
    return {e.call_id: (e.outcome, text_of(e.content)) for e in state.history if e.kind == "tool_finished"}


def assert_same_as_loaded(state: State, store: Any) -> State:
    loaded = store.load(state.id)
    assert loaded.history == state.history
    assert loaded.messages == state.messages
    assert (loaded.answer, loaded.metadata, loaded.status) == (state.answer, state.metadata, state.status)
    return loaded


def test_clean_replaces_each_lone_surrogate_and_leaves_the_rest() -> None:
    value = {"k\ud800": [ODD, ("\udfff", 1)], "ok": "caf\u00e9 \U0001f600", "n": None}
    assert clean(value) == {
        f"k{REPLACEMENT}": [SHOWN, (REPLACEMENT, 1)],
        "ok": "caf\u00e9 \U0001f600",
        "n": None,
    }
    fields = {"content": [{"text": "plain"}]}
    assert journal_safe(fields, "x") is fields  # nothing to replace: the caller's objects are kept


def test_lone_surrogates_in_tool_results_errors_and_arguments_are_journaled_and_the_run_goes_on(
    store: Any, folder: Path
) -> None:
    seen: list[str] = []

    @tool(effect="read_only")
    def listing() -> str:
        """The folder's first file name (a str result)."""
        return os.listdir(folder)[0]

    @tool(effect="read_only")
    def details() -> dict[str, Any]:
        """Names nested in a dict result, as keys and in a list."""
        names = os.listdir(folder)
        return {"files": names, names[0]: {"size": 3}}

    @tool
    def open_file(name: str, ctx: ToolContext) -> str:
        """Raises with the name in its message."""
        seen.append(name)
        raise ValueError(f"cannot open {name}")

    model = ScriptedModel([[call("listing"), call("details")], call("open_file", name=ODD), f"found {ODD}"])
    agent = Agent(model, name="files", tools=[listing, details, open_file], store=store)
    state = agent.run(f"look in {ODD}", metadata={"dir": ODD})

    assert state.status == "completed"
    assert results(state) == {
        "c3_0": ("done", SHOWN),
        "c3_1": ("done", f'{{"files":["{SHOWN}"],"{SHOWN}":{{"size":3}}}}'),
        "c8_0": ("error", f"ValueError: cannot open {SHOWN}"),
    }
    assert seen == [SHOWN], "the tool gets the arguments as journaled, as a resumed run would"
    assert state.answer == f"found {SHOWN}"
    assert state.metadata == {"dir": SHOWN}
    assert state.messages[0].text == f"look in {SHOWN}"
    assert_same_as_loaded(state, store)
    assert [info.id for info in store.list(metadata={"dir": ODD})] == [state.id]  # the name as the OS gave it


def test_lone_surrogates_in_messages_decisions_and_reasons_posted_to_the_inbox_are_journaled(
    store: Any,
) -> None:
    @tool(approval=True)
    def remove(name: str) -> str:
        """Remove a file."""
        return f"removed {name}"

    script = [call("remove", name=ODD), "removed", f"and {ODD} again", "done"]
    agent = Agent(ScriptedModel(script), name="rm", tools=[remove], store=store)
    state = agent.run(f"remove {ODD}", id="odd-1")
    assert state.status == "waiting"
    state.approve("c3_0", by="b\udcf6b", reason=f"yes, {ODD}")
    store.save(state)  # posted to the inbox, then journaled by this short-lived taker
    decided = next(e for e in store.load("odd-1").history if e.kind == "approval_decided")
    assert (decided.by, decided.reason) == (f"b{REPLACEMENT}b", f"yes, {SHOWN}")

    state = agent.resume("odd-1")
    assert state.status == "completed" and results(state)["c3_0"] == ("done", f"removed {SHOWN}")
    state.add_message(f"and {ODD} too")
    store.save(state)
    state = agent.resume("odd-1")
    assert state.status == "completed"
    assert [m.text for m in state.messages if m.role == "user"][-1] == f"and {SHOWN} too"
    assert_same_as_loaded(state, store)

    again = agent.run(f"remove {ODD}", id="odd-1", if_exists="resume")  # the same first message
    assert again.id == "odd-1" and again.status == "completed"


def test_a_result_no_journal_can_hold_closes_the_call_with_a_truthful_error(store: Any) -> None:
    runs: list[int] = []

    @tool(effect="read_only")
    def count() -> list[dict[str, Any]]:
        """Returns a text block with an integer JSON cannot hold beside it."""
        runs.append(1)
        return [{"type": "text", "text": "many", "exact": 1 << 70}]

    agent = Agent(ScriptedModel([call("count"), "ok"]), name="count", tools=[count], store=store)
    state = agent.run("count")

    assert state.status == "completed"
    assert runs == [1], "the call ran once: no crash, no resume, no retry"
    outcome, text = results(state)["c3_0"]
    assert outcome == "error"
    assert "the tool ran, but its result cannot be journaled: Integer exceeds 64-bit range" in text
    assert "gave up" not in text and "cut off" not in text
    assert_same_as_loaded(state, store)


def test_a_model_reply_no_journal_can_hold_fails_the_run_with_the_reason(store: Any) -> None:
    @tool
    def charge(amount: int) -> str:
        """Charge an amount."""
        return "charged"

    agent = Agent(ScriptedModel([call("charge", amount=1 << 70)]), name="big", tools=[charge], store=store)
    with pytest.raises(UnencodableError, match="a model_replied entry cannot be journaled"):
        agent.run("charge it", id="big-1")
    loaded = store.load("big-1")
    assert loaded.status == "failed"
    assert "Integer exceeds 64-bit range" in (loaded.reason or "")
    assert [e.kind for e in loaded.history][-2:] == ["model_failed", "run_stopped"]


class Found(BaseModel):
    name: str
    count: int


def test_a_structured_output_holding_a_lone_surrogate_is_journaled_as_the_live_run_holds_it(
    store: Any,
) -> None:
    model = ScriptedModel([call("final_result", name=ODD, count=1)])
    state = Agent(model, name="typed", output_type=Found, store=store).run("find it")
    assert state.status == "completed"
    assert state.output == Found(name=SHOWN, count=1)
    loaded = assert_same_as_loaded(state, store)
    assert loaded.history[-1].output == {"name": SHOWN, "count": 1}


def test_a_structured_output_no_journal_can_hold_is_sent_back_to_the_model(store: Any) -> None:
    too_big = str(1 << 70)  # a string the schema's lax int accepts, and JSON's 64 bits cannot hold
    model = ScriptedModel(
        [call("final_result", name="a", count=too_big), call("final_result", name="a", count=2)]
    )
    state = Agent(model, name="typed", output_type=Found, store=store).run("count it")
    assert state.status == "completed" and state.output == Found(name="a", count=2)
    outcome, text = results(state)["c3_0"]
    assert outcome == "input_error"
    assert text.startswith("the final result cannot be journaled: Integer exceeds 64-bit range. Fix:")
    assert_same_as_loaded(state, store)


def test_a_reason_with_a_lone_surrogate_from_the_human_asked_in_process_is_journaled(store: Any) -> None:
    from tether import HumanDecision, ScriptedHuman

    @tool(approval=True)
    def remove(name: str) -> str:
        """Remove a file."""
        return "removed"

    human = ScriptedHuman([HumanDecision(False, by="b\udcf6b", reason=f"keep {ODD}")])
    agent = Agent(ScriptedModel([call("remove", name="x"), "kept"]), tools=[remove], store=store, human=human)
    state = agent.run("remove x")
    decided = next(e for e in state.history if e.kind == "approval_decided")
    assert (decided.by, decided.reason) == (f"b{REPLACEMENT}b", f"keep {SHOWN}")
    assert results(state)["c3_0"][0] == "denied" and SHOWN in results(state)["c3_0"][1]
    assert_same_as_loaded(state, store)
