"""Invoking tools: async tools on the loop, sync tools each on a thread of their own (DESIGN 5.3).

Sync tools run on tether's tool threads: a call is given a thread no other call uses meanwhile, so a slow
tool never delays another's result, and a thread whose call timed out (an abandoned attempt) is not given
to anyone until that call returns. A sync call's first attempt can be prepared with ``sync_tool_job`` and
handed over by the store's thread the moment its ``tool_started`` is durable (``submit_tool_job``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from .._threads import Threads
from ..tools import Tool, ToolContext
from .spans import NO_SPAN, NoSpan

__all__ = ["call_tool", "submit_tool_job", "sync_tool_job", "tool_result"]

log = logging.getLogger("tether")

_TOOL_THREADS = Threads("tether-tool")


def sync_tool_job(
    tool: Tool, kwargs: dict[str, Any], ctx: ToolContext, span: NoSpan = NO_SPAN
) -> tuple[Callable[[], None], asyncio.Future[Any]]:
    """A sync tool's invocation, not yet started: the job for ``submit_tool_job`` and the future it settles.

    ``span`` is the attempt's ``execute_tool`` span, current on the tool's thread while it runs.
    """
    return _TOOL_THREADS.job(span.wrap(tool.invoke_sync), kwargs, ctx)


def submit_tool_job(job: Callable[[], None]) -> None:
    """Start a job from ``sync_tool_job`` on a tool thread of its own; called from the store's threads.

    When no thread can be started (the process is out of threads), the job runs here, on the caller's
    thread: late rather than lost, and never twice. Never call it on the event loop's thread, which that
    would block.
    """
    try:
        _TOOL_THREADS.submit(job)
    except RuntimeError as exc:
        log.warning("no tool thread could be started (%s); running the call on this thread", exc)
        job()


async def call_tool(tool: Tool, kwargs: dict[str, Any], ctx: ToolContext, span: NoSpan = NO_SPAN) -> Any:
    """Invoke a tool: async on the loop, sync on a thread of its own; ``timeout`` applied to both.

    ``span`` is the attempt's ``execute_tool`` span, current while the tool runs.
    """
    if tool.is_async:
        coro = span.run(tool.invoke_async(kwargs, ctx))
        if tool.timeout:
            return await asyncio.wait_for(coro, tool.timeout)
        return await coro
    return await tool_result(tool, _TOOL_THREADS.run(span.wrap(tool.invoke_sync), kwargs, ctx))


async def tool_result(tool: Tool, started: asyncio.Future[Any]) -> Any:
    """The result of a sync invocation already on its thread, within the tool's ``timeout``."""
    if tool.timeout:
        return await asyncio.wait_for(asyncio.shield(started), tool.timeout)
    return await started
