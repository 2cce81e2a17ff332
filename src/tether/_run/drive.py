"""The drive: takes a held run to its next stop, then releases it (DESIGN 5, 7; DURABILITY 1, 2).

One ``Drive`` per driven run, composed of objects with one job each: the ``Writer`` appends, the
``InboxWatch`` polls and journals the inbox, ``recovery`` closes what the journal says must be closed, the
``ModelStep`` asks the model, the ``ToolStep`` runs calls, ``Children`` enters subagent runs, the
``HumanStep`` asks a person, the ``Renewer`` keeps the lease. The drive itself is the loop: consume the
inbox first, recover, then run the calls that can run or ask the model until the run completes, fails,
waits for a person, or is interrupted; then release.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from .. import journal as j
from ..errors import LeaseLostError
from ..events import Event
from ..messages import text_block
from ..output import OutputSpec, imported_type, output_spec
from ..state import State
from ..stores.base import Lease, Store
from ..stores.operations import skip_orphaned_items
from ..writing import JournalWriter
from .agent_spec import DrivenAgent
from .approvals import HumanStep
from .inbox import InboxWatch
from .model_step import ModelStep
from .otel_trace import drive_trace
from .recovery import args_check, check_agent, recover
from .renewal import ACTIVE_DRIVES, Renewer
from .subagents import Children
from .tool_step import ToolStep
from .writer import StartGate, Writer

__all__ = ["Drive", "lease_lost_in"]


class Drive:
    """Drives one held run to its next stop.

    Args:
        agent: the driving agent.
        store: where the run lives.
        journal: the run's JournalWriter, whose State holds every durable entry (and the writer id of the
            lease's owner).
        lease: this process's hold on the run.
        emit: where ``agent.stream`` receives entries (after their append) and text deltas.
        inherited: a parent's remaining budgets, for a subagent's run.
        output: the structured output the run must end with (default: the agent's, else the journal's);
            it also types ``state.output`` of the State the drive returns, whatever type the journal names.
        deps: the driving call's dependencies (``ctx.deps`` in tools, a subagent's too); never journaled.
    """

    def __init__(
        self,
        agent: DrivenAgent,
        store: Store,
        journal: JournalWriter,
        lease: Lease,
        *,
        emit: Callable[[Event], None] | None = None,
        inherited: dict[str, Any] | None = None,
        output: OutputSpec | None = None,
        deps: Any = None,
    ) -> None:
        self.agent = agent
        self.store = store
        self.state = journal.state
        self.gate = StartGate()
        self.writer = Writer(store, lease, journal, self.gate, emit)
        self.trace = self.writer.trace = drive_trace(agent, self.state)  # NO_TRACE unless traced
        self.inbox = InboxWatch(self.writer, agent.poll_interval, self._cancel_children, args_check(agent))
        self.children = Children(agent, self.writer, inherited, _drive_child, deps)
        admitted: dict[str, dict[str, Any]] = {}
        output = output if output is not None else agent.output or _journaled_output(self.state)
        self.state.type_output_with(output)  # the driving agent's type, whoever started the run (DESIGN 18)
        self.model = ModelStep(
            agent,
            self.writer,
            self.inbox,
            output=output,
            admitted=admitted,
            inherited=inherited,
            emit=emit,
        )
        self.tools = ToolStep(agent, self.writer, self.inbox, self.gate, admitted, self.children, deps)
        self.human = (
            HumanStep(agent.human, self.writer, self.inbox, agent.poll_interval) if agent.human else None
        )
        self.inherited = inherited
        self._start_seq = len(self.state.history)  # a run_stopped in force from here on is this drive's
        self._waiting_at_take = False  # a waiting run is returned as it is, without asking anyone
        self._lease_lost = False
        self._closing = False  # closing after an interrupt or error, or done: a lost lease cancels nothing

    async def run(self) -> State:
        """Drive to the next stop and release the run; returns the State."""
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        assert task is not None
        ACTIVE_DRIVES.add((loop, task))
        lease = self.writer.lease
        if lease.expires_at is not None and lease.ttl:
            self.gate.renewer = Renewer(self.store, lease, lease.ttl, lambda: self._lost(loop, task))
            self.gate.renewer.start()
        self.trace.enter()
        try:
            await self._take_over()
            while True:
                await self._drive_until_release()
                if await self._release():
                    return self.state
        except BaseException as exc:
            self._closing = True
            self.trace.failed(exc)
            await self._close_after(exc)
            if self._lease_lost and not isinstance(exc, LeaseLostError):
                raise self._lease_lost_error() from exc  # found before or during the close: still a loss
            raise
        finally:
            self._closing = True
            self.trace.end()
            ACTIVE_DRIVES.discard((loop, task))
            if self.gate.renewer is not None:
                self.gate.renewer.stop()

    async def run_compaction(self) -> State:
        """Consume the inbox, compact, and release: ``agent.compact`` as a short-lived taker."""
        self.trace.enter()
        try:
            await self.inbox.consume()
            await self.model.compact()
            while not await self._release():
                pass
            return self.state
        except BaseException as exc:
            self.trace.failed(exc)
            await self._close_after(exc)
            raise
        finally:
            self.trace.end()

    def _lost(self, loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any]) -> None:
        """The renewer found the lease lost (its thread): mark it, and cancel the drive on its loop."""
        self._lease_lost = True
        loop.call_soon_threadsafe(self._cancel_for_lost_lease, task)

    def _cancel_for_lost_lease(self, task: asyncio.Task[Any]) -> None:
        """Cancel the drive for its lost lease, unless it is already closing or done (on the loop's thread).

        A closing drive is not cancelled: that cancel would cut its close short and be raised instead of
        the loss; the close sees ``_lease_lost`` and raises ``LeaseLostError`` itself.
        """
        if not self._closing:
            task.cancel()

    def _lease_lost_error(self) -> LeaseLostError:
        return LeaseLostError(
            f"run {self.state.id} lease was lost (renewals failed for ttl/2). Fix: nothing; another process "
            "may drive the run now",
            run_id=self.state.id,
        )

    async def _cancel_children(self) -> None:
        await self.tools.cancel_children()

    async def _take_over(self) -> None:
        """Consume first, then recover (DURABILITY 1.3, DESIGN 7)."""
        await self.inbox.consume()
        state, store, writer = self.state, self.store, self.writer
        # A root a worker may claim again: items posted to subagents whose call closed can do nothing.
        if (
            state.parent_id is None
            and state.subagent_calls
            and store.ttl is not None
            and await store.aoperate(skip_orphaned_items, state) > 0
        ):
            writer.act()  # the tree changed: the root's own entries say when it was last acted on
        if state.status in ("running", "failed") and state.resumes_since_progress >= 3:
            writer.act()
            reason = "crash loop: the run was resumed 3 times without progress"
            writer.add(j.RunStopped, status="failed", reason=reason, usage=dict(state.usage))
            await writer.flush()
            return
        self._waiting_at_take = state.status == "waiting" and not await self.children.with_work()
        if state.status in j.FINAL_STATUSES or self._waiting_at_take:
            return  # returned as it is: a changed agent is noted only when the run goes on
        if state.status == "stopped" and self.agent.budget_exceeded(state, self.inherited) is not None:
            return
        check_agent(writer, self.agent)
        recover(
            writer, self.agent
        )  # flushed with the first start or request: a decision and its start share it

    async def _drive_until_release(self) -> None:
        state = self.state
        while (
            state.stopped_seq < self._start_seq and not self.gate.stopping
        ):  # until this drive stops the run
            status = state.status
            if status in j.FINAL_STATUSES:
                return
            if status == "stopped" and self.agent.budget_exceeded(state, self.inherited) is not None:
                return
            if self.human is not None and not self._waiting_at_take:
                await self.human.ask()
                if state.stopped_seq >= self._start_seq or state.status == "cancelled":
                    return
            open_calls = state.open_calls
            runnable = [c.call_id for c in open_calls if c.action in ("run", "retry", "resume_child")]
            if not runnable and open_calls and not self.children.busy:
                runnable = await self.children.with_work()
            if runnable and not self.children.busy:
                await self.tools.run(runnable)
                continue
            if open_calls:  # every open call waits for a person (or a child)
                return
            await self.model.ask()

    async def _release(self) -> bool:
        """Release the run; False when the inbox or journal grew (the caller consumes and drives again)."""
        state = self.state
        if (
            self.writer.acted
            and state.status not in j.STOP_STATUSES
            and state.history[-1].kind != "run_released"
        ):
            reason = "waiting for a decision" if state.status == "waiting" else "stopped with work left"
            self.writer.add(j.RunReleased, reason=reason)
        if await self.writer.release():
            return True
        await self.inbox.consume()
        return False

    async def _close_after(self, exc: BaseException) -> None:
        """After an interrupt or error: abort in-flight unsafe calls, write ``run_released``, release."""
        self.gate.stopping = True
        in_flight = self.tools.interrupted()
        state, writer = self.state, self.writer
        if writer.save_failed is not None:
            await writer.give_up()  # the store refused this append; a retry here would fail the same way
            return
        if isinstance(exc, LeaseLostError) or self._lease_lost:
            await writer.give_up()  # the caller raises the loss
            return
        try:
            if isinstance(exc, asyncio.CancelledError | KeyboardInterrupt | SystemExit):
                lost = await self._lease_gone()
                if lost is not None:  # taken over while this process was paused: nothing of ours to close
                    _note_lost(exc, lost)
                    await writer.give_up()
                    return
                _abort_in_flight(writer, in_flight)
                if writer.acted and state.status not in j.STOP_STATUSES:
                    writer.add(j.RunReleased, reason=f"interrupted ({type(exc).__name__})")
            for _ in range(3):
                if await writer.release():
                    return
                await self.inbox.consume_stopping()
            await writer.give_up()
        except BaseException as save_error:
            if isinstance(save_error, LeaseLostError):
                _note_lost(exc, save_error)
            elif save_error is not exc:
                exc.add_note(f"saving the run also failed: {type(save_error).__name__}: {save_error}")
            await writer.give_up()

    async def _lease_gone(self) -> LeaseLostError | None:
        """After an interrupt: the LeaseLostError when this drive's ttl lease no longer holds the run (it
        lapsed and was taken, or released by its new holder), else None (a lock, or still held)."""
        lease = self.writer.lease
        if lease.expires_at is None:
            return None
        future = self.store.io_threads.run_through(self.store.renew, lease)
        while not future.done():
            try:
                await future  # a second cancel (SIGTERM and the worker's stop) does not cut the answer off
            except asyncio.CancelledError:
                continue
            except Exception:
                break
        error = future.exception()
        if error is None:
            self.writer.lease = future.result()
        return error if isinstance(error, LeaseLostError) else None  # another error: the closing save says


_LOST = "_tether_lease_lost"


def _note_lost(exc: BaseException, lost: LeaseLostError) -> None:
    """Mark an interrupt whose drive found its lease lost (``lease_lost_in`` reads it); it released nothing."""
    setattr(exc, _LOST, lost)
    exc.add_note(f"the run was not released by this process: {lost}")


def lease_lost_in(exc: BaseException) -> LeaseLostError | None:
    """The LeaseLostError a drive found while closing after the interrupt ``exc`` (None: it released the
    run, or tried to): a paused worker stopped after another took its run logs that, not a release."""
    found = getattr(exc, _LOST, None)
    return found if isinstance(found, LeaseLostError) else None


def _abort_in_flight(writer: Writer, in_flight: list[str]) -> None:
    """Close the ``unsafe`` calls an interrupt cut off mid-way (DESIGN 5.4); the others stay open for a resume."""
    state = writer.journal.state
    still_open = {c.call_id for c in state.open_calls}
    for call_id in in_flight:
        record = state.call(call_id)
        if record is None or record.outcome is not None:
            continue
        if (record.effect or "unsafe") == "unsafe" and call_id in still_open:
            text = "aborted: the run was interrupted while this call ran; it may or may not have run"
            writer.add(j.ToolFinished, call_id=call_id, outcome="aborted", content=[text_block(text)])


async def _drive_child(
    agent: DrivenAgent,
    store: Store,
    journal: JournalWriter,
    lease: Lease,
    inherited: dict[str, Any],
    deps: Any,
) -> State:
    """Drive a subagent's run (held by this process) to its next stop, with its parent's deps."""
    return await Drive(agent, store, journal, lease, inherited=inherited, deps=deps).run()


def _journaled_output(state: State) -> OutputSpec | None:
    """The output type a run was started with, when its module is imported here (never imported for it).

    Raises:
        ValueError: the run needs an output type this process does not have.
    """
    if state.output_type is None:
        return None
    target = imported_type(state.output_type)
    if target is None:
        raise ValueError(
            f"run {state.id} was started with output_type {state.output_type}, which is not imported here. "
            "Fix: import it, or pass Agent(output_type=...)"
        )
    return output_spec(target)
