"""The spans of one traced model request (``chat``) and tool attempt (``execute_tool``), DESIGN 15.

Made by ``otel_trace.OtelTrace``; content (messages, arguments, results) is recorded only with
``include_content``.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import time
import weakref
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

import orjson

from .. import journal as j
from .. import tracing as t
from ..messages import Message, text_of
from ..models.base import ModelReply

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span

from ..state import State
from ..tracing import InstrumentSettings
from .spans import NoSpan

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

__all__ = ["USAGE", "ChatSpan", "Metrics", "Recorder", "ToolSpan", "content_json", "message_json", "within"]


@functools.cache
def tether_version() -> str:
    """The installed tether's version, as the tracer and meter name it."""
    import importlib.metadata

    try:
        return importlib.metadata.version("tether")
    except importlib.metadata.PackageNotFoundError:
        return "0"


class Metrics:
    """The GenAI client metrics of one meter provider (made once per provider)."""

    _made: ClassVar[weakref.WeakKeyDictionary[Any, Metrics]] = weakref.WeakKeyDictionary()

    def __init__(self, provider: Any) -> None:
        meter = provider.get_meter(t.INSTRUMENTATION_NAME, tether_version())
        self.tokens = meter.create_histogram(
            t.METRIC_TOKEN_USAGE, unit="{token}", description="Number of input and output tokens used"
        )
        self.duration = meter.create_histogram(
            t.METRIC_OPERATION_DURATION, unit="s", description="GenAI operation duration"
        )

    @classmethod
    def of(cls, settings: InstrumentSettings) -> Metrics:
        from opentelemetry import metrics

        provider = settings.meter_provider or metrics.get_meter_provider()
        made = cls._made.get(provider)
        if made is None:
            made = cls._made[provider] = cls(provider)
        return made


USAGE = (("input_tokens", t.GEN_AI_USAGE_INPUT_TOKENS), ("output_tokens", t.GEN_AI_USAGE_OUTPUT_TOKENS))


class Recorder(Protocol):
    """What a span reads of the drive's recorder (``otel_trace.OtelTrace``)."""

    metrics: Metrics
    model_attrs: dict[str, Any]
    content: bool
    state: State


class ChatSpan(NoSpan):
    """The ``chat`` span of one model request, ended when the request's task is done."""

    __slots__ = ("_started", "span", "trace")

    def __init__(self, trace: Recorder, span: Span) -> None:
        self.trace = trace
        self.span = span
        self._started = time.monotonic()

    def task(self, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        from opentelemetry import context as otel_context
        from opentelemetry import trace

        ctx = contextvars.copy_context()
        ctx.run(otel_context.attach, trace.set_span_in_context(self.span))  # an SDK's own span nests here
        task = asyncio.get_running_loop().create_task(coro, context=ctx)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        from opentelemetry.trace import Status, StatusCode

        span, metrics = self.span, self.trace.metrics
        attrs = dict(self.trace.model_attrs)
        attrs[t.GEN_AI_OPERATION_NAME] = t.OP_CHAT
        if task.cancelled():
            span.set_attribute(t.TETHER_REQUEST_CANCELLED, True)
            span.end()
            return
        exc = task.exception()
        if exc is not None:
            kind = type(exc).__qualname__
            span.set_attribute(t.ERROR_TYPE, kind)
            span.set_attribute(t.TETHER_REQUEST_RETRYABLE, bool(getattr(exc, "retryable", False)))
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, f"{kind}: {exc}"[:500]))
            attrs[t.ERROR_TYPE] = kind
        else:
            reply: ModelReply = task.result()
            done: dict[str, Any] = {}
            if reply.model:
                done[t.GEN_AI_RESPONSE_MODEL] = attrs[t.GEN_AI_RESPONSE_MODEL] = reply.model
            if reply.stop_reason:
                done[t.GEN_AI_RESPONSE_FINISH_REASONS] = (reply.stop_reason,)
            for key, attr in USAGE:
                value = (reply.usage or {}).get(key)
                if value is not None:
                    done[attr] = value
                    metrics.tokens.record(value, {**attrs, t.GEN_AI_TOKEN_TYPE: key.split("_", 1)[0]})
            if self.trace.content:
                # the reply's calls by tether's ids: its model_replied is the next entry of the run
                seq, blocks, index = len(self.trace.state.history), [], 0
                for block in reply.content:
                    if block.get("type") == "tool_call":
                        block = {**block, "id": j.call_id_for(seq, index)}
                        index += 1
                    blocks.append(block)
                message = message_json(Message("assistant", tuple(blocks)))
                if reply.stop_reason:
                    message["finish_reason"] = reply.stop_reason
                done[t.GEN_AI_OUTPUT_MESSAGES] = content_json([message])
            span.set_attributes(done)
        metrics.duration.record(time.monotonic() - self._started, attrs)
        span.end()


