"""Running calls: starting them, invoking tools and subagents, asking a person (DESIGN 5.2-5.4, 10)."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from .. import budgets
from .. import journal as j
from ..humans import ApprovalQuestion
from ..inbox import close_denied
from ..tools import ToolContext, ToolInputError, result_to_blocks
from .invoke import call_tool, sync_tool_job, tool_result
from .subagents import ChildBusy, drive_child

if TYPE_CHECKING:
    from ..agent import Agent

from ..messages import text_block as _text
from .model_step import ModelSteps

__all__ = ["ToolSteps"]

log = logging.getLogger("tether")


class ToolSteps(ModelSteps):
    """The steps of a drive that run calls."""

    async def _ask_human(self) -> None:
        """Ask ``agent.human`` about each open approval, after the requests are durable (DESIGN 5.2).

        The inbox is read meanwhile: a decision that arrives first wins and the person is told. Answers
        are queued as ``approval_decided`` (denials closed at once); the starts join them in one append.
        """
        human = self.agent.human
        assert human is not None
        state = self.state
        for call in state.pending_approvals:
            if call.call_id in self.asked:
                continue
            self.asked.add(call.call_id)
            await self.flush()
            record = state.call(call.call_id)
            assert record is not None
            question = ApprovalQuestion(
                state.id, call.call_id, call.tool, call.args, call.round, call.question
            )
            asking = asyncio.ensure_future(human.decide(question))
            try:
                while not asking.done():
                    await asyncio.wait({asking}, timeout=self.agent.poll_interval)
                    if not asking.done() and await self._consume_inbox() and record.open_round != call.round:
                        asking.cancel()
                        break
            except BaseException:
                asking.cancel()
                raise
            if state.status == "cancelled":
                return
            if record.open_round != call.round:
                decision = record.decision
                if decision is not None:
                    verb = "approved" if decision.approved else "denied"
                    human.notify(
                        f"call {call.call_id} was already {verb} by {decision.by or 'someone'} at {decision.at}"
                    )
                continue
            answer = asking.result()
            self.act()
            state.queue(
                j.ApprovalDecided,
                call_id=call.call_id,
                round=call.round,
                approved=answer.approved,
                by=answer.by,
                reason=answer.reason,
            )
            if not answer.approved:
                close_denied(state, call.call_id, call.round, answer.by, answer.reason)

    async def _run_calls(self, call_ids: list[str]) -> None:
        """Start the calls (one append with whatever is queued), run them together, poll the inbox."""
        for call_id in call_ids:
            self._start_on_save(call_id, self._start(call_id))
        await self.flush()
        for call_id in call_ids:
            self._launch(call_id)
        while self.tasks:
            done, _ = await asyncio.wait(
                set(self.tasks.values()),
                timeout=self.agent.poll_interval,
                return_when=asyncio.FIRST_COMPLETED,
            )
            for task in done:
                self.tasks = {cid: t for cid, t in self.tasks.items() if t is not task}
                if task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
            if await self._consume_inbox():
                if self.state.status == "cancelled":
                    for task in self.tasks.values():
                        task.cancel()
                    self.tasks = {}
                    await self.flush()
                    return
                started = [
                    c.call_id
                    for c in self.state.open_calls
                    if c.action == "run" and c.call_id not in self.tasks
                ]
                for call_id in started:
                    self._start_on_save(call_id, self._start(call_id))
                await self.flush()
                for call_id in started:
                    self._launch(call_id)
        if self.flush_error is not None:
            self.flush_error = None
        await self.flush()

    def _can_start(self) -> bool:
        return not self.stopping and (self.renewer is None or self.renewer.fresh())

    def _start(self, call_id: str) -> int:
        """Queue ``tool_started`` for a call about to run (retries keep the journaled effect and key).

        Returns:
            The seq of that ``tool_started``.
        """
        if not self._can_start():
            raise asyncio.CancelledError()
        state = self.state
        record = state.call(call_id)
        assert record is not None
        tool = self.agent.tool(record.tool)
        assert tool is not None
        self.act()
        if record.attempt > 0 and record.effect is not None and record.key is not None:
            effect, key, limit = record.effect, record.key, record.max_attempts or tool.max_attempts
        else:
            effect, key, limit = tool.effect, j.idempotency_key_for(state.id, call_id), tool.max_attempts
        return state.queue(
            j.ToolStarted,
            call_id=call_id,
            tool=tool.name,
            effect=effect,
            idempotency_key=key,
            attempt=record.attempt + 1,
            max_attempts=limit,
        ).seq

    def _start_on_save(self, call_id: str, seq: int) -> None:
        """Have a sync tool start on its thread from the store's thread once ``tool_started`` (``seq``) is saved.

        The call then does not wait for the event loop to wake between its start being durable and its
        invocation. Async tools, subagents and invalid arguments are left to ``_invoke``.
        """
        record = self.state.call(call_id)
        assert record is not None
        tool = self.agent.tool(record.tool)
        if tool is None or tool.is_async or record.tool in self.agent.subagents:
            return
        kwargs = self.validated.pop(call_id, None)
        if kwargs is None:
            try:
                kwargs = tool.validate(record.args if record.args is not None else {})
            except ToolInputError:
                return
        ctx = ToolContext(self.state.id, call_id, record.attempt, record.key or "", tool.name)
        job, future = sync_tool_job(tool, kwargs, ctx)
        self.after_append[seq] = (call_id, job)
        self.prestarted[call_id] = future

    def _launch(self, call_id: str) -> None:
        self.tasks[call_id] = asyncio.ensure_future(self._invoke(call_id))

    async def _invoke(self, call_id: str) -> None:
        """Run one call (retrying timeouts of read_only and idempotent tools) and journal its result."""
        state = self.state
        record = state.call(call_id)
        assert record is not None
        tool = self.agent.tool(record.tool)
        assert tool is not None
        usage: dict[str, int] | None = None
        sub = self.agent.subagents.get(record.tool)
        started = self.prestarted.pop(call_id, None)
        while True:
            try:
                if started is not None:  # on its thread since its tool_started was saved
                    pending, started = started, None
                    outcome, content = "done", result_to_blocks(await tool_result(tool, pending))
                    break
                ctx = ToolContext(state.id, call_id, record.attempt, record.key or "", tool.name)
                kwargs = tool.validate(record.args if record.args is not None else {})
                if sub is not None:
                    child = await self._drive_child(call_id, kwargs["prompt"], sub)
                    if child is None or call_id in self.cancelling:
                        return  # the child waits, or is busy elsewhere: the call stays open
                    outcome, content, usage = child
                else:
                    value = await call_tool(tool, kwargs, ctx)
                    outcome, content = "done", result_to_blocks(value)
            except TimeoutError:
                effect = record.effect or tool.effect
                limit = record.max_attempts or tool.max_attempts
                if effect in j.RETRY_EFFECTS and record.attempt < limit and self._can_start():
                    self._start(call_id)
                    await self.flush()
                    continue
                if effect in j.RETRY_EFFECTS:
                    text = f"aborted: timed out {record.attempt} times (timeout {tool.timeout}s)"
                else:
                    text = (
                        f"aborted: timed out after {tool.timeout}s; the tool may or may not have taken effect"
                    )
                outcome, content = "aborted", [_text(text)]
            except ToolInputError as exc:
                outcome, content = "input_error", [_text(str(exc))]
            except Exception as exc:
                outcome, content = "error", [_text(f"{type(exc).__name__}: {exc}")]
            break
        if record.outcome is not None or not state.is_open(call_id):
            log.info("run %s call %s finished after it was closed; result dropped", state.id, call_id)
            return
        state.queue(j.ToolFinished, call_id=call_id, outcome=outcome, content=content, usage=usage)
        try:
            await self.flush()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the end of the batch writes what is missing, or raises
            self.flush_error = exc

    async def _drive_child(
        self, call_id: str, prompt: str, sub: Agent
    ) -> tuple[str, list[dict[str, Any]], dict[str, int]] | None:
        """Drive the subagent run of ``call_id``; None when it waits (``child_waiting``) or is busy."""
        state, agent = self.state, self.agent
        limits = budgets.tighter(agent.budgets(), self.inherited) if self.inherited else agent.budgets()
        left = budgets.remaining(limits, state.turn, state.usage, agent.price)
        try:
            result = await drive_child(state, call_id, prompt, sub, self.store, left, agent.poll_interval)
        except ChildBusy as exc:
            log.warning("run %s: %s; releasing with call %s open", state.id, exc, call_id)
            self.child_busy = True
            return None
        if result.outcome is None:
            state.queue(j.ChildWaiting, call_id=call_id, child_id=result.child_id, pending=result.pending)
            await self.flush()
            return None
        return result.outcome, result.content, result.usage
