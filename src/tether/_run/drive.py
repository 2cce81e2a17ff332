"""The driver: takes a held run to its next stop (DESIGN 5, 7, DURABILITY 1-2).

One ``Drive`` per driven run. It consumes the inbox first, recovers open calls from what the journal
recorded, then loops: run the calls that can run, or ask the model, until the run completes, fails, waits
for a person, or is interrupted; then it releases the run. The steps live in ``_drive_core``,
``_drive_model`` and ``_drive_tools``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from .. import journal as j
from ..errors import LeaseLostError
from ..inbox import close_denied, consume
from ..state import ABORTED_UNKNOWN, State
from .renewal import ACTIVE_DRIVES, Renewer

if TYPE_CHECKING:
    pass

from ..messages import text_block as _text
from .core import backoff
from .subagents import skip_orphaned_items
from .tool_step import ToolSteps

__all__ = ["Drive", "backoff"]

log = logging.getLogger("tether")


class Drive(ToolSteps):
    """Drives one held run to its next stop."""

    async def run(self) -> State:
        """Drive to the next stop and release the run; returns the State."""
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        assert task is not None
        ACTIVE_DRIVES.add((loop, task))
        if self.lease.expires_at is not None and self.lease.ttl:
            self.renewer = Renewer(self.store, self.lease, self.lease.ttl, lambda: self._lost(loop, task))
            self.renewer.start()
        try:
            await self._take_over()
            while True:
                await self._drive_until_release()
                if await self._release():
                    return self.state
        except BaseException as exc:
            await self._close_after(exc)
            raise
        finally:
            ACTIVE_DRIVES.discard((loop, task))
            if self.renewer is not None:
                self.renewer.stop_event.set()

    async def run_compaction(self) -> State:
        """Consume the inbox, compact, and release: ``agent.compact`` as a short-lived taker."""
        try:
            await self._consume_inbox()
            await self.compact()
            while not await self._release():
                pass
            return self.state
        except BaseException as exc:
            await self._close_after(exc)
            raise

    def _lost(self, loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any]) -> None:
        self.lease_lost = True
        loop.call_soon_threadsafe(task.cancel)

    async def _take_over(self) -> None:
        """Consume first, then recover (DURABILITY 1.3, DESIGN 7)."""
        await self._consume_inbox()
        state = self.state
        # A root a worker may claim again: items posted to subagents whose call closed can do nothing.
        if (
            state.parent_id is None
            and state.subagent_calls
            and self.store.ttl is not None
            and await self.store.run_io(skip_orphaned_items, self.store, state) > 0
        ):
            self.act()  # the tree changed: the root's own entries say when it was last acted on
        if state.status in ("running", "failed") and state.resumes_since_progress >= 3:
            self.act()
            state.queue(
                j.RunStopped,
                status="failed",
                reason="crash loop: the run was resumed 3 times without progress",
                usage=dict(state.usage),
            )
            self.done = True
            await self.flush()
            return
        self.waiting_at_take = state.status == "waiting" and not await self._children_with_work()
        if state.status in j.FINAL_STATUSES or self.waiting_at_take:
            return  # returned as it is: a changed agent is noted only when the run goes on
        if state.status == "stopped" and self.agent.budget_exceeded(state, self.inherited) is not None:
            return
        self._check_agent()
        self._recover()  # flushed with the first start or request, so a decision and its start share an append

    def _check_agent(self) -> None:
        state, agent = self.state, self.agent
        if not state.history:
            return
        fingerprint = agent.fingerprint()
        if state.fingerprint is not None and state.fingerprint != fingerprint:
            if agent.strict_resume:
                raise ValueError(
                    f"run {state.id} was started with another model, instructions or tool set. Fix: resume it "
                    "with the agent it was started with, or pass strict_resume=False"
                )
            self.act()
            state.queue(j.AgentChanged, old=state.fingerprint, new=fingerprint)
        budgets = agent.budgets()
        if budgets != state.budgets:
            self.act()
            state.queue(j.BudgetsChanged, old=state.budgets, new=budgets)

    def _recover(self) -> None:
        """Close what the journal says must be closed; calls to run stay open for the loop."""
        state = self.state
        for call in state.open_calls:
            tool = self.agent.tool(call.tool)
            record = state.call(call.call_id)
            assert record is not None
            if call.action == "deny":
                self.act()
                decision = record.decision
                assert decision is not None
                close_denied(state, call.call_id, decision.round, decision.by, decision.reason)
            elif call.action == "wait":
                continue
            elif tool is None and call.action in ("run", "retry", "abort") and call.attempt == 0:
                self.act()
                state.queue(
                    j.ToolFinished,
                    call_id=call.call_id,
                    outcome="input_error",
                    content=[_text(self.agent.unknown_tool_text(call.tool))],
                )
            elif tool is None and call.action in ("retry", "abort"):
                self.act()
                state.queue(
                    j.ToolFinished,
                    call_id=call.call_id,
                    outcome="aborted",
                    content=[_text(f"aborted: tool {call.tool} is not in this agent")],
                )
            elif call.action == "abort":
                if call.reason == ABORTED_UNKNOWN and self.agent.on_unknown == "ask":
                    self.act()
                    state.queue(
                        j.ApprovalRequested,
                        call_id=call.call_id,
                        round=max(record.last_round + 1, 1),  # round 0 is for rules (DURABILITY 2.5)
                        tool=call.tool,
                        args=call.args,
                        question="the run stopped while this call ran: run it again, or report it aborted?",
                    )
                else:
                    self.act()
                    text = call.reason if call.reason.startswith("unknown") else f"aborted: {call.reason}"
                    state.queue(
                        j.ToolFinished, call_id=call.call_id, outcome="aborted", content=[_text(text)]
                    )

    async def _drive_until_release(self) -> None:
        state = self.state
        while not self.done and not self.stopping:
            status = state.status
            if status in j.FINAL_STATUSES:
                return
            if status == "stopped" and self.agent.budget_exceeded(state, self.inherited) is not None:
                return
            if self.agent.human is not None and not self.waiting_at_take:
                await self._ask_human()
                if self.done or state.status == "cancelled":
                    return
            open_calls = state.open_calls
            runnable = [c.call_id for c in open_calls if c.action in ("run", "retry", "resume_child")]
            if not runnable and open_calls and not self.child_busy:
                runnable = await self._children_with_work()
            if runnable and not self.child_busy:
                await self._run_calls(runnable)
                continue
            if open_calls:  # every open call waits for a person (or a child)
                return
            await self._ask()

    async def _release(self) -> bool:
        """Release the run; False when the inbox or journal grew (the caller consumes and drives again)."""
        state = self.state
        if self.acted and state.status not in j.STOP_STATUSES and state.history[-1].kind != "run_released":
            reason = "waiting for a decision" if state.status == "waiting" else "stopped with work left"
            state.queue(j.RunReleased, reason=reason)
        await self.flush()
        released = await self.store.run_io(
            self.store.release, self.lease, at_seq=len(state.history), inbox_len=state.inbox_consumed + 1
        )
        if released:
            return True
        await self._consume_inbox()
        if self.stopping:
            return False
        self.done = state.status in ("cancelled",)
        return False

    async def _close_after(self, exc: BaseException) -> None:
        """After an interrupt or error: abort in-flight unsafe calls, write ``run_released``, release."""
        self.stopping = True
        for task in self.tasks.values():
            task.cancel()
        # Calls handed to a thread by the store's thread but never awaited are in flight too.
        in_flight = list(self.tasks) + [c for c in self.prestarted if c in self.handed_over]
        for future in self.prestarted.values():
            future.add_done_callback(_drop_result)  # no one awaits it now: its result is not needed
        self.tasks, self.prestarted = {}, {}
        state = self.state
        if self.save_failed is not None:
            await self._give_up()  # the store refused this append; a retry here would fail the same way
            return
        if isinstance(exc, LeaseLostError) or self.lease_lost:
            await self._give_up()
            if not isinstance(exc, LeaseLostError):
                raise LeaseLostError(
                    f"run {state.id} lease was lost (renewals failed for ttl/2). Fix: nothing; another process "
                    "may drive the run now",
                    run_id=state.id,
                ) from exc
            return
        try:
            if isinstance(exc, asyncio.CancelledError | KeyboardInterrupt | SystemExit):
                for call_id in in_flight:
                    record = state.call(call_id)
                    if record is None or record.outcome is not None:
                        continue
                    if (record.effect or "unsafe") == "unsafe" and call_id in {
                        c.call_id for c in state.open_calls
                    }:
                        text = (
                            "aborted: the run was interrupted while this call ran; it may or may not have run"
                        )
                        state.queue(j.ToolFinished, call_id=call_id, outcome="aborted", content=[_text(text)])
                if self.acted and state.status not in j.STOP_STATUSES:
                    state.queue(j.RunReleased, reason=f"interrupted ({type(exc).__name__})")
            for _ in range(3):
                await self.flush()
                released = await self.store.run_io(
                    self.store.release,
                    self.lease,
                    at_seq=len(state.history),
                    inbox_len=state.inbox_consumed + 1,
                )
                if released:
                    return
                items = await self._read_inbox()  # stopping: journal without acting
                consume(state, items)
            await self._give_up()
        except BaseException as save_error:
            if save_error is not exc:
                exc.add_note(f"saving the run also failed: {type(save_error).__name__}: {save_error}")
            await self._give_up()


def _drop_result(future: asyncio.Future[Any]) -> None:
    """Mark a late call's outcome as read (it was closed without it), so asyncio does not log it."""
    if not future.cancelled():
        future.exception()