class ToolSpan(NoSpan):
    """The ``execute_tool`` span of one attempt of one call."""

    __slots__ = ("ctx", "exc", "span")

    def __init__(self, span: Span, ctx: Context) -> None:
        self.span = span
        self.ctx = ctx
        self.exc: BaseException | None = None

    def wrap(self, fn: F) -> F:
        from opentelemetry import context as otel_context

        ctx = self.ctx

        def within(*args: Any, **kwargs: Any) -> Any:
            token = otel_context.attach(ctx)
            try:
                return fn(*args, **kwargs)
            finally:
                otel_context.detach(token)

        return within  # type: ignore[return-value]

    def run(self, awaitable: Awaitable[T]) -> Awaitable[T]:
        return within(self.ctx, awaitable)

    def error(self, exc: BaseException) -> None:
        self.exc = exc

    def finish(self, entry: j.ToolFinished, content: bool) -> None:
        """End with the journaled result: its outcome, error status for failures, the result with content."""
        from opentelemetry.trace import Status, StatusCode

        span = self.span
        span.set_attribute(t.TETHER_TOOL_OUTCOME, entry.outcome)
        if content:
            span.set_attribute(t.GEN_AI_TOOL_CALL_RESULT, text_of(entry.content))
        if entry.outcome in t.ERROR_OUTCOMES:
            kind = type(self.exc).__qualname__ if self.exc is not None else entry.outcome
            span.set_attribute(t.ERROR_TYPE, kind)
            if isinstance(self.exc, Exception):
                span.record_exception(self.exc)
            span.set_status(Status(StatusCode.ERROR, kind))
        span.end()

    def close(self, exc: BaseException | None) -> None:
        """End without a result: the drive ended (``exc``), the call waits on its child, or it is retried."""
        from opentelemetry.trace import Status, StatusCode

        failure = exc if exc is not None else self.exc
        if failure is not None:
            kind = type(failure).__qualname__
            self.span.set_attribute(t.ERROR_TYPE, kind)
            self.span.set_status(Status(StatusCode.ERROR, kind))
        self.span.end()


async def within(ctx: Context, awaitable: Awaitable[T]) -> T:
    from opentelemetry import context as otel_context

    token = otel_context.attach(ctx)
    try:
        return await awaitable
    finally:
        otel_context.detach(token)


def content_json(value: Any) -> str:
    return orjson.dumps(value, default=str).decode()


def message_json(message: Message) -> dict[str, Any]:
    """A message in the GenAI conventions' form: ``{"role", "parts": [...]}``."""
    return {"role": message.role, "parts": [_part(block) for block in message.content]}


def _part(block: dict[str, Any]) -> dict[str, Any]:
    kind = block.get("type")
    if kind == "text":
        return {"type": "text", "content": block.get("text", "")}
    if kind == "tool_call":
        return {
            "type": "tool_call",
            "id": block.get("id") or block.get("provider_call_id"),
            "name": block.get("name"),
            "arguments": block.get("args"),
        }
    if kind == "tool_result":
        return {
            "type": "tool_call_response",
            "id": block.get("call_id"),
            "response": text_of(block.get("content") or []),
        }
    if kind == "image":
        return {"type": "blob", "modality": "image", "mime_type": block.get("media_type")}
    return {"type": str(kind)}
