"""Running a driven run's calls: starting them, invoking tools and subagents (DESIGN 5.2-5.4, 10).

Each call is bracketed by ``tool_started`` (durable before the tool is invoked) and ``tool_finished``
(durable as soon as that one result exists). A sync tool's first attempt is handed to its thread by the
store's thread right after the append that made its start durable; async tools, retries and subagent calls
are launched from the loop once that append returned.
"""

from __future__ import annotations

import asyncio
import logging
from types import MappingProxyType
from typing import Any

from .. import journal as j
from ..errors import UnencodableError
from ..messages import text_block as _text
from ..stores.operations import cancel_tree, child_id_for
from ..tools import ToolContext, ToolCutOff, ToolInputError, result_to_blocks
from .agent_spec import DrivenAgent
from .inbox import InboxWatch
from .invoke import call_tool, sync_tool_job, tool_result
from .subagents import Children
from .writer import StartGate, Writer

__all__ = ["ToolStep"]

log = logging.getLogger("tether")


class ToolStep:
    """Runs the open calls of one driven run, together, while it polls the inbox.

    Args:
        agent: the driving agent.
        writer: the run's writer task.
        inbox: the run's inbox watch.
        gate: whether a tool may start now.
        admitted: the arguments the model step validated for each call of the last reply (taken from here
            instead of validating again).
        children: the run's subagent runs.
        deps: the driving call's dependencies, handed to each tool as ``ctx.deps`` (never journaled).
    """

    def __init__(
        self,
        agent: DrivenAgent,
        writer: Writer,
        inbox: InboxWatch,
        gate: StartGate,
        admitted: dict[str, dict[str, Any]],
        children: Children,
        deps: Any = None,
    ) -> None:
        self.agent = agent
        self.deps = deps
        self.writer = writer
        self.state = writer.journal.state
        self.inbox = inbox
        self.gate = gate
        self.admitted = admitted
        self.children = children
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._prestarted: dict[
            str, asyncio.Future[Any]
        ] = {}  # sync calls put on their thread after an append
        self._cancelling: set[str] = set()  # subagent calls whose child is being cancelled

    async def run(self, call_ids: list[str]) -> None:
        """Start the calls (one append with whatever is queued), run them together, poll the inbox.

        A sync call whose result is there by the time its start's append returned (it ran on the store's
        thread meanwhile) is journaled at once, without a task; the others each run in a task, awaited
        together with a poll of the inbox every ``poll_interval``.
        """
        for call_id in call_ids:
            self._start_on_save(call_id, self._start(call_id))
        await self.writer.flush()
        await self._launch(call_ids)
        while True:
            if self._tasks:
                done, _ = await asyncio.wait(
                    set(self._tasks.values()),
                    timeout=self.agent.poll_interval,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                for task in done:
                    error = task.exception()
                    if isinstance(error, _ToolInterrupt):  # its call stays listed: in flight at the interrupt
                        raise error.interrupt
                    self._tasks = {cid: t for cid, t in self._tasks.items() if t is not task}
                    if error is not None:
                        raise error
            if await self.inbox.consume():
                if self.state.status == "cancelled":
                    for task in self._tasks.values():
                        task.cancel()
                    self._tasks = {}
                    await self.writer.flush()
                    return
                started = [
                    c.call_id
                    for c in self.state.open_calls
                    if c.action == "run" and c.call_id not in self._tasks
                ]
                for call_id in started:
                    self._start_on_save(call_id, self._start(call_id))
                await self.writer.flush()
                await self._launch(started)
            elif not self._tasks:
                break
        await self.writer.flush()  # writes what a failed flush of a result left, or raises

    def interrupted(self) -> list[str]:
        """Stop every call this drive runs; returns the calls in flight (to settle as an interrupt does).

        Calls handed to a thread by the store's thread but never awaited are in flight too; their late
        results are dropped.
        """
        for task in self._tasks.values():
            task.cancel()
        in_flight = list(self._tasks) + [c for c in self._prestarted if c in self.writer.handed_over]
        for future in self._prestarted.values():
            future.add_done_callback(_drop_result)  # no one awaits it now: its result is not needed
        self._tasks, self._prestarted = {}, {}
        return in_flight

    async def cancel_children(self) -> None:
        """Cancel the open subagent runs before the run's own cancel closes their calls (DURABILITY 6)."""
        state, store = self.state, self.writer.store
        for call in state.open_calls:
            record = state.call(call.call_id)
            if record is None or (record.effect != "resumable" and record.child_id is None):
                continue
            child_id = record.child_id or child_id_for(state.id, call.call_id)
            task = self._tasks.get(call.call_id)
            if task is not None:  # this drive holds the child: it sees the cancel within a poll interval
                self._cancelling.add(call.call_id)  # its result is dropped: the cancel closes the call
                await store.apost(child_id, {"type": "cancel", "by": "parent"})
                await asyncio.wait({task})
                self._tasks.pop(call.call_id, None)
            else:
                await store.aoperate(cancel_tree, child_id, "parent", True)

    def _start(self, call_id: str) -> int:
        """Queue ``tool_started`` for a call about to run (retries keep the journaled effect and key).

        Returns:
            The seq of that ``tool_started``.
        """
        if not self.gate.open():
            raise asyncio.CancelledError()
        state = self.state
        record = state.call(call_id)
        assert record is not None
        tool = self.agent.tools.get(record.tool)
        assert tool is not None
        self.writer.act()
        if record.attempt > 0 and record.effect is not None and record.key is not None:
            effect, key, limit = record.effect, record.key, record.max_attempts or tool.max_attempts
        else:
            effect, key, limit = tool.effect, j.idempotency_key_for(state.id, call_id), tool.max_attempts
        entry = self.writer.add(
            j.ToolStarted,
            call_id=call_id,
            tool=tool.name,
            effect=effect,
            idempotency_key=key,
            attempt=record.attempt + 1,
            max_attempts=limit,
        )
        self.writer.trace.tool_started(entry, record.args)
        return entry.seq

    def _start_on_save(self, call_id: str, seq: int) -> None:
        """Have a sync tool start on its thread from the store's thread once ``tool_started`` (``seq``) is saved.

        The call then does not wait for the event loop to wake between its start being durable and its
        invocation. Async tools, subagents and invalid arguments are left to ``_invoke``.
        """
        record = self.state.call(call_id)
        assert record is not None
        tool = self.agent.tools.get(record.tool)
        if tool is None or tool.is_async or record.tool in self.agent.subagents:
            return
        kwargs = self.admitted.pop(call_id, None)
        if kwargs is None or record.edited_args is not None:  # a person's arguments replace the model's
            try:
                kwargs = tool.validate(record.run_args if record.run_args is not None else {})
            except ToolInputError:
                return
        job, future = sync_tool_job(
            tool, kwargs, self._context(call_id, tool.name), self.writer.trace.tool(call_id)
        )
        self.writer.start_after_append(seq, call_id, job)
        self._prestarted[call_id] = future

    def _context(self, call_id: str, tool: str) -> ToolContext[Any]:
        """The ToolContext of a call's current attempt: ids, key, the drive's deps, the run's metadata."""
        state = self.state
        record = state.call(call_id)
        assert record is not None
        metadata = MappingProxyType(state.metadata)
        return ToolContext(
            state.id, call_id, record.attempt, record.key or "", tool, deps=self.deps, metadata=metadata
        )

    async def _launch(self, call_ids: list[str]) -> None:
        """Journal the results already there (one append for all of them); give each other call a task."""
        finished = False
        for call_id in call_ids:
            if self._finished_on_its_thread(call_id):
                finished = True
            else:
                self._tasks[call_id] = asyncio.ensure_future(self._invoke(call_id))
        if finished:
            await self._save_result()

    def _finished_on_its_thread(self, call_id: str) -> bool:
        """Queue the result of a sync call that returned while its start was appended; False if it has none.

        Only a value is taken here; a call that raised, or has not returned, is left to ``_invoke``.
        """
        started = self._prestarted.get(call_id)
        if started is None or not started.done() or started.cancelled() or started.exception() is not None:
            return False
        del self._prestarted[call_id]
        state, record = self.state, self.state.call(call_id)
        if record is None or record.outcome is not None or not state.is_open(call_id):
            log.info("run %s call %s finished after it was closed; result dropped", state.id, call_id)
            return True
        try:
            outcome, content = "done", result_to_blocks(started.result())
        except Exception as exc:  # as in _invoke_call: a result that cannot be shown is the call's error
            outcome, content = "error", [_text(_error_text(exc))]
        self._add_result(call_id, outcome, content)
        return True

    async def _save_result(self) -> None:
        """Append the results queued; a failed append is retried at the end of the batch (DESIGN 5.3)."""
        try:
            await self.writer.flush()
        except asyncio.CancelledError:
            raise
        except (
            Exception
        ) as exc:  # the other calls go on; the end of the batch writes what is missing, or raises
            log.debug(
                "run %s: saving a result failed (%s); retried at the end of the batch", self.state.id, exc
            )

    async def _invoke(self, call_id: str) -> None:
        """Run one call and journal its result; a tool's ``SystemExit`` or ``KeyboardInterrupt`` interrupts.

        Such an exception must not escape the call's task (asyncio would raise it out of the event loop,
        leaving the drive suspended and the run held): it is carried out as a ``_ToolInterrupt``, which
        ``run`` raises in the drive's own task, where it closes the run as Ctrl+C does (DESIGN 5.4).
        """
        try:
            await self._invoke_call(call_id)
        except (KeyboardInterrupt, SystemExit) as exc:
            raise _ToolInterrupt(exc) from None

    async def _invoke_call(self, call_id: str) -> None:
        """Run one call (retrying timeouts of read_only and idempotent tools) and journal its result."""
        state = self.state
        record = state.call(call_id)
        assert record is not None
        tool = self.agent.tools.get(record.tool)
        assert tool is not None
        usage: dict[str, int] | None = None
        sub = self.agent.subagents.get(record.tool)
        started = self._prestarted.pop(call_id, None)
        while True:
            try:
                if started is not None:  # on its thread since its tool_started was saved
                    pending, started = started, None
                    outcome, content = "done", result_to_blocks(await tool_result(tool, pending))
                    break
                ctx = self._context(call_id, tool.name)
                span = self.writer.trace.tool(call_id)
                kwargs = tool.validate(record.run_args if record.run_args is not None else {})
                if sub is not None:
                    child = await span.run(self.children.enter(call_id, kwargs["prompt"], sub))
                    if child is None or call_id in self._cancelling:
                        return  # the child waits, or is busy elsewhere: the call stays open
                    outcome, content, usage = child
                else:
                    value = await call_tool(tool, kwargs, ctx, span)
                    outcome, content = "done", result_to_blocks(value)
            except (TimeoutError, ToolCutOff) as exc:  # an interrupted attempt: retried or aborted by effect
                self.writer.trace.tool(call_id).error(exc)
                effect = record.effect or tool.effect
                limit = record.max_attempts or tool.max_attempts
                if effect in j.RETRY_EFFECTS and record.attempt < limit and self.gate.open():
                    self._start(call_id)
                    await self.writer.flush()
                    continue
                if isinstance(exc, ToolCutOff):
                    text = f"aborted: {exc}; the tool may or may not have run"
                    if effect in j.RETRY_EFFECTS:
                        text = f"aborted: cut off {record.attempt} times; last: {exc}"
                elif effect in j.RETRY_EFFECTS:
                    text = f"aborted: timed out {record.attempt} times (timeout {tool.timeout}s)"
                else:
                    text = (
                        f"aborted: timed out after {tool.timeout}s; the tool may or may not have taken effect"
                    )
                outcome, content = "aborted", [_text(text)]
            except ToolInputError as exc:
                outcome, content = "input_error", [_text(str(exc))]
            except Exception as exc:
                self.writer.trace.tool(call_id).error(exc)
                outcome, content = "error", [_text(_error_text(exc))]
            break
        if record.outcome is not None or not state.is_open(call_id):
            log.info("run %s call %s finished after it was closed; result dropped", state.id, call_id)
            return
        self._add_result(call_id, outcome, content, usage)
        await self._save_result()

    def _add_result(
        self, call_id: str, outcome: str, content: list[Any], usage: dict[str, int] | None = None
    ) -> None:
        """Queue a call's ``tool_finished``; a result no journal can hold closes the call ``error`` instead."""
        try:
            self.writer.add(j.ToolFinished, call_id=call_id, outcome=outcome, content=content, usage=usage)
        except UnencodableError as exc:  # the tool ran: say so, rather than leave the call open to be retried
            text = f"the tool ran, but its result cannot be journaled: {exc.problem}. Fix: {_JSON_RESULTS}"
            self.writer.add(
                j.ToolFinished, call_id=call_id, outcome="error", content=[_text(text)], usage=usage
            )


class _ToolInterrupt(Exception):
    """A tool raised ``SystemExit`` or ``KeyboardInterrupt`` (``interrupt``), carried out of its call's task."""

    def __init__(self, interrupt: BaseException) -> None:
        super().__init__(f"a tool raised {type(interrupt).__name__}")
        self.interrupt = interrupt


_JSON_RESULTS = (
    "return text, or JSON values (strings, integers within 64 bits, floats, booleans, None, lists, and dicts "
    "with string keys)"
)


def _error_text(exc: BaseException) -> str:
    """``Type: message`` of a tool's exception; never raises (its ``__str__`` may)."""
    try:
        return f"{type(exc).__name__}: {exc}"
    except Exception:
        return f"{type(exc).__name__} (its message cannot be shown)"


def _drop_result(future: asyncio.Future[Any]) -> None:
    """Mark a late call's outcome as read (it was closed without it), so asyncio does not log it."""
    if not future.cancelled():
        future.exception()
