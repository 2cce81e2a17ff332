"""The driver's OpenTelemetry recorder (DESIGN 15): spans and events of a traced drive.

A ``Drive`` asks ``drive_trace`` for its recorder once; the parts of the driver then call it at a few
points (a model request, a tool attempt started, each append, the taker's recovery, the drive's end)
without asking whether tracing is on. Off, every call is a method of ``NoTrace`` or ``NoSpan`` that does
nothing, so a turn costs what it cost without tracing. On, ``OtelTrace`` records the spans and events of
``tether.tracing``; OpenTelemetry is imported only then.

One trace per run: a new run's ``run_started`` records the caller's active span as its ``traceparent``,
or, with none, the span of the run's first drive, opened here before the entry is written
(``new_run_traceparent``) and picked up by that drive. Every later drive starts its span in that trace
and links the caller's own span; a subagent's drive nests under its parent's ``execute_tool`` span.
"""

from __future__ import annotations

import contextvars
import secrets
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import orjson

from .. import journal as j
from .. import tracing as t
from .._calls import ABORTED_UNKNOWN, OpenCall
from ..messages import Message
from ..models.base import Model, ModelRequest
from ..state import State
from ..tracing import InstrumentSettings
from .agent_spec import DrivenAgent

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, Tracer

from .otel_spans import USAGE, ChatSpan, Metrics, ToolSpan, content_json, message_json, tether_version
from .spans import NO_SPAN, NO_TRACE, NoSpan, NoTrace

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

__all__ = ["OtelTrace", "child_traceparent", "drive_trace", "new_run_traceparent"]

_INHERITED: contextvars.ContextVar[InstrumentSettings | None] = contextvars.ContextVar(
    "tether_trace_settings", default=None
)
"""The settings of the drive whose task this is: a subagent without a setting of its own traces with them."""

_OPENING: contextvars.ContextVar[tuple[str, Span] | None] = contextvars.ContextVar(
    "tether_opening_span", default=None
)
"""A new run's first drive span, opened before its ``run_started`` recorded it, with its traceparent."""


def drive_trace(agent: DrivenAgent, state: State) -> NoTrace:
    """The recorder of one drive of ``state`` by ``agent``: ``NO_TRACE`` unless the agent is traced."""
    settings = t.settings_for(agent.instrument, _INHERITED.get())
    if settings is None:
        return NO_TRACE
    return OtelTrace.start(settings, agent, state)


def new_run_traceparent(agent: DrivenAgent, drive: bool) -> str | None:
    """The ``traceparent`` a new run's ``run_started`` records, or None when the agent is not traced.

    The caller's active span when it has one. Otherwise, for a run this process is about to drive
    (``drive``), the span of that first drive, opened now (a new root); for a submitted run, a new
    trace whose root span is the run itself (its id names no exported span).
    """
    settings = t.settings_for(agent.instrument, _INHERITED.get())
    if settings is None:
        return None
    from opentelemetry import context as otel_context
    from opentelemetry import trace

    current = trace.get_current_span().get_span_context()
    if current.is_valid:
        return _format(current.trace_id, current.span_id, int(current.trace_flags))
    if not drive:
        return f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"
    span = _tracer(settings).start_span(
        f"{t.OP_INVOKE_AGENT} {agent.name}", context=otel_context.Context(), kind=trace.SpanKind.INTERNAL
    )
    made = span.get_span_context()
    if not made.is_valid:
        return None  # no SDK: nothing is recorded, and there is no trace to continue
    traceparent = _format(made.trace_id, made.span_id, int(made.trace_flags))
    _OPENING.set((traceparent, span))
    return traceparent


def child_traceparent(sub: DrivenAgent) -> str | None:
    """The ``traceparent`` of a subagent's new run: its parent's ``execute_tool`` span, when traced."""
    if t.settings_for(sub.instrument, _INHERITED.get()) is None:
        return None
    from opentelemetry import trace

    current = trace.get_current_span().get_span_context()
    if not current.is_valid:
        return None
    return _format(current.trace_id, current.span_id, int(current.trace_flags))


# --------------------------------------------------------------------------------------------------
# On: OpenTelemetry


def _format(trace_id: int, span_id: int, flags: int) -> str:
    """A W3C ``traceparent`` header value."""
    return f"00-{trace_id:032x}-{span_id:016x}-{flags:02x}"


def _tracer(settings: InstrumentSettings) -> Tracer:
    from opentelemetry import trace

    provider = settings.tracer_provider or trace.get_tracer_provider()
    return provider.get_tracer(t.INSTRUMENTATION_NAME, tether_version())


