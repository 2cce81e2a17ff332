"""Structured output: ``output_type`` via a validated ``final_result`` tool (DESIGN 3, issue 5)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from tether import Agent, FileStore, MemoryStore, ModelRequest, State, Store, ToolContext, tool
from tether.output import OutputValidationError
from tether.testing import ScriptedModel, call

SRC = str(Path(__file__).resolve().parent.parent / "src")


class City(BaseModel):
    name: str
    population: int


@dataclasses.dataclass
class Point:
    x: int
    y: int


def entries(state: State, kind: str) -> list[Any]:
    return [e for e in state.history if e.kind == kind]


def text(entry: Any) -> str:
    return "".join(b.get("text", "") for b in entry.content if b.get("type") == "text")


def agent(store: Store | None, replies: list[Any], **kw: Any) -> Agent:
    return Agent(ScriptedModel(replies), name="out", store=store, **kw)


def test_a_valid_final_result_gives_a_typed_output_and_the_json_answer(store: Store) -> None:
    a = agent(store, [call("final_result", name="Oslo", population=700000)], output_type=City)
    state = a.run("which city?")
    assert state.status == "completed"
    assert isinstance(state.output, City) and state.output == City(name="Oslo", population=700000)
    assert state.answer is not None and json.loads(state.answer) == {"name": "Oslo", "population": 700000}
    (reply,) = entries(state, "model_replied")
    (block,) = [b for b in reply.content if b["type"] == "tool_call"]
    (finished,) = entries(state, "tool_finished")
    assert finished.call_id == block["id"] and finished.outcome == "done"
    assert entries(state, "tool_started") == [], "the output tool is never invoked"
    (stopped,) = entries(state, "run_stopped")
    assert stopped.output == {"name": "Oslo", "population": 700000}
    # the model was shown the output tool with the type's schema
    (request,) = a.model.requests  # type: ignore[attr-defined]
    (schema,) = [t for t in request.tools if t["name"] == "final_result"]
    assert set(schema["parameters"]["properties"]) == {"name", "population"}


def test_an_invalid_final_result_is_sent_back_then_a_valid_one_is_taken(store: Store) -> None:
    a = agent(
        store,
        [
            call("final_result", name="Oslo", population="lots"),
            call("final_result", name="Oslo", population=700000),
        ],
        output_type=City,
    )
    state = a.run("which city?")
    assert state.status == "completed" and state.output == City(name="Oslo", population=700000)
    first, second = entries(state, "tool_finished")
    assert first.outcome == "input_error" and "population" in text(first) and "final_result" in text(first)
    assert second.outcome == "done"
    # the model saw its error as the result of its call
    last = list(a.model.requests[1].messages)[-1]  # type: ignore[attr-defined]
    assert last.role == "tool"
    (result,) = last.content
    assert result["outcome"] == "input_error" and result["call_id"] == first.call_id


@pytest.mark.parametrize("retries", [0, 2])
def test_too_many_invalid_results_raise_output_validation_error(store: Store, retries: int) -> None:
    a = agent(store, [call("final_result", name=1)] * 10, output_type=City, output_retries=retries)
    with pytest.raises(OutputValidationError, match="final result") as info:
        a.run("which city?", id="bad")
    assert isinstance(info.value, ValueError)
    assert len(a.model.requests) == retries + 1  # type: ignore[attr-defined]
    state = store.load("bad")
    assert state.status == "failed" and "final result" in (state.reason or "")
    assert [e.outcome for e in entries(state, "tool_finished")] == ["input_error"] * (retries + 1)
    (stopped,) = entries(state, "run_stopped")
    assert stopped.status == "failed" and stopped.seq == len(state.history) - 1


def test_a_plain_text_reply_is_sent_back_asking_for_final_result(store: Store) -> None:
    a = agent(store, ["it is Oslo", call("final_result", name="Oslo", population=1)], output_type=City)
    state = a.run("which city?")
    assert state.status == "completed" and state.output == City(name="Oslo", population=1)
    told = list(a.model.requests[1].messages)[-1]  # type: ignore[attr-defined]
    assert told.role == "user" and "final_result" in told.text
    assert [e.kind for e in state.history].count("run_stopped") == 1


def test_a_dataclass_output(store: Store) -> None:
    state = agent(store, [call("final_result", x=1, y=2)], output_type=Point).run("where?")
    assert state.output == Point(1, 2) and isinstance(state.output, Point)
    assert json.loads(state.answer or "") == {"x": 1, "y": 2}
    assert isinstance(store.load(state.id).output, Point)


def test_a_list_output_is_wrapped_as_result(store: Store) -> None:
    a = agent(
        store,
        [call("final_result", result=[1, "x"]), call("final_result", result=[3, 1, 2])],
        output_type=list[int],
    )
    state = a.run("numbers?")
    assert state.output == [3, 1, 2] and state.answer == "[3,1,2]"
    (schema,) = [t for t in a.model.requests[0].tools if t["name"] == "final_result"]  # type: ignore[attr-defined]
    assert schema["parameters"]["required"] == ["result"]
    assert [e.outcome for e in entries(state, "tool_finished")] == ["input_error", "done"]
    assert store.load(state.id).output == [3, 1, 2]


def test_output_type_per_run(store: Store) -> None:
    def reply(request: ModelRequest) -> Any:
        if any(t["name"] == "final_result" for t in request.tools):
            return call("final_result", name="Oslo", population=5)
        return "plain text"

    a = Agent(ScriptedModel([reply]), name="out", store=store)
    typed = a.run("which city?", output_type=City)
    assert typed.output == City(name="Oslo", population=5)
    assert store.load(typed.id).output == City(name="Oslo", population=5)
    plain = a.run("and now?")  # the agent itself has no output type: the next run answers in text
    assert plain.status == "completed" and plain.answer == "plain text" and plain.output == "plain text"


def test_the_typed_output_survives_load_in_the_same_process(store: Store) -> None:
    state = agent(store, [call("final_result", name="Oslo", population=5)], output_type=City).run("city?")
    loaded = store.load(state.id)
    assert isinstance(loaded.output, City) and loaded.output == state.output
    assert loaded.answer == state.answer


def test_other_calls_of_the_final_reply_are_not_run(store: Store) -> None:
    ran: list[str] = []

    @tool
    def lookup(name: str, ctx: ToolContext) -> str:
        """Look up.

        Args:
            name: The name.
        """
        ran.append(ctx.call_id)
        return "found"

    a = agent(
        store,
        [[call("lookup", name="a"), call("final_result", name="Oslo", population=5)]],
        output_type=City,
        tools=[lookup],
    )
    state = a.run("city?")
    assert state.status == "completed" and state.output == City(name="Oslo", population=5)
    assert ran == []
    outcomes = {e.call_id: e.outcome for e in entries(state, "tool_finished")}
    assert outcomes == {"c3_0": "cancelled", "c3_1": "done"}


def test_a_second_final_result_in_one_reply_is_an_input_error(store: Store) -> None:
    a = agent(
        store,
        [[call("final_result", name="A", population=1), call("final_result", name="B", population=2)]],
        output_type=City,
    )
    state = a.run("city?")
    assert state.output == City(name="A", population=1)
    outcomes = {e.call_id: e.outcome for e in entries(state, "tool_finished")}
    assert outcomes == {"c3_0": "done", "c3_1": "input_error"}


def test_a_per_run_output_type_survives_a_resume() -> None:
    store = MemoryStore()

    @tool(approval=True)
    def check(ctx: ToolContext) -> str:
        """Check something (needs approval)."""
        return "checked"

    model = ScriptedModel([call("check"), call("final_result", name="Oslo", population=5)])
    a = Agent(model, name="out", store=store, tools=[check])
    state = a.run("city?", id="r", output_type=City)
    assert state.status == "waiting"
    state.approve("c3_0")
    store.save(state)
    done = a.resume("r")
    assert [t["name"] for t in model.requests[-1].tools] == ["check", "final_result"]
    assert done.status == "completed" and done.output == City(name="Oslo", population=5)


# --------------------------------------------------------------------------------------------------
# A fresh process: the journal names a module, which is never imported because of it

TYPE_MODULE = textwrap.dedent(
    """
    import os
    from pydantic import BaseModel

    with open(os.environ["IMPORT_MARKER"], "a") as f:
        f.write(f"imported in {os.getpid()}\\n")

    class Report(BaseModel):
        title: str
        score: int
    """
)

WRITER = textwrap.dedent(
    """
    import sys
    from tether import Agent, FileStore
    from tether.testing import ScriptedModel, call
    from outmod_tether_test import Report

    store = FileStore(sys.argv[1])
    a = Agent(ScriptedModel([call("final_result", title="t", score=3)]), name="out", store=store,
              output_type=Report)
    state = a.run("report?", id="typed")
    assert isinstance(state.output, Report), state.output
    assert isinstance(store.load("typed").output, Report)
    """
)

READER = textwrap.dedent(
    """
    import json, sys
    from tether import FileStore

    store = FileStore(sys.argv[1])
    state = store.load("typed")
    first = state.output
    imported_after_load = "outmod_tether_test" in sys.modules
    import outmod_tether_test
    again = store.load("typed").output
    print(json.dumps({
        "first": first,
        "first_type": type(first).__name__,
        "imported_after_load": imported_after_load,
        "again_type": type(again).__name__,
        "again_is_report": isinstance(again, outmod_tether_test.Report),
        "answer": state.answer,
    }))
    """
)


def test_a_fresh_process_gets_json_and_never_imports_the_journal_named_module(tmp_path: Path) -> None:
    (tmp_path / "outmod_tether_test.py").write_text(TYPE_MODULE)
    marker = tmp_path / "imports.txt"
    env = {"PYTHONPATH": f"{SRC}:{tmp_path}", "IMPORT_MARKER": str(marker), "PATH": "/usr/bin:/bin"}
    runs = str(tmp_path / "runs")
    wrote = subprocess.run(
        [sys.executable, "-c", WRITER, runs], env=env, capture_output=True, timeout=60, check=False
    )
    assert wrote.returncode == 0, wrote.stderr.decode()[-3000:]
    assert len(marker.read_text().splitlines()) == 1
    (stopped,) = [e for e in FileStore(runs).read("typed") if e.kind == "run_stopped"]
    assert stopped.output_type == "outmod_tether_test:Report", "the journal names the type"

    read = subprocess.run(
        [sys.executable, "-c", READER, runs], env=env, capture_output=True, timeout=60, check=False
    )
    assert read.returncode == 0, read.stderr.decode()[-3000:]
    seen = json.loads(read.stdout)
    assert seen["first"] == {"title": "t", "score": 3} and seen["first_type"] == "dict"
    assert seen["imported_after_load"] is False, "load imported the module the journal names"
    assert json.loads(seen["answer"]) == {"title": "t", "score": 3}
    # once the program itself imports the type, the output is typed again
    assert seen["again_is_report"] is True and seen["again_type"] == "Report"
    assert len(marker.read_text().splitlines()) == 2  # the writer's import and the reader's own
