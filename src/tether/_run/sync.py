"""The sync face of the async driver, and SIGTERM as a cancel (DESIGN 1.7, 5.4).

``Agent.run``/``resume`` run their coroutine on one ``asyncio.Runner`` per thread; called inside a running
event loop they refuse with the fix. ``handle_sigterm`` turns SIGTERM into cancellation of every drive of the
process, which close their steps and release their runs; the process then exits with code 143.
"""

from __future__ import annotations

import asyncio
import contextvars
import signal
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from .renewal import cancel_all_drives, sigterm_received

__all__ = ["handle_sigterm", "run_sync"]

T = TypeVar("T")

_RUNNERS = threading.local()


def _runner() -> asyncio.Runner:
    runner: asyncio.Runner | None = getattr(_RUNNERS, "runner", None)
    if runner is None:
        runner = asyncio.Runner()
        _RUNNERS.runner = runner
    return runner


def run_sync(coro_fn: Callable[[], Coroutine[Any, Any, T]], name: str) -> T:
    """Run ``coro_fn()`` to its end on this thread's runner; ``name`` is the Agent method, for the error.

    Raises:
        RuntimeError: called from a running event loop.
        SystemExit: with code 143, when SIGTERM (``handle_sigterm``) cancelled the drive.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise RuntimeError(
            f"Agent.{name}() was called from a running event loop. Fix: await agent.a{name}(...)"
        )
    try:
        return _runner().run(coro_fn(), context=contextvars.copy_context())  # the caller's active span
    except asyncio.CancelledError:
        if sigterm_received():
            raise SystemExit(143) from None
        raise


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