def _provider_name(model: Model) -> str:
    """``gen_ai.provider.name`` of a model: its own ``provider`` attribute, else its adapter's module."""
    named = getattr(model, "provider", None)
    if isinstance(named, str):
        return named
    module = type(model).__module__
    return _PROVIDERS.get(module.rsplit(".", 1)[-1], "_OTHER") if module.startswith("tether.") else "_OTHER"


_PROVIDERS = {"anthropic": "anthropic", "openai": "openai", "scripted": "tether.scripted"}


class OtelTrace(NoTrace):
    """A traced drive: the ``invoke_agent`` span, its events, and the spans of requests and tool attempts."""

    __slots__ = (
        "_ctx",
        "_ended",
        "_failure",
        "_fragments",
        "_settings_token",
        "_token",
        "_usage_at_start",
        "agent",
        "content",
        "metrics",
        "model_attrs",
        "settings",
        "span",
        "state",
        "tools",
        "tracer",
    )

    def __init__(
        self, settings: InstrumentSettings, tracer: Tracer, span: Span, agent: DrivenAgent, state: State
    ) -> None:
        from opentelemetry import trace

        self.settings = settings
        self.tracer = tracer
        self.span = span
        self.agent = agent
        self.state = state
        self.content = settings.include_content
        self.metrics = Metrics.of(settings)
        self.tools: dict[str, ToolSpan] = {}
        self.model_attrs = {
            t.GEN_AI_PROVIDER_NAME: _provider_name(agent.model),
            t.GEN_AI_REQUEST_MODEL: agent.model.name,
        }
        self._ctx: Context = trace.set_span_in_context(span)
        self._token: contextvars.Token[Context] | None = None
        self._settings_token: contextvars.Token[InstrumentSettings | None] | None = None
        self._usage_at_start = dict(state.usage)
        self._ended = False
        self._failure: BaseException | None = None
        self._fragments: dict[int, tuple[Message, bytes]] = {}  # each message's JSON, made once per drive

    @classmethod
    def start(cls, settings: InstrumentSettings, agent: DrivenAgent, state: State) -> NoTrace:
        """Start the drive's span in the run's trace; ``NO_TRACE`` when nothing would be recorded."""
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        tracer = _tracer(settings)
        first = state.history[0] if state.history else None
        traceparent = getattr(first, "traceparent", None)
        opening = _OPENING.get()
        if opening is not None and traceparent is not None and opening[0] == traceparent:
            _OPENING.set(None)
            span = opening[1]  # this run's first drive: its span is the one run_started recorded
        else:
            current = trace.get_current_span().get_span_context()
            parent: Context | None = None
            links: list[trace.Link] = []
            if state.parent_id is not None and current.is_valid:
                parent = None  # a subagent's run: under its parent's execute_tool span, which is current
            elif traceparent is not None:
                parent = TraceContextTextMapPropagator().extract({"traceparent": traceparent})
                recorded = trace.get_current_span(parent).get_span_context()
                if current.is_valid and (current.trace_id, current.span_id) != (
                    recorded.trace_id,
                    recorded.span_id,
                ):
                    links.append(trace.Link(current))  # the resuming caller's own span
            span = tracer.start_span(
                f"{t.OP_INVOKE_AGENT} {agent.name}",
                context=parent,
                kind=trace.SpanKind.INTERNAL,
                links=links,
            )
        if not span.is_recording():
            span.end()
            return NO_TRACE
        attrs: dict[str, Any] = {
            t.GEN_AI_OPERATION_NAME: t.OP_INVOKE_AGENT,
            t.GEN_AI_AGENT_NAME: agent.name,
            t.GEN_AI_CONVERSATION_ID: state.id,
            t.GEN_AI_PROVIDER_NAME: _provider_name(agent.model),
            t.GEN_AI_REQUEST_MODEL: agent.model.name,
            t.TETHER_RUN_ID: state.id,
            t.TETHER_DRIVE_START_SEQ: len(state.history),
        }
        if agent.description:
            attrs[t.GEN_AI_AGENT_DESCRIPTION] = agent.description
        if state.parent_id is not None:
            attrs[t.TETHER_RUN_PARENT_ID] = state.parent_id
            attrs[t.TETHER_RUN_ROOT_ID] = state.root_id or state.parent_id
        span.set_attributes(attrs)
        return cls(settings, tracer, span, agent, state)

    def enter(self) -> None:
        from opentelemetry import context as otel_context

        self._token = otel_context.attach(self._ctx)
        self._settings_token = _INHERITED.set(self.settings)

    def failed(self, exc: BaseException) -> None:
        if self._failure is None:
            self._failure = exc

    def end(self) -> None:
        if self._ended:
            return
        self._ended = True
        exc = self._failure
        from opentelemetry import context as otel_context
        from opentelemetry.trace import Status, StatusCode

        for attempt in list(self.tools.values()):
            attempt.close(exc)
        self.tools.clear()
        self._fragments.clear()
        state, span = self.state, self.span
        attrs: dict[str, Any] = {t.TETHER_RUN_STATUS: state.status}
        for key, attr in USAGE:
            spent = state.usage.get(key, 0) - self._usage_at_start.get(key, 0)
            if spent:
                attrs[attr] = spent
        span.set_attributes(attrs)
        if exc is not None:
            span.set_attribute(t.ERROR_TYPE, type(exc).__qualname__)
            if isinstance(exc, Exception):
                span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"[:500]))
        elif state.status == "failed":
            span.set_attribute(t.ERROR_TYPE, "failed")
            span.set_status(Status(StatusCode.ERROR, (state.reason or "failed")[:500]))
        span.end()
        if self._settings_token is not None:
            try:
                _INHERITED.reset(self._settings_token)
            except ValueError:  # ended from another context than the one it entered
                pass
        if self._token is not None:
            otel_context.detach(self._token)

    def chat(self, request: ModelRequest, purpose: str | None = None) -> NoSpan:
        from opentelemetry import trace

        attrs: dict[str, Any] = {
            t.GEN_AI_OPERATION_NAME: t.OP_CHAT,
            **self.model_attrs,
            t.GEN_AI_CONVERSATION_ID: self.state.id,
            t.TETHER_RUN_ID: self.state.id,
            t.TETHER_REQUEST_INDEX: request.index,
        }
        if purpose is not None:
            attrs[t.TETHER_REQUEST_PURPOSE] = purpose
        if self.content:
            if request.instructions:
                attrs[t.GEN_AI_SYSTEM_INSTRUCTIONS] = content_json(
                    [{"type": "text", "content": request.instructions}]
                )
            attrs[t.GEN_AI_INPUT_MESSAGES] = self._messages_json(request.messages)
        span = self.tracer.start_span(
            f"{t.OP_CHAT} {self.agent.model.name}",
            context=self._ctx,
            kind=trace.SpanKind.CLIENT,
            attributes=attrs,
        )
        return ChatSpan(self, span)

    def _messages_json(self, messages: Sequence[Message]) -> str:
        """The request's messages as JSON; each message is serialized once per drive, not once per request."""
        parts: list[bytes] = []
        made = self._fragments
        for message in messages:
            known = made.get(id(message))
            if known is None or known[0] is not message:
                known = made[id(message)] = (message, orjson.dumps(message_json(message), default=str))
            parts.append(known[1])
        return (b"[" + b",".join(parts) + b"]").decode()

    def tool_started(self, entry: j.Entry, args: Any) -> None:
        from opentelemetry import trace

        assert isinstance(entry, j.ToolStarted)
        earlier = self.tools.pop(entry.call_id, None)
        if earlier is not None:
            earlier.close(None)  # a timed-out attempt, retried
        tool = self.agent.tools.get(entry.tool)
        attrs: dict[str, Any] = {
            t.GEN_AI_OPERATION_NAME: t.OP_EXECUTE_TOOL,
            t.GEN_AI_TOOL_NAME: entry.tool,
            t.GEN_AI_TOOL_CALL_ID: entry.call_id,
            t.GEN_AI_TOOL_TYPE: "function",
            t.TETHER_RUN_ID: self.state.id,
            t.TETHER_TOOL_EFFECT: entry.effect,
            t.TETHER_TOOL_ATTEMPT: entry.attempt,
            t.TETHER_TOOL_IDEMPOTENCY_KEY: entry.idempotency_key,
        }
        if entry.max_attempts is not None:
            attrs[t.TETHER_TOOL_MAX_ATTEMPTS] = entry.max_attempts
        if tool is not None and tool.description:
            attrs[t.GEN_AI_TOOL_DESCRIPTION] = tool.description
        if self.content:
            attrs[t.GEN_AI_TOOL_CALL_ARGUMENTS] = content_json(args if args is not None else {})
        span = self.tracer.start_span(
            f"{t.OP_EXECUTE_TOOL} {entry.tool}",
            context=self._ctx,
            kind=trace.SpanKind.INTERNAL,
            attributes=attrs,
        )
        self.tools[entry.call_id] = ToolSpan(span, trace.set_span_in_context(span))

    def tool(self, call_id: str) -> NoSpan:
        return self.tools.get(call_id, NO_SPAN)

    def journaled(self, batch: Sequence[j.Entry]) -> None:
        for entry in batch:
            handler = _JOURNALED.get(entry.kind)
            if handler is not None:
                handler(self, entry)

    def recovered(self, calls: Sequence[OpenCall], agent: DrivenAgent) -> None:
        for call in calls:
            action, reason = _recovery(call, agent)
            self.span.add_event(
                t.EVENT_RECOVERED,
                {
                    t.TETHER_CALL_ID: call.call_id,
                    t.TETHER_TOOL_NAME: call.tool,
                    t.TETHER_RECOVERY_ACTION: action,
                    t.TETHER_RECOVERY_REASON: reason,
                },
            )

    # what each journaled kind does

    def _tool_finished(self, entry: j.Entry) -> None:
        assert isinstance(entry, j.ToolFinished)
        span = self.tools.pop(entry.call_id, None)
        if span is not None:
            span.finish(entry, self.content)

    def _approval_requested(self, entry: j.Entry) -> None:
        assert isinstance(entry, j.ApprovalRequested)
        attrs: dict[str, Any] = {
            t.TETHER_CALL_ID: entry.call_id,
            t.TETHER_TOOL_NAME: entry.tool,
            t.TETHER_APPROVAL_ROUND: entry.round,
            t.TETHER_ENTRY_SEQ: entry.seq,
        }
        if self.content and entry.args is not None:
            attrs[t.GEN_AI_TOOL_CALL_ARGUMENTS] = content_json(entry.args)
        self.span.add_event(t.EVENT_APPROVAL_REQUESTED, attrs)

    def _approval_decided(self, entry: j.Entry) -> None:
        assert isinstance(entry, j.ApprovalDecided)
        self._consumed(entry, "decision")
        record = self.state.call(entry.call_id)
        attrs: dict[str, Any] = {
            t.TETHER_CALL_ID: entry.call_id,
            t.TETHER_APPROVAL_ROUND: entry.round,
            t.TETHER_APPROVAL_APPROVED: entry.approved,
            t.TETHER_ENTRY_SEQ: entry.seq,
        }
        if record is not None:
            attrs[t.TETHER_TOOL_NAME] = record.tool
        if entry.by is not None:
            attrs[t.TETHER_APPROVAL_BY] = entry.by
        if self.content and entry.reason:
            attrs[t.TETHER_APPROVAL_REASON] = entry.reason
        self.span.add_event(t.EVENT_APPROVAL_DECIDED, attrs)

    def message_json(self, entry: j.Entry) -> None:
        self._consumed(entry, "message")

    def _cancel(self, entry: j.Entry) -> None:
        self._consumed(entry, "cancel")

    def _skipped(self, entry: j.Entry) -> None:
        self._consumed(entry, "skipped")

    def _consumed(self, entry: j.Entry, kind: str) -> None:
        inbox_seq = getattr(entry, "inbox_seq", None)
        if inbox_seq is None:
            return  # not from the inbox
        attrs: dict[str, Any] = {
            t.TETHER_INBOX_SEQ: inbox_seq,
            t.TETHER_INBOX_TYPE: kind,
            t.TETHER_ENTRY_SEQ: entry.seq,
        }
        reason = getattr(entry, "reason", None)
        if kind == "skipped" and reason:
            attrs[t.TETHER_RUN_REASON] = reason
        self.span.add_event(t.EVENT_INBOX_CONSUMED, attrs)

    def _run_stopped(self, entry: j.Entry) -> None:
        assert isinstance(entry, j.RunStopped)
        attrs: dict[str, Any] = {t.TETHER_RUN_STATUS: entry.status, t.TETHER_ENTRY_SEQ: entry.seq}
        if entry.reason:
            attrs[t.TETHER_RUN_REASON] = entry.reason
        if self.content and entry.answer is not None:
            attrs[t.TETHER_RUN_ANSWER] = entry.answer
        self.span.add_event(t.EVENT_RUN_STOPPED, attrs)


_JOURNALED: dict[str, Callable[[OtelTrace, j.Entry], None]] = {
    "tool_finished": OtelTrace._tool_finished,
    "approval_requested": OtelTrace._approval_requested,
    "approval_decided": OtelTrace._approval_decided,
    "message": OtelTrace.message_json,
    "cancel_requested": OtelTrace._cancel,
    "inbox_skipped": OtelTrace._skipped,
    "run_stopped": OtelTrace._run_stopped,
}


def _recovery(call: OpenCall, agent: DrivenAgent) -> tuple[str, str]:
    """What the taker does with an open call (``tether.recovery.action``), and why."""
    if call.action == "wait":
        return "wait", call.reason or "waiting for a decision"
    if agent.tools.get(call.tool) is None:
        return "abort", f"tool {call.tool} is not in this agent"
    if call.action == "deny":
        return "abort", call.reason or "denied"
    if call.action == "abort":
        if call.reason == ABORTED_UNKNOWN and agent.on_unknown == "ask":
            return "ask", call.reason
        return "abort", call.reason
    if call.action in ("retry", "resume_child"):
        return "retry", call.reason or f"cut off at attempt {call.attempt}"
    return "run", call.reason or "never started"
