"""The driver's tracing interface, and its no-op recorder used when tracing is off (DESIGN 15).

A ``Drive`` asks ``otel_trace.drive_trace`` for its recorder once; the parts of the driver then call it at
a few points (a model request, a tool attempt started, each append, the taker's recovery, the drive's end)
without asking whether tracing is on. Off, every call is a method of ``NoTrace`` or ``NoSpan`` here that
does nothing, so a turn costs what it cost without tracing. On, ``otel_trace.OtelTrace`` records the spans
and events of ``tether.tracing``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from .. import journal as j
from .._calls import OpenCall
from ..models.base import ModelRequest
from .agent_spec import DrivenAgent

if TYPE_CHECKING:
    pass

__all__ = ["NO_SPAN", "NO_TRACE", "NoSpan", "NoTrace"]

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


class NoSpan:
    """A model request's or a tool attempt's span when tracing is off: each method does nothing."""

    __slots__ = ()

    def task(self, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        """Run a model request as a task (with its span current in it, and ended when it is done)."""
        return asyncio.ensure_future(coro)

    def wrap(self, fn: F) -> F:
        """``fn``, to be called on another thread with this span current there."""
        return fn

    def run(self, awaitable: Awaitable[T]) -> Awaitable[T]:
        """``awaitable``, awaited with this span current."""
        return awaitable

    def error(self, exc: BaseException) -> None:
        """Note the exception a tool attempt raised (its status is set when the attempt ends)."""


NO_SPAN = NoSpan()


class NoTrace:
    """A drive's recorder when tracing is off: each method does nothing."""

    __slots__ = ()

    def enter(self) -> None:
        """Make the drive's span current for the drive's task (called as the drive begins)."""

    def failed(self, exc: BaseException) -> None:
        """The drive is ending with ``exc`` (its span's status, set when it ends)."""

    def end(self) -> None:
        """End the drive's span (and every span still open); the first call wins."""

    def chat(self, request: ModelRequest, purpose: str | None = None) -> NoSpan:
        """The span of one model request."""
        return NO_SPAN

    def tool_started(self, entry: j.Entry, args: Any) -> None:
        """A tool attempt starts: ``entry`` is its ``tool_started``; the span of an earlier one ends."""

    def tool(self, call_id: str) -> NoSpan:
        """The span of the call's current attempt."""
        return NO_SPAN

    def journaled(self, batch: Sequence[j.Entry]) -> None:
        """An append returned: its entries end tool spans and become events on the drive's span."""

    def recovered(self, calls: Sequence[OpenCall], agent: DrivenAgent) -> None:
        """The taker found these open calls (one ``tether.recovered`` event each)."""


NO_TRACE = NoTrace()
