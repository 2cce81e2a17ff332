"""Invoking tools: async tools on the loop, sync tools each on a thread of its own (DESIGN 5.3).

Threads are kept in a small idle pool and reused, so a turn does not pay for a new thread; a pool thread
is given to one call at a time, so a slow tool never delays another's result, and a thread whose call timed
out (an abandoned attempt) is not given to anyone until that call returns.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

from .tools import Tool, ToolContext

__all__ = ["call_tool"]

log = logging.getLogger("tether")

_IDLE_SECONDS = 30.0


class _ToolThread(threading.Thread):
    def __init__(self, pool: _ToolThreads) -> None:
        super().__init__(name="tether-tool", daemon=True)
        self.pool = pool
        self.jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()

    def run(self) -> None:
        while True:
            try:
                job = self.jobs.get(timeout=_IDLE_SECONDS)
            except queue.Empty:
                if self.pool.retire(self):
                    return
                continue  # it was handed a job just as it timed out
            job()
            self.pool.idle(self)


class _ToolThreads:
    """Daemon threads for sync tools: an idle one is reused, otherwise a new one starts."""

    def __init__(self) -> None:
        self._idle: list[_ToolThread] = []
        self._lock = threading.Lock()

    def submit(self, job: Callable[[], None]) -> None:
        with self._lock:
            thread = self._idle.pop() if self._idle else None
        if thread is None:
            thread = _ToolThread(self)
            thread.start()
        thread.jobs.put(job)

    def idle(self, thread: _ToolThread) -> None:
        with self._lock:
            self._idle.append(thread)

    def retire(self, thread: _ToolThread) -> bool:
        with self._lock:
            if thread in self._idle:
                self._idle.remove(thread)
                return True
            return False


_THREADS = _ToolThreads()


async def call_tool(tool: Tool, kwargs: dict[str, Any], ctx: ToolContext) -> Any:
    """Invoke a tool: async on the loop, sync on a thread of its own; ``timeout`` applied to both."""
    if tool.is_async:
        coro = tool.invoke_async(kwargs, ctx)
        if tool.timeout:
            return await asyncio.wait_for(coro, tool.timeout)
        return await coro
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def job() -> None:
        try:
            value = tool.invoke_sync(kwargs, ctx)
        except BaseException as exc:  # delivered to the awaiting task
            outcome: tuple[Any, BaseException | None] = (None, exc)
        else:
            outcome = (value, None)
        try:
            loop.call_soon_threadsafe(_settle, future, *outcome)
        except RuntimeError:  # the loop is closed: the run ended without this result
            log.info(
                "call %s of run %s finished after its run stopped; result dropped", ctx.call_id, ctx.run_id
            )

    _THREADS.submit(job)
    if tool.timeout:
        return await asyncio.wait_for(asyncio.shield(future), tool.timeout)
    return await future


def _settle(future: asyncio.Future[Any], value: Any, exc: BaseException | None) -> None:
    if future.done():
        if exc is None:
            log.info("a tool result arrived after its call was closed; dropped")
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(value)
