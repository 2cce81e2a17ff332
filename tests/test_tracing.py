"""Tracing: one OpenTelemetry trace per run, across crashes and processes (DESIGN 15; issue 16).

Spans are read from the SDK's InMemorySpanExporter; the crash test kills a real process with SIGKILL and
resumes the run in a new one, both exporting to a file, and finds one trace id in it.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import tether
from tether import Agent, FileStore, MemoryStore, ModelError, ScriptedHuman, Store, ToolContext, tool
from tether import journal as j
from tether import tracing as t
from tether.testing import ScriptedModel, call
from tether.tracing import InstrumentSettings

SRC = str(Path(__file__).resolve().parent.parent / "src")

CONTENT_KEYS = {
    t.GEN_AI_SYSTEM_INSTRUCTIONS,
    t.GEN_AI_INPUT_MESSAGES,
    t.GEN_AI_OUTPUT_MESSAGES,
    t.GEN_AI_TOOL_CALL_ARGUMENTS,
    t.GEN_AI_TOOL_CALL_RESULT,
    t.TETHER_RUN_ANSWER,
    t.TETHER_APPROVAL_REASON,
}

# The process's global tracer provider can be set once; the tests that use it read this exporter.
GLOBAL_EXPORTER = InMemorySpanExporter()
_global = TracerProvider()
_global.add_span_processor(SimpleSpanProcessor(GLOBAL_EXPORTER))
trace.set_tracer_provider(_global)


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    made = InMemorySpanExporter()
    yield made
    made.clear()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> TracerProvider:
    made = TracerProvider()
    made.add_span_processor(SimpleSpanProcessor(exporter))
    return made


@pytest.fixture(autouse=True)
def no_process_setting() -> Iterator[None]:
    GLOBAL_EXPORTER.clear()
    yield
    tether.tracing.uninstrument()
    GLOBAL_EXPORTER.clear()


@tool(effect="read_only")
def weather(city: str) -> str:
    """Get the weather.

    Args:
        city: The city.
    """
    return f"sunny in {city}"


@tool
def explode(reason: str) -> str:
    """Fail.

    Args:
        reason: Why.
    """
    raise ValueError(f"exploded: {reason}")


@tool(approval=True)
def send(to: str) -> str:
    """Send a message (needs approval).

    Args:
        to: The recipient.
    """
    return f"sent to {to}"


def traced(provider: TracerProvider, *, content: bool = False) -> InstrumentSettings:
    return InstrumentSettings(tracer_provider=provider, include_content=content)


def by_name(spans: tuple[ReadableSpan, ...] | list[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


def one(spans: tuple[ReadableSpan, ...] | list[ReadableSpan], name: str) -> ReadableSpan:
    found = by_name(spans, name)
    assert len(found) == 1, [s.name for s in spans]
    return found[0]


def parent_of(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def tree(spans: tuple[ReadableSpan, ...] | list[ReadableSpan]) -> list[str]:
    """The spans as indented names, children in start order."""
    ids = {s.context.span_id for s in spans}
    out: list[str] = []

    def walk(span: ReadableSpan, depth: int) -> None:
        out.append("  " * depth + span.name)
        for child in sorted(spans, key=lambda s: s.start_time or 0):
            if parent_of(child) == span.context.span_id:
                walk(child, depth + 1)

    for root in sorted(spans, key=lambda s: s.start_time or 0):
        if parent_of(root) not in ids:
            walk(root, 0)
    return out


def keys_of(span: ReadableSpan) -> set[str]:
    keys = set(span.attributes or {})
    for event in span.events:
        keys |= set(event.attributes or {})
    return keys


def traceparent(state: Any) -> str | None:
    first = state.history[0]
    assert isinstance(first, j.RunStarted)
    return first.traceparent


# --------------------------------------------------------------------------------------------------
# Span names, parentage, attributes


def test_a_run_with_parallel_tools_and_a_failing_tool(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    replies = [[call("weather", city="Paris"), call("explode", reason="no")], "done"]
    agent = Agent(
        ScriptedModel(replies),
        name="planner",
        description="Plans trips.",
        tools=[weather, explode],
        store=MemoryStore(),
        instrument=traced(provider),
    )
    state = agent.run("plan")
    assert state.status == "completed"
    spans = exporter.get_finished_spans()
    assert tree(spans) == [
        "invoke_agent planner",
        "  chat scripted",
        "  execute_tool weather",
        "  execute_tool explode",
        "  chat scripted",
    ] or tree(spans) == [
        "invoke_agent planner",
        "  chat scripted",
        "  execute_tool explode",
        "  execute_tool weather",
        "  chat scripted",
    ]
    assert len({s.context.trace_id for s in spans}) == 1

    drive = one(spans, "invoke_agent planner")
    assert drive.kind is SpanKind.INTERNAL
    assert drive.parent is None  # a new root: the run's first drive
    attrs = drive.attributes or {}
    assert attrs[t.GEN_AI_OPERATION_NAME] == "invoke_agent"
    assert attrs[t.GEN_AI_AGENT_NAME] == "planner"
    assert attrs[t.GEN_AI_AGENT_DESCRIPTION] == "Plans trips."
    assert attrs[t.GEN_AI_CONVERSATION_ID] == state.id
    assert attrs[t.TETHER_RUN_ID] == state.id
    assert attrs[t.GEN_AI_REQUEST_MODEL] == "scripted"
    assert attrs[t.TETHER_RUN_STATUS] == "completed"
    assert drive.status.status_code is StatusCode.UNSET
    assert [e.name for e in drive.events] == [t.EVENT_RUN_STOPPED]
    assert (drive.events[0].attributes or {})[t.TETHER_RUN_STATUS] == "completed"
    # run_started recorded the drive's own span: the trace of every later drive
    span_context = drive.context
    assert (
        traceparent(state)
        == f"00-{span_context.trace_id:032x}-{span_context.span_id:016x}-{span_context.trace_flags:02x}"
    )

    chats = by_name(spans, "chat scripted")
    assert [(c.attributes or {})[t.TETHER_REQUEST_INDEX] for c in chats] == [0, 1]
    for chat in chats:
        assert chat.kind is SpanKind.CLIENT
        assert parent_of(chat) == drive.context.span_id
        attrs = chat.attributes or {}
        assert attrs[t.GEN_AI_OPERATION_NAME] == "chat"
        assert attrs[t.GEN_AI_PROVIDER_NAME] == "tether.scripted"
        assert attrs[t.GEN_AI_REQUEST_MODEL] == "scripted"
        assert attrs[t.GEN_AI_CONVERSATION_ID] == state.id
    assert (chats[0].attributes or {})[t.GEN_AI_RESPONSE_FINISH_REASONS] == ("tool_use",)

    ok = one(spans, "execute_tool weather")
    assert parent_of(ok) == drive.context.span_id
    attrs = ok.attributes or {}
    assert attrs[t.GEN_AI_OPERATION_NAME] == "execute_tool"
    assert attrs[t.GEN_AI_TOOL_NAME] == "weather"
    assert attrs[t.GEN_AI_TOOL_CALL_ID] == "c3_0"
    assert attrs[t.TETHER_TOOL_EFFECT] == "read_only"
    assert attrs[t.TETHER_TOOL_ATTEMPT] == 1
    assert attrs[t.TETHER_TOOL_IDEMPOTENCY_KEY] == f"tether:{state.id}:c3_0"
    assert attrs[t.TETHER_TOOL_OUTCOME] == "done"
    assert ok.status.status_code is StatusCode.UNSET

    failed = one(spans, "execute_tool explode")
    attrs = failed.attributes or {}
    assert attrs[t.GEN_AI_TOOL_CALL_ID] == "c3_1"
    assert attrs[t.TETHER_TOOL_EFFECT] == "unsafe"
    assert attrs[t.TETHER_TOOL_OUTCOME] == "error"
    assert attrs[t.ERROR_TYPE] == "ValueError"
    assert failed.status.status_code is StatusCode.ERROR
    assert [e.name for e in failed.events] == ["exception"]
    # the two calls ran together: each span began before the other ended
    assert (ok.start_time or 0) < (failed.end_time or 0) and (failed.start_time or 0) < (ok.end_time or 0)


def test_a_retried_model_error_is_an_error_chat_span_then_a_good_one(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    model = ScriptedModel([ModelError("overloaded", retryable=True), "fine"])
    agent = Agent(model, store=MemoryStore(), retry_delay=0.001, instrument=traced(provider))
    state = agent.run("hi")
    assert state.answer == "fine"
    spans = exporter.get_finished_spans()
    assert tree(spans) == ["invoke_agent agent", "  chat scripted", "  chat scripted"]
    failed, good = by_name(spans, "chat scripted")
    assert (failed.attributes or {})[t.TETHER_REQUEST_INDEX] == 0
    assert (failed.attributes or {})[t.ERROR_TYPE] == "ModelError"
    assert (failed.attributes or {})[t.TETHER_REQUEST_RETRYABLE] is True
    assert failed.status.status_code is StatusCode.ERROR
    assert (good.attributes or {})[t.TETHER_REQUEST_INDEX] == 1
    assert good.status.status_code is StatusCode.UNSET
    assert one(spans, "invoke_agent agent").status.status_code is StatusCode.UNSET


def test_a_model_error_that_fails_the_run_fails_the_drive_span(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    agent = Agent(ScriptedModel([ModelError("bad key")]), store=MemoryStore(), instrument=traced(provider))
    with pytest.raises(ModelError):
        agent.run("hi")
    drive = one(exporter.get_finished_spans(), "invoke_agent agent")
    assert drive.status.status_code is StatusCode.ERROR
    assert (drive.attributes or {})[t.ERROR_TYPE] == "ModelError"
    assert (drive.attributes or {})[t.TETHER_RUN_STATUS] == "failed"
    stopped = [e for e in drive.events if e.name == t.EVENT_RUN_STOPPED]
    assert (stopped[0].attributes or {})[t.TETHER_RUN_STATUS] == "failed"


def test_usage_of_a_request_and_of_a_drive(provider: TracerProvider, exporter: InMemorySpanExporter) -> None:
    def reply(request: Any) -> Any:
        from tether import ModelReply

        return ModelReply(
            [{"type": "text", "text": "ok"}],
            stop_reason="end_turn",
            usage={"input_tokens": 11, "output_tokens": 3},
            model="scripted-1",
        )

    agent = Agent(ScriptedModel([reply]), store=MemoryStore(), instrument=traced(provider))
    agent.run("hi")
    spans = exporter.get_finished_spans()
    chat = one(spans, "chat scripted")
    attrs = chat.attributes or {}
    assert attrs[t.GEN_AI_USAGE_INPUT_TOKENS] == 11
    assert attrs[t.GEN_AI_USAGE_OUTPUT_TOKENS] == 3
    assert attrs[t.GEN_AI_RESPONSE_MODEL] == "scripted-1"
    assert attrs[t.GEN_AI_RESPONSE_FINISH_REASONS] == ("end_turn",)
    drive = one(spans, "invoke_agent agent").attributes or {}
    assert drive[t.GEN_AI_USAGE_INPUT_TOKENS] == 11 and drive[t.GEN_AI_USAGE_OUTPUT_TOKENS] == 3


def test_the_genai_client_metrics(provider: TracerProvider) -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from tether import ModelReply

    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    reply = ModelReply([{"type": "text", "text": "ok"}], usage={"input_tokens": 7, "output_tokens": 2})
    settings = InstrumentSettings(tracer_provider=provider, meter_provider=meters)
    Agent(ScriptedModel([lambda request: reply]), store=MemoryStore(), instrument=settings).run("hi")
    found: dict[str, Any] = {}
    for resource in reader.get_metrics_data().resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                found[metric.name] = metric.data.data_points
    assert set(found) == {t.METRIC_TOKEN_USAGE, t.METRIC_OPERATION_DURATION}
    tokens = {p.attributes[t.GEN_AI_TOKEN_TYPE]: p.sum for p in found[t.METRIC_TOKEN_USAGE]}
    assert tokens == {"input": 7, "output": 2}
    (duration,) = found[t.METRIC_OPERATION_DURATION]
    assert duration.count == 1
    assert duration.attributes[t.GEN_AI_OPERATION_NAME] == "chat"
    meters.shutdown()


def test_an_approval_is_two_events_on_the_drive_span(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    human = ScriptedHuman({"send": True}, by="alice")
    agent = Agent(
        ScriptedModel([call("send", to="bob"), "sent"]),
        tools=[send],
        human=human,
        store=MemoryStore(),
        instrument=traced(provider),
    )
    state = agent.run("send it")
    assert state.status == "completed"
    spans = exporter.get_finished_spans()
    drive = one(spans, "invoke_agent agent")
    names = [e.name for e in drive.events]
    assert names == [t.EVENT_APPROVAL_REQUESTED, t.EVENT_APPROVAL_DECIDED, t.EVENT_RUN_STOPPED]
    requested = drive.events[0].attributes or {}
    assert requested[t.TETHER_CALL_ID] == "c3_0"
    assert requested[t.TETHER_TOOL_NAME] == "send"
    decided = drive.events[1].attributes or {}
    assert decided[t.TETHER_CALL_ID] == "c3_0"
    assert decided[t.TETHER_APPROVAL_APPROVED] is True
    assert decided[t.TETHER_APPROVAL_BY] == "alice"
    assert parent_of(one(spans, "execute_tool send")) == drive.context.span_id


def test_a_decision_from_the_inbox_resumes_the_run_in_its_own_trace_linking_the_caller(
    provider: TracerProvider, exporter: InMemorySpanExporter, tmp_path: Path
) -> None:
    store = FileStore(tmp_path / "runs")
    agent = Agent(
        ScriptedModel([call("send", to="bob"), "sent"]),
        tools=[send],
        store=store,
        instrument=traced(provider),
    )
    waiting = agent.run("send it")
    assert waiting.status == "waiting"
    first = one(exporter.get_finished_spans(), "invoke_agent agent")
    assert [e.name for e in first.events] == [t.EVENT_APPROVAL_REQUESTED]
    exporter.clear()

    store.post(waiting.id, {"type": "decision", "call_id": "c3_0", "approved": True, "by": "carol"})
    caller = provider.get_tracer("app")
    with caller.start_as_current_span("nightly job") as job:
        state = agent.resume(waiting.id)
    assert state.status == "completed"
    spans = [s for s in exporter.get_finished_spans() if s.name != "nightly job"]
    second = one(spans, "invoke_agent agent")
    # in the run's trace, under the span run_started recorded; the resuming caller's span is a link
    assert second.context.trace_id == first.context.trace_id
    assert parent_of(second) == first.context.span_id
    assert [link.context.span_id for link in second.links] == [job.get_span_context().span_id]
    assert {s.context.trace_id for s in spans} == {first.context.trace_id}
    # the taker's decisions as it makes them; journaled entries once their append returned
    names = [e.name for e in second.events]
    assert names == [
        t.EVENT_RECOVERED,
        t.EVENT_INBOX_CONSUMED,
        t.EVENT_APPROVAL_DECIDED,
        t.EVENT_RUN_STOPPED,
    ]
    consumed = second.events[1].attributes or {}
    assert consumed[t.TETHER_INBOX_TYPE] == "decision"
    assert (second.events[2].attributes or {})[t.TETHER_APPROVAL_BY] == "carol"
    recovered = second.events[0].attributes or {}
    assert recovered[t.TETHER_CALL_ID] == "c3_0"
    assert recovered[t.TETHER_TOOL_NAME] == "send"
    assert recovered[t.TETHER_RECOVERY_ACTION] == "run"
    store.close()


def test_a_pending_approval_found_at_a_resume_is_recovered_as_wait(
    provider: TracerProvider, exporter: InMemorySpanExporter, tmp_path: Path
) -> None:
    store = FileStore(tmp_path / "runs")
    agent = Agent(
        ScriptedModel([[call("send", to="bob"), call("send", to="eve")], "done"]),
        tools=[send],
        store=store,
        instrument=traced(provider),
    )
    waiting = agent.run("go")
    assert waiting.status == "waiting"
    exporter.clear()
    store.post(waiting.id, {"type": "decision", "call_id": "c3_1", "approved": True, "by": "carol"})
    assert agent.resume(waiting.id).status == "waiting"
    drive = one(exporter.get_finished_spans(), "invoke_agent agent")
    recovered = [e.attributes or {} for e in drive.events if e.name == t.EVENT_RECOVERED]
    assert [(r[t.TETHER_CALL_ID], r[t.TETHER_RECOVERY_ACTION]) for r in recovered] == [
        ("c3_0", "wait"),
        ("c3_1", "run"),
    ]
    store.close()


def test_a_subagent_nests_under_its_parent_s_execute_tool_span(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    store = MemoryStore()
    helper = Agent(
        ScriptedModel([call("weather", city="Rome"), "Rome is sunny"]),
        name="helper",
        description="Looks things up.",
        tools=[weather],
        store=store,
    )  # no setting of its own: it traces with its parent's drive
    agent = Agent(
        ScriptedModel([call("helper", prompt="Rome?"), "done"]),
        name="boss",
        tools=[helper],
        store=store,
        instrument=traced(provider),
    )
    state = agent.run("go")
    assert state.status == "completed"
    spans = exporter.get_finished_spans()
    assert tree(spans) == [
        "invoke_agent boss",
        "  chat scripted",
        "  execute_tool helper",
        "    invoke_agent helper",
        "      chat scripted",
        "      execute_tool weather",
        "      chat scripted",
        "  chat scripted",
    ]
    assert len({s.context.trace_id for s in spans}) == 1
    call_span = one(spans, "execute_tool helper")
    assert (call_span.attributes or {})[t.TETHER_TOOL_EFFECT] == "resumable"
    child = one(spans, "invoke_agent helper")
    attrs = child.attributes or {}
    child_id = attrs[t.TETHER_RUN_ID]
    assert attrs[t.TETHER_RUN_PARENT_ID] == state.id
    assert attrs[t.TETHER_RUN_ROOT_ID] == state.id
    ctx = call_span.context
    assert (
        traceparent(store.load(str(child_id)))
        == f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}"
    )


def test_a_subagent_set_to_false_stays_dark(provider: TracerProvider, exporter: InMemorySpanExporter) -> None:
    store = MemoryStore()
    helper = Agent(ScriptedModel(["ok"]), name="helper", description="Helps.", store=store, instrument=False)
    agent = Agent(
        ScriptedModel([call("helper", prompt="x"), "done"]),
        tools=[helper],
        store=store,
        instrument=traced(provider),
    )
    agent.run("go")
    assert "invoke_agent helper" not in tree(exporter.get_finished_spans())


def test_a_tool_s_own_spans_nest_under_its_execute_tool_span(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    app = provider.get_tracer("app")

    @tool(effect="read_only")
    def lookup(key: str) -> str:
        """Look up.

        Args:
            key: The key.
        """
        with app.start_as_current_span("db query"):
            return key

    @tool(effect="read_only")
    async def alookup(key: str) -> str:
        """Look up, async.

        Args:
            key: The key.
        """
        with app.start_as_current_span("http get"):
            await asyncio.sleep(0)
            return key

    agent = Agent(
        ScriptedModel([[call("lookup", key="a"), call("alookup", key="b")], call("lookup", key="c"), "done"]),
        tools=[lookup, alookup],
        store=MemoryStore(),
        instrument=traced(provider),
    )
    agent.run("go")
    spans = exporter.get_finished_spans()
    tools = {s.context.span_id: s for s in spans if s.name.startswith("execute_tool")}
    for name, tool_name in (("db query", "execute_tool lookup"), ("http get", "execute_tool alookup")):
        for inner in by_name(spans, name):
            assert tools[parent_of(inner) or 0].name == tool_name
    assert len(by_name(spans, "db query")) == 2


def test_a_timed_out_attempt_and_its_retry_are_two_spans(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    calls: list[int] = []

    @tool(effect="idempotent", timeout=0.2, max_attempts=3)
    def slow(ctx: ToolContext) -> str:
        """Slow the first time."""
        calls.append(ctx.attempt)
        if len(calls) == 1:
            time.sleep(0.5)
        return "ok"

    agent = Agent(
        ScriptedModel([call("slow"), "done"]), tools=[slow], store=MemoryStore(), instrument=traced(provider)
    )
    assert agent.run("go").status == "completed"
    first, second = by_name(exporter.get_finished_spans(), "execute_tool slow")
    assert (first.attributes or {})[t.TETHER_TOOL_ATTEMPT] == 1
    assert (first.attributes or {})[t.ERROR_TYPE] == "TimeoutError"
    assert first.status.status_code is StatusCode.ERROR
    assert (second.attributes or {})[t.TETHER_TOOL_ATTEMPT] == 2
    assert (second.attributes or {})[t.TETHER_TOOL_OUTCOME] == "done"


# --------------------------------------------------------------------------------------------------
# Content


def content_run(provider: TracerProvider, content: bool) -> None:
    human = ScriptedHuman({"send": tether.HumanDecision(True, by="alice", reason="fine by me")})
    agent = Agent(
        ScriptedModel([[call("weather", city="Paris"), call("send", to="bob")], "The answer"]),
        instructions="Be brief.",
        tools=[weather, send],
        human=human,
        store=MemoryStore(),
        instrument=traced(provider, content=content),
    )
    agent.run("secret question")


def test_no_content_by_default(provider: TracerProvider, exporter: InMemorySpanExporter) -> None:
    content_run(provider, content=False)
    spans = exporter.get_finished_spans()
    assert len(spans) == 5
    for span in spans:
        assert not keys_of(span) & CONTENT_KEYS, span.name
        text = orjson.dumps([dict(span.attributes or {}), [dict(e.attributes or {}) for e in span.events]])
        assert b"secret question" not in text and b"Paris" not in text and b"The answer" not in text


def test_content_with_include_content(provider: TracerProvider, exporter: InMemorySpanExporter) -> None:
    content_run(provider, content=True)
    spans = exporter.get_finished_spans()
    first_chat = by_name(spans, "chat scripted")[0].attributes or {}
    assert orjson.loads(str(first_chat[t.GEN_AI_SYSTEM_INSTRUCTIONS])) == [
        {"type": "text", "content": "Be brief."}
    ]
    assert orjson.loads(str(first_chat[t.GEN_AI_INPUT_MESSAGES])) == [
        {"role": "user", "parts": [{"type": "text", "content": "secret question"}]}
    ]
    output = orjson.loads(str(first_chat[t.GEN_AI_OUTPUT_MESSAGES]))
    assert output[0]["role"] == "assistant"
    assert output[0]["parts"][0] == {
        "type": "tool_call",
        "id": "c3_0",
        "name": "weather",
        "arguments": {"city": "Paris"},
    }
    second_chat = by_name(spans, "chat scripted")[1].attributes or {}
    sent = orjson.loads(str(second_chat[t.GEN_AI_INPUT_MESSAGES]))
    assert sent[-1]["role"] == "tool"
    assert sent[-1]["parts"][0] == {"type": "tool_call_response", "id": "c3_0", "response": "sunny in Paris"}
    tool_span = one(spans, "execute_tool weather").attributes or {}
    assert orjson.loads(str(tool_span[t.GEN_AI_TOOL_CALL_ARGUMENTS])) == {"city": "Paris"}
    assert tool_span[t.GEN_AI_TOOL_CALL_RESULT] == "sunny in Paris"
    drive = one(spans, "invoke_agent agent")
    events = {e.name: e.attributes or {} for e in drive.events}
    assert events[t.EVENT_RUN_STOPPED][t.TETHER_RUN_ANSWER] == "The answer"
    assert events[t.EVENT_APPROVAL_DECIDED][t.TETHER_APPROVAL_REASON] == "fine by me"
    assert orjson.loads(str(events[t.EVENT_APPROVAL_REQUESTED][t.GEN_AI_TOOL_CALL_ARGUMENTS])) == {
        "to": "bob"
    }


# --------------------------------------------------------------------------------------------------
# Which agents are traced


def test_no_spans_without_a_setting_even_with_a_global_provider() -> None:
    state = Agent(ScriptedModel(["hi"]), store=MemoryStore()).run("hello")
    assert GLOBAL_EXPORTER.get_finished_spans() == ()
    assert traceparent(state) is None


def test_instrument_true_uses_the_global_provider() -> None:
    Agent(ScriptedModel(["hi"]), store=MemoryStore(), instrument=True).run("hello")
    assert tree(GLOBAL_EXPORTER.get_finished_spans()) == ["invoke_agent agent", "  chat scripted"]


def test_tether_instrument_traces_every_agent_and_an_agent_s_own_setting_wins(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    tether.instrument(tracer_provider=provider)
    Agent(ScriptedModel(["hi"]), name="plain", store=MemoryStore()).run("hello")
    Agent(ScriptedModel(["hi"]), name="dark", store=MemoryStore(), instrument=False).run("hello")
    Agent(ScriptedModel(["hi"]), name="own", store=MemoryStore(), instrument=True).run("hello")
    assert [s.name for s in exporter.get_finished_spans() if s.name.startswith("invoke")] == [
        "invoke_agent plain"
    ]
    assert [s.name for s in GLOBAL_EXPORTER.get_finished_spans() if s.name.startswith("invoke")] == [
        "invoke_agent own"
    ]
    tether.tracing.uninstrument()
    Agent(ScriptedModel(["hi"]), name="after", store=MemoryStore()).run("hello")
    assert "invoke_agent after" not in [s.name for s in exporter.get_finished_spans()]


def test_a_provider_that_records_nothing_costs_no_spans_and_no_traceparent() -> None:
    agent = Agent(
        ScriptedModel([call("weather", city="Oslo"), "ok"]),
        tools=[weather],
        store=MemoryStore(),
        instrument=InstrumentSettings(tracer_provider=trace.NoOpTracerProvider()),
    )
    state = agent.run("go")
    assert state.status == "completed"
    assert traceparent(state) is None


def test_compaction_is_a_drive_with_a_chat_span_of_its_own(
    provider: TracerProvider, exporter: InMemorySpanExporter, tmp_path: Path
) -> None:
    store = FileStore(tmp_path / "runs")
    agent = Agent(ScriptedModel(["first answer", "the summary"]), store=store, instrument=traced(provider))
    agent.run("hello", id="r")
    exporter.clear()
    agent.compact("r")
    spans = exporter.get_finished_spans()
    assert tree(spans) == ["invoke_agent agent", "  chat scripted"]
    chat = one(spans, "chat scripted").attributes or {}
    assert chat[t.TETHER_REQUEST_PURPOSE] == "compaction"
    assert chat[t.TETHER_REQUEST_INDEX] == 1
    store.close()


def test_tracing_without_the_otel_extra_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name.startswith("opentelemetry") else real(name, *a),
    )
    with pytest.raises(ImportError, match=r"Fix: pip install 'tether\[otel\]'"):
        Agent(ScriptedModel(["hi"]), instrument=True)
    with pytest.raises(ImportError, match="OpenTelemetry API"):
        tether.instrument()
    Agent(ScriptedModel(["hi"]), instrument=False)  # needs nothing


def test_a_bad_setting_is_refused() -> None:
    with pytest.raises(TypeError, match="Fix: pass True, False, or"):
        Agent(ScriptedModel(["hi"]), instrument="yes")  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------------
# One trace per run


def test_the_sync_face_sees_the_caller_s_active_span(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    agent = Agent(ScriptedModel(["one", "two"]), store=MemoryStore(), instrument=traced(provider))
    agent.run("warm the thread's runner up")  # the runner exists before the caller's span does
    exporter.clear()
    with provider.get_tracer("app").start_as_current_span("request") as outer:
        state = agent.run("hello")
    drive = one(exporter.get_finished_spans(), "invoke_agent agent")
    assert parent_of(drive) == outer.get_span_context().span_id
    assert drive.links == ()
    ctx = outer.get_span_context()
    assert traceparent(state) == f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}"


def test_every_drive_of_a_run_is_in_the_trace_run_started_recorded(
    provider: TracerProvider, exporter: InMemorySpanExporter, tmp_path: Path
) -> None:
    store = FileStore(tmp_path / "runs")
    agent = Agent(ScriptedModel(["one", "two"]), store=store, instrument=traced(provider))
    with provider.get_tracer("app").start_as_current_span("creator") as creator:
        state = agent.run("hello")
    state.add_message(tether.Message.user("again"))
    store.save(state)
    agent.resume(state.id)  # no active span here: no link
    drives = by_name(exporter.get_finished_spans(), "invoke_agent agent")
    assert len(drives) == 2
    assert {parent_of(d) for d in drives} == {creator.get_span_context().span_id}
    assert {d.context.trace_id for d in drives} == {creator.get_span_context().trace_id}
    assert drives[1].links == ()
    store.close()


def test_a_submitted_run_driven_by_a_worker_is_in_the_trace_of_its_submitter(
    provider: TracerProvider, exporter: InMemorySpanExporter, tmp_path: Path
) -> None:
    store = FileStore(tmp_path / "runs")
    agent = Agent(ScriptedModel(["done"]), store=store, instrument=traced(provider))
    with provider.get_tracer("app").start_as_current_span("enqueue") as enqueue:
        submitted = agent.submit("later")
    agent.resume(submitted.id)
    drive = one(exporter.get_finished_spans(), "invoke_agent agent")
    assert drive.context.trace_id == enqueue.get_span_context().trace_id
    assert parent_of(drive) == enqueue.get_span_context().span_id
    # without a caller's span, a submitted run is given a trace of its own
    alone = agent.submit("later, alone")
    recorded = traceparent(alone)
    assert recorded is not None
    agent.resume(alone.id)
    drive = by_name(exporter.get_finished_spans(), "invoke_agent agent")[-1]
    assert f"{drive.context.trace_id:032x}" == recorded.split("-")[1]
    store.close()


def test_stream_traces_the_run(provider: TracerProvider, exporter: InMemorySpanExporter) -> None:
    agent = Agent(
        ScriptedModel([call("weather", city="Oslo"), "ok"]),
        tools=[weather],
        store=MemoryStore(),
        instrument=traced(provider),
    )

    async def main() -> None:
        async for _ in agent.stream("go"):
            pass

    asyncio.run(main())
    assert tree(exporter.get_finished_spans()) == [
        "invoke_agent agent",
        "  chat scripted",
        "  execute_tool weather",
        "  chat scripted",
    ]


def test_an_interrupted_drive_ends_its_spans_with_the_interrupt(
    provider: TracerProvider, exporter: InMemorySpanExporter, tmp_path: Path
) -> None:
    @tool(effect="read_only")
    async def hang() -> str:
        """Never returns."""
        await asyncio.sleep(60)
        return "never"

    store = FileStore(tmp_path / "runs")
    agent = Agent(ScriptedModel([call("hang"), "ok"]), tools=[hang], store=store, instrument=traced(provider))

    async def main() -> None:
        task = asyncio.ensure_future(agent.arun("go", id="r1"))
        while not by_name(exporter.get_finished_spans(), "chat scripted"):
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    spans = exporter.get_finished_spans()
    drive = one(spans, "invoke_agent agent")
    assert (drive.attributes or {})[t.ERROR_TYPE] == "CancelledError"
    hung = one(spans, "execute_tool hang")
    assert (hung.attributes or {})[t.ERROR_TYPE] == "CancelledError"
    assert t.TETHER_TOOL_OUTCOME not in (hung.attributes or {})
    store.close()


# --------------------------------------------------------------------------------------------------
# The journal and the import


def test_run_started_without_traceparent_encodes_as_before() -> None:
    old = {"seq": 0, "kind": "run_started", "at": "2026-01-01T00:00:00.000000Z", "version": 1, "agent": "a"}
    raw = {**old, "h": j.checksum(old)}
    entry = j.decode_entry(raw, "r")
    assert isinstance(entry, j.RunStarted) and entry.traceparent is None
    assert "traceparent" not in j.entry_to_dict(entry)
    tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    sealed = j.seal([j.RunStarted(seq=0, at=old["at"], agent="a", traceparent=tp)], "w", run_id="r")[0]
    again = j.decode_entry(j.encode_entry(sealed), "r")
    assert isinstance(again, j.RunStarted) and again.traceparent == tp


def test_import_tether_imports_no_opentelemetry() -> None:
    code = "import sys, tether; print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": SRC},
    )
    assert out.stdout.strip() == "[]"


# --------------------------------------------------------------------------------------------------
# A crash: SIGKILL in one process, resumed in another, one trace

CRASH_SCRIPT = textwrap.dedent(
    '''
    import sys
    from pathlib import Path

    import orjson
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

    from tether import Agent, FileStore, tool
    from tether.testing import ScriptedModel, call
    from tether.tracing import InstrumentSettings


    class FileExporter(SpanExporter):
        """One JSON line per span, written and flushed as each span ends."""

        def __init__(self, path):
            self.file = open(path, "ab")

        def export(self, spans):
            for s in spans:
                line = {
                    "name": s.name,
                    "trace_id": f"{s.context.trace_id:032x}",
                    "span_id": f"{s.context.span_id:016x}",
                    "parent_id": f"{s.parent.span_id:016x}" if s.parent else None,
                    "attributes": dict(s.attributes or {}),
                    "events": [[e.name, dict(e.attributes or {})] for e in s.events],
                    "pid": __import__("os").getpid(),
                }
                self.file.write(orjson.dumps(line) + b"\\n")
            self.file.flush()
            return SpanExportResult.SUCCESS


    mode, store_dir, spans_file = sys.argv[1], sys.argv[2], sys.argv[3]
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(FileExporter(spans_file)))


    @tool(effect="read_only")
    def weather(city: str) -> str:
        """Get the weather.

        Args:
            city: The city.
        """
        return f"sunny in {city}"


    agent = Agent(
        ScriptedModel([call("weather", city="Paris"), "It is sunny."]),
        name="crashy",
        tools=[weather],
        store=FileStore(store_dir),
        instrument=InstrumentSettings(tracer_provider=provider),
    )
    if mode == "start":
        agent.run("weather?", id="r1")
    else:
        print(agent.resume("r1").status)
    '''
)


@pytest.mark.crash
@pytest.mark.slow
def test_a_sigkilled_run_resumed_in_a_new_process_is_one_trace(tmp_path: Path) -> None:
    script = tmp_path / "crashy.py"
    script.write_text(CRASH_SCRIPT)
    runs, spans_file = tmp_path / "runs", tmp_path / "spans.jsonl"
    env = {k: v for k, v in os.environ.items() if k != "TETHER_FAILPOINT"}
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    first = subprocess.run(
        [sys.executable, str(script), "start", str(runs), str(spans_file)],
        env={**env, "TETHER_FAILPOINT": "after_append:tool_started"},
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert first.returncode == -9, first.stderr.decode()
    second = subprocess.run(
        [sys.executable, str(script), "resume", str(runs), str(spans_file)],
        env=env,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert second.returncode == 0, second.stderr.decode()
    assert second.stdout.decode().strip() == "completed"

    spans = [orjson.loads(line) for line in spans_file.read_bytes().splitlines()]
    pids = sorted({s["pid"] for s in spans})
    assert len(pids) == 2  # spans from both processes
    assert len({s["trace_id"] for s in spans}) == 1  # ONE trace

    recorded = traceparent(FileStore(runs).load("r1"))
    assert recorded is not None
    _, trace_id, root_span_id, _ = recorded.split("-")
    assert spans[0]["trace_id"] == trace_id
    killed = [s for s in spans if s["pid"] == pids[0]]
    resumed = [s for s in spans if s["pid"] == pids[1]]
    # the killed process ended only its model request; its drive span died with it
    assert [s["name"] for s in killed] == ["chat scripted"]
    assert killed[0]["parent_id"] == root_span_id
    assert sorted(s["name"] for s in resumed) == [
        "chat scripted",
        "execute_tool weather",
        "invoke_agent crashy",
    ]
    drive = next(s for s in resumed if s["name"] == "invoke_agent crashy")
    assert drive["parent_id"] == root_span_id  # continues the trace run_started recorded
    recovered = [attrs for name, attrs in drive["events"] if name == t.EVENT_RECOVERED]
    assert recovered == [
        {
            t.TETHER_CALL_ID: "c3_0",
            t.TETHER_TOOL_NAME: "weather",
            t.TETHER_RECOVERY_ACTION: "retry",
            t.TETHER_RECOVERY_REASON: recovered[0][t.TETHER_RECOVERY_REASON],
        }
    ]
    tool_span = next(s for s in resumed if s["name"] == "execute_tool weather")
    assert tool_span["attributes"][t.TETHER_TOOL_ATTEMPT] == 2
    assert tool_span["parent_id"] == drive["span_id"]


def test_the_spans_are_the_same_on_every_store(store: Store) -> None:
    """The tracing recorder works the same on every store (MemoryStore and FileStore)."""
    provider = TracerProvider()
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    agent = Agent(
        ScriptedModel([call("weather", city="Oslo"), "ok"]),
        tools=[weather],
        store=store,
        instrument=traced(provider),
    )
    agent.run("go")
    assert tree(exporter.get_finished_spans()) == [
        "invoke_agent agent",
        "  chat scripted",
        "  execute_tool weather",
        "  chat scripted",
    ]
