"""A model request awaited in the drive's own task while the inbox is watched for a cancel (DURABILITY 2.3).

While a model request is in flight the holder journals nothing from the inbox; it only reads it every
``poll_interval`` and holds what it finds, and a cancel abandons the request. ``await_watched`` does that
without a task of its own for the request and without ``asyncio.wait``: the request's coroutine is stepped
in the caller's task, and the watch (a timer, then a short read of the inbox every ``poll_interval``) is
armed only once the request first waits. A request that answers without waiting (a scripted model, a
cache) costs no timer, no task and no extra loop iteration.

A cancel found by the watch cancels the caller's task, which abandons the request where it waits; the
watch then takes that cancellation back (``Task.uncancel``). An interrupt that came meanwhile (Ctrl+C,
SIGTERM, a lost lease: a cancel of the task from elsewhere) is raised as ``CancelledError`` even when
the request swallowed it or turned it into an error, so it never becomes a ``model_failed``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Generator
from typing import Any, TypeVar

from .inbox import InboxWatch

__all__ = ["CANCELLED", "await_watched"]

T = TypeVar("T")

CANCELLED: Any = object()
"""What ``await_watched`` returns when a cancel item came in while the request was in flight."""


async def await_watched(request: Awaitable[T], inbox: InboxWatch, poll_interval: float) -> T | Exception:
    """Await ``request`` in this task, reading the inbox every ``poll_interval`` once it waits.

    Items read meanwhile are held (``inbox.hold``), to be journaled after the reply.

    Returns:
        The request's result; the exception it raised (a failed request, which the caller journals);
        or ``CANCELLED`` when a cancel item was found (the request was abandoned).

    Raises:
        The inbox read's exception (the request abandoned); CancelledError when this task was cancelled
        from elsewhere (Ctrl+C, SIGTERM, a lost lease); other BaseExceptions the request raised.
    """
    task = asyncio.current_task()
    assert task is not None
    watch = _Watch(task, inbox, poll_interval)
    outcome: T | BaseException
    try:
        outcome = await _Stepped(request, watch.arm)
    except BaseException as exc:  # the request's error, or a cancel it let through
        outcome = exc
    finally:
        watch.disarm()
    if watch.cancel_sent:
        task.uncancel()  # the watch's own cancel: taken back, whatever the request made of it
    if task.cancelling() > watch.cancelling:  # an interrupt came meanwhile: raised, whatever the request did
        if isinstance(outcome, asyncio.CancelledError):
            raise outcome
        raise asyncio.CancelledError() from (outcome if isinstance(outcome, BaseException) else None)
    if watch.cancel_sent:  # a cancel item (or a failed read): the request is abandoned, its outcome unread
        if watch.error is not None:
            raise watch.error from None
        return CANCELLED
    if isinstance(outcome, Exception):
        return outcome
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome


class _Watch:
    """Reads the inbox every ``poll_interval`` for one request; cancels ``task`` on a cancel item or an error."""

    __slots__ = ("_read", "_timer", "cancel_sent", "cancelling", "error", "inbox", "poll_interval", "task")

    def __init__(self, task: asyncio.Task[Any], inbox: InboxWatch, poll_interval: float) -> None:
        self.task, self.inbox, self.poll_interval = task, inbox, poll_interval
        self.cancelling = task.cancelling()  # the cancels requested before this request (none taken back)
        self.cancel_sent = False
        self.error: BaseException | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._read: asyncio.Task[None] | None = None

    def arm(self) -> None:
        """The request waits: read the inbox once ``poll_interval`` has passed (and then again each time)."""
        self._timer = asyncio.get_running_loop().call_later(self.poll_interval, self._due)

    def disarm(self) -> None:
        """The request ended: no more reads (one in progress is dropped; what it read stays in the inbox)."""
        if self._timer is not None:
            self._timer.cancel()
        if self._read is not None and not self._read.done():
            self._read.cancel()

    def _due(self) -> None:
        self._timer = None
        self._read = asyncio.ensure_future(self._poll())

    async def _poll(self) -> None:
        try:
            items = await self.inbox.read()
        except Exception as exc:  # the store failed: the request is abandoned and the error raised
            self.error = exc
            self._cancel()
            return
        if items:
            self.inbox.hold(items)
            if any(item.type == "cancel" for item in items):
                self._cancel()
                return
        self.arm()

    def _cancel(self) -> None:
        self.cancel_sent = True
        self.task.cancel()


class _Stepped:
    """Awaits ``awaitable`` in the awaiting task, calling ``on_wait`` the first time it waits.

    It forwards each step (``send``, ``throw``) as ``yield from`` would, so the request runs exactly as if
    awaited directly; only its first wait is seen.
    """

    __slots__ = ("awaitable", "on_wait")

    def __init__(self, awaitable: Awaitable[Any], on_wait: Any) -> None:
        self.awaitable, self.on_wait = awaitable, on_wait

    def __await__(self) -> Generator[Any, Any, Any]:
        steps = self.awaitable.__await__()
        try:
            waits_on = steps.send(None)
        except StopIteration as stop:
            return stop.value
        self.on_wait()
        while True:
            try:
                sent = yield waits_on
            except GeneratorExit:
                close = getattr(steps, "close", None)
                if close is not None:
                    close()
                raise
            except BaseException as exc:
                try:
                    waits_on = steps.throw(exc)
                except StopIteration as stop:
                    return stop.value
            else:
                try:
                    waits_on = steps.send(sent)
                except StopIteration as stop:
                    return stop.value
