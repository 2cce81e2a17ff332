"""The sync face of the async driver, and SIGTERM as a cancel (DESIGN 1.7, 5.4).

``Agent.run``/``resume`` run their coroutine on one ``asyncio.Runner`` per thread; called inside a running
event loop they refuse with the fix. ``handle_sigterm`` turns SIGTERM into cancellation of every drive of the
process, which close their steps and release their runs; the process then exits with code 143.

A ``SystemExit`` or ``KeyboardInterrupt`` must never escape the event loop while a drive is suspended in it:
the drive would stay suspended (its run held by this live process) and the thread's runner would raise the
old exception at its next run. So a tool's such exception is raised in the drive's task (``tool_step``),
which closes the run and raises it again once closed; here it is caught at the top of that task and raised
again outside the loop. On the main thread, a Python signal handler of the program's own that raises (the
seed's recipe: SIGTERM raising ``SystemExit(128 + signum)``) is wrapped for the length of the run: its
exception cancels the drive, as Ctrl+C does, and is raised once the run is closed. A second such signal
during the close raises at once, as a second Ctrl+C does.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import signal
import threading
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING, Any, TypeVar, cast

from .renewal import cancel_all_drives, sigterm_received

if TYPE_CHECKING:
    import asyncio  # loaded by the first run, not by ``import tether`` (DESIGN 13: import time)

__all__ = ["handle_sigterm", "run_sync"]

T = TypeVar("T")

_RUNNERS = threading.local()


def _runner() -> asyncio.Runner:
    runner: asyncio.Runner | None = getattr(_RUNNERS, "runner", None)
    if runner is None:
        import asyncio

        runner = asyncio.Runner()
        _RUNNERS.runner = runner
    return runner


def run_sync(coro_fn: Callable[[], Coroutine[Any, Any, T]], name: str) -> T:
    """Run ``coro_fn()`` to its end on this thread's runner; ``name`` is the Agent method, for the error.

    Raises:
        RuntimeError: called from a running event loop.
        SystemExit: with code 143, when SIGTERM (``handle_sigterm``) cancelled the drive.
    """
    import asyncio

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise RuntimeError(
            f"Agent.{name}() was called from a running event loop. Fix: await agent.a{name}(...)"
        )
    main = _Main()
    with _handlers_wrapped(main):
        try:
            result = _runner().run(main.guard(coro_fn()), context=contextvars.copy_context())  # its span
        except asyncio.CancelledError:
            if main.raised is not None:
                raise main.raised from None  # a signal handler's exception, now that the run is closed
            if sigterm_received():
                raise SystemExit(143) from None
            raise
    if main.raised is not None:
        raise main.raised
    return cast(T, result)  # None only with ``main.raised`` set


_WRAPPED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
"""The signals whose Python handler (the program's own, not asyncio's SIGINT) is wrapped during a run."""


@dataclass(slots=True)
class _Main:
    """The task of one ``run_sync`` call, and the ``SystemExit``/``KeyboardInterrupt`` to raise after it."""

    task: asyncio.Task[Any] | None = None
    loop: asyncio.AbstractEventLoop | None = None
    raised: BaseException | None = None

    async def guard(self, coro: Coroutine[Any, Any, T]) -> T | None:
        """Run ``coro``; keep a ``SystemExit`` or ``KeyboardInterrupt`` it raises (after closing its run)."""
        import asyncio

        self.task, self.loop = asyncio.current_task(), asyncio.get_running_loop()
        try:
            return await coro
        except (KeyboardInterrupt, SystemExit) as exc:  # raised out of the loop, asyncio would keep it
            if self.raised is None:
                self.raised = exc
            return None

    def handle(
        self, handler: Callable[[int, FrameType | None], Any], signum: int, frame: FrameType | None
    ) -> None:
        """Call the program's handler; an exception it raises cancels the run instead, to be raised after."""
        try:
            handler(signum, frame)
        except BaseException as exc:
            task, loop = self.task, self.loop
            if self.raised is not None or task is None or loop is None or task.done():
                raise  # a second signal, or no run to close: raised at once
            self.raised = exc
            loop.call_soon_threadsafe(task.cancel)


@contextlib.contextmanager
def _handlers_wrapped(main: _Main) -> Iterator[None]:
    """On the main thread, wrap the program's own handlers of ``_WRAPPED`` with ``main.handle`` meanwhile."""
    if threading.current_thread() is not threading.main_thread():
        yield  # handlers run on the main thread only: a signal never interrupts this thread's loop
        return
    saved: dict[signal.Signals, Callable[[int, FrameType | None], Any]] = {}
    for wrapped in _WRAPPED:
        handler = signal.getsignal(wrapped)
        if callable(handler) and handler is not signal.default_int_handler:  # asyncio's Runner has SIGINT
            saved[wrapped] = handler
            signal.signal(wrapped, functools.partial(main.handle, handler))
    try:
        yield
    finally:
        for wrapped, handler in saved.items():
            signal.signal(wrapped, handler)


def handle_sigterm() -> None:
    """Turn SIGTERM into cancellation of every run this process drives.

    Each drive closes its steps (in-flight ``unsafe`` calls aborted, the rest left for a resume), writes
    ``run_released`` and releases the run; then the process exits with code 143. Call it once, from the
    main thread.
    """

    def handler(signum: int, frame: object) -> None:
        if not cancel_all_drives():
            raise SystemExit(143)  # nothing to close: exit as SIGTERM asks

    signal.signal(signal.SIGTERM, handler)
