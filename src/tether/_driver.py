"""The driver: takes a held run to its next stop (DESIGN 5, DURABILITY 1-2).

One ``Drive`` per driven run. It consumes the inbox first, recovers open calls from what the journal
recorded, then loops: run the calls that can run, or ask the model, until the run completes, fails, waits
for a person, or is interrupted. Entries are queued on the State and appended by ``flush`` (one append at a
time; whatever was queued meanwhile goes into the next one: group commit).
"""

from __future__ import annotations

import asyncio
import logging
import random
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import orjson

from . import budgets
from . import journal as j
from ._events import EntryEvent, Event, Reset, TextDelta
from ._renewal import ACTIVE_DRIVES, Renewer
from ._subagents import ChildBusy, cancel_tree, child_id_for, child_needs_work, drive_child
from ._tool_runner import call_tool
from .context import build_request
from .errors import LeaseLostError
from .humans import ApprovalQuestion
from .inbox import InboxItem, close_denied, consume
from .messages import Message
from .models.base import ModelReply, ModelRequest
from .output import OUTPUT_TOOL, OutputSpec, OutputValidationError, output_spec
from .state import ABORTED_UNKNOWN, State
from .stores.base import Lease, Store
from .tools import ToolContext, ToolInputError, result_to_blocks

if TYPE_CHECKING:
    from .agent import Agent

__all__ = ["Drive"]

log = logging.getLogger("tether")

_TERMINAL = frozenset({"completed", "cancelled", "failed", "stopped"})
COMPACT_INSTRUCTIONS = "You summarize conversations so that work can continue from the summary alone."
COMPACT_PROMPT = (
    "Summarize the conversation so far for yourself: the task, what was done, the results that matter, "
    "and what is left. Keep names, numbers and decisions exactly."
)
_RETRY_EFFECTS = frozenset({"read_only", "idempotent"})


class Drive:
    """Drives one held run to its next stop."""

    def __init__(
        self,
        agent: Agent,
        store: Store,
        state: State,
        lease: Lease,
        *,
        emit: Callable[[Event], None] | None = None,
        inherited: dict[str, Any] | None = None,
        output: OutputSpec | None = None,
    ) -> None:
        self.agent = agent
        self.store = store
        self.state = state
        self.lease = lease
        self.emit = emit
        self.acted = False
        self.stopping = False
        self.done = False  # this drive wrote a stop
        self.pending_items: list[InboxItem] = []  # read during a model request, journaled after the reply
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.flush_lock = asyncio.Lock()
        self.flush_error: BaseException | None = None
        self.renewer: Renewer | None = None
        self.lease_lost = False
        self.save_failed: BaseException | None = None
        self.inbox_hint: tuple[int, float] = (0, float("-inf"))  # (inbox length, when it was read)
        self.asked: set[str] = set()  # calls this drive asked agent.human about
        self.inherited = inherited  # a parent's remaining budgets (for a subagent's run)
        self.child_busy = False  # a child is held elsewhere: release with its call open
        self.output = output if output is not None else agent.output or _journaled_output(state)
        self.output_failures = 0
        self.cancelling: set[str] = set()  # subagent calls whose child is being cancelled
        self.waiting_at_take = False  # a waiting run is returned as it is, without asking anyone

    # ----------------------------------------------------------------------------------------------
    # Writing

    def act(self) -> None:
        """Queue ``run_resumed`` before this drive's first entry that acts."""
        if not self.acted:
            self.acted = True
            host, pid = j.host_and_pid()
            self.state.queue(
                j.RunResumed, writer=self.state.writer, token=self.lease.token, host=host, pid=pid
            )

    async def flush(self) -> None:
        """Append everything queued; an append in progress always completes, even when cancelled."""
        async with self.flush_lock:
            while self.state.unsaved:
                batch = self.state.next_batch()
                loop = asyncio.get_running_loop()
                future = loop.run_in_executor(self.store.executor, self._append, batch, self.state.info())
                cancelled = False
                while True:
                    try:
                        await asyncio.shield(future)
                        break
                    except asyncio.CancelledError:
                        if future.done():
                            break
                        cancelled = True
                    except Exception:
                        break  # the append failed: settled below
                if future.cancelled() or future.exception() is not None:
                    error = future.exception() if not future.cancelled() else asyncio.CancelledError()
                    assert error is not None
                    if cancelled:
                        raise asyncio.CancelledError() from error
                    self.save_failed = error
                    raise error
                self.state.batch_saved()
                self.save_failed = None
                self.inbox_hint = (future.result(), time.monotonic())
                if self.emit is not None:
                    for entry in batch:
                        self.emit(EntryEvent(entry))
                if cancelled:
                    raise asyncio.CancelledError()

    def _append(self, batch: list[j.Entry], info: dict[str, Any]) -> int:
        """Append a batch, then read the inbox's length in the same trip to the store's thread."""
        self.store.append(
            self.state.id,
            batch,
            expected_seq=batch[0].seq,
            writer=self.state.writer,
            lease_token=self.lease.token,
            info=info,
        )
        return self.store.inbox_length(self.state.id)

    # ----------------------------------------------------------------------------------------------
    # The loop

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

    def _lost(self, loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any]) -> None:
        self.lease_lost = True
        loop.call_soon_threadsafe(task.cancel)

    async def _take_over(self) -> None:
        """Consume first, then recover (DURABILITY 1.3, DESIGN 7)."""
        await self._consume_inbox()
        state = self.state
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
        if state.status in ("completed", "cancelled") or self.waiting_at_take:
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
            if status in ("completed", "cancelled"):
                return
            if status == "stopped" and self.agent.budget_exceeded(state, self.inherited) is not None:
                return
            if self.agent.human is not None and not self.waiting_at_take:
                await self._ask_human()
                if self.done or state.status == "cancelled":
                    return
            runnable = [c.call_id for c in state.open_calls if c.action in ("run", "retry", "resume_child")]
            if not runnable and state.open_calls and not self.child_busy:
                runnable = await self._children_with_work()
            if runnable and not self.child_busy:
                await self._run_calls(runnable)
                continue
            if state.open_calls:  # every open call waits for a person (or a child)
                return
            await self._ask()

    # ----------------------------------------------------------------------------------------------
    # The model

    async def _ask(self) -> None:
        state, agent = self.state, self.agent
        reason = agent.budget_exceeded(state, self.inherited)
        if reason is not None:
            self.act()
            state.queue(j.RunStopped, status="stopped", reason=reason, usage=dict(state.usage))
            self.done = True
            await self.flush()
            return
        self.act()
        if agent.compact_at is not None and state.context_tokens >= agent.compact_at * agent.context_window:
            await self.compact()
            return
        await self.flush()
        schemas = agent.tool_schemas() + ([self.output.schema] if self.output is not None else [])
        request = build_request(state, agent.instructions, schemas)
        deltas = 0

        def on_text(delta: str) -> None:
            nonlocal deltas
            if self.emit is not None:
                self.emit(TextDelta(request.index, deltas, delta))
            deltas += 1
            if agent.on_text is not None:
                agent.on_text(delta)

        if self.emit is not None and state.history and state.history[-1].kind == "model_failed":
            self.emit(Reset(request.index))
        ask = asyncio.ensure_future(agent.model.request(request, on_text))
        try:
            cancelled = await self._watch_for_cancel(ask)
        except BaseException:
            ask.cancel()
            raise
        if cancelled:
            ask.cancel()
            await self._consume_inbox()
            return
        try:
            reply = ask.result()
        except Exception as exc:
            await self._model_failed(exc)
            return
        await self._replied(reply)

    async def compact(self) -> None:
        """Ask the model to summarize the run so far and journal ``compacted`` (between turns only).

        The context is then the first user message, the summary and what follows; the history keeps
        everything. Each failed summary request is journaled ``model_failed(purpose="compaction")``, which
        leaves the run's status alone; retryable failures are retried, the others raised.
        """
        state, agent = self.state, self.agent
        if state.open_calls:
            raise ValueError(
                f"run {state.id} has calls without a result; compaction falls between turns. Fix: resume the "
                "run first"
            )
        self.act()
        failures = 0
        while True:
            await self.flush()
            base = build_request(state, agent.instructions, [])
            ask = [*base.messages, Message.user(COMPACT_PROMPT)]
            request = ModelRequest(base.index, COMPACT_INSTRUCTIONS, ask, [], state.id)
            try:
                reply = await agent.model.request(request, None)
                break
            except Exception as exc:
                retryable = bool(getattr(exc, "retryable", False))
                state.queue(
                    j.ModelFailed,
                    error_type=type(exc).__name__,
                    error=str(exc)[:2000],
                    retryable=retryable,
                    purpose="compaction",
                )
                failures += 1
                if not retryable or failures > agent.model_retries:
                    await self.flush()
                    raise
                await asyncio.sleep(agent.retry_delay_for(failures, getattr(exc, "retry_after", None)))
        summary = "".join(b.get("text", "") for b in reply.content if b.get("type") == "text").strip()
        state.queue(j.Compacted, summary=summary, upto_seq=len(state.history), usage=reply.usage)
        await self.flush()

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

    async def _watch_for_cancel(self, ask: asyncio.Future[ModelReply]) -> bool:
        """Wait for the reply while watching the inbox for a cancel; returns True when one came."""
        while True:
            done, _ = await asyncio.wait({ask}, timeout=self.agent.poll_interval)
            if done:
                return False
            items = await self._read_inbox()
            if items:
                seen = {item.inbox_seq for item in self.pending_items}
                self.pending_items.extend(item for item in items if item.inbox_seq not in seen)
                if any(item.type == "cancel" for item in items):
                    return True

    async def _model_failed(self, exc: Exception) -> None:
        state, agent = self.state, self.agent
        retryable = bool(getattr(exc, "retryable", False))
        state.queue(j.ModelFailed, error_type=type(exc).__name__, error=str(exc)[:2000], retryable=retryable)
        self._journal_pending_items()
        if retryable and state.failures_since_reply <= agent.model_retries:
            await self.flush()
            await asyncio.sleep(
                agent.retry_delay_for(state.failures_since_reply, getattr(exc, "retry_after", None))
            )
            return
        reason = f"{type(exc).__name__}: {exc}"
        state.queue(j.RunStopped, status="failed", reason=reason[:2000], usage=dict(state.usage))
        self.done = True
        try:
            await self.flush()
        except Exception as save_error:
            exc.add_note(f"saving the run also failed: {type(save_error).__name__}: {save_error}")
        raise exc

    async def _replied(self, reply: ModelReply) -> None:
        state = self.state
        seq = len(state.history)
        content: list[dict[str, Any]] = []
        seen_provider_call_ids: set[str] = set()
        index = 0
        for block in reply.content:
            if block.get("type") == "tool_call":
                provider_call_id = block.get("provider_call_id")
                if not provider_call_id or provider_call_id in seen_provider_call_ids:
                    provider_call_id = f"tether_{seq}_{index}"
                seen_provider_call_ids.add(provider_call_id)
                block = {
                    "type": "tool_call",
                    "id": j.call_id_for(seq, index),
                    "name": block.get("name", ""),
                    "args": block.get("args"),
                    "provider_call_id": provider_call_id,
                }
                index += 1
            content.append(block)
        state.queue(
            j.ModelReplied,
            content=content,
            stop_reason=reply.stop_reason,
            usage=reply.usage,
            model=reply.model,
        )
        calls = [b for b in content if b["type"] == "tool_call"]
        results = [b for b in calls if self.output is not None and b["name"] == OUTPUT_TOOL]
        for block in calls:
            if block not in results:
                self._admit(block)
        got_message = self._journal_pending_items()
        if state.status == "cancelled":
            self.done = True
            await self.flush()
            return
        if self.output is not None and (results or not calls):
            await self._final_result(results, content, got_message)
        elif not calls and not got_message:
            text = "".join(b.get("text", "") for b in content if b.get("type") == "text")
            state.queue(j.RunStopped, status="completed", answer=text, usage=dict(state.usage))
            self.done = True
        if not any(c.action in ("run", "retry") for c in state.open_calls):
            await self.flush()

    async def _final_result(
        self, results: list[dict[str, Any]], content: list[dict[str, Any]], got_message: bool
    ) -> None:
        """Check a structured final result: accept it and stop, or send the error back (bounded)."""
        state, output = self.state, self.output
        assert output is not None
        problem = None
        if not results:
            problem = (
                f"the answer must be given by calling {OUTPUT_TOOL}. Fix: call {OUTPUT_TOOL} with the result"
            )
            state.queue(j.MessageAdded, role="user", content=[_text(problem)])
        for extra in results[1:]:
            text = f"only one final result is taken. Fix: call {OUTPUT_TOOL} once"
            state.queue(j.ToolFinished, call_id=extra["id"], outcome="input_error", content=[_text(text)])
        if results:
            try:
                value = output.validate(results[0].get("args"))
            except ValueError as exc:
                problem = str(exc)
                state.queue(
                    j.ToolFinished, call_id=results[0]["id"], outcome="input_error", content=[_text(problem)]
                )
        if problem is not None:
            self.output_failures += 1
            if self.output_failures > self.agent.output_retries:
                reason = f"the final result did not validate after {self.output_failures} tries: {problem}"
                state.queue(j.RunStopped, status="failed", reason=reason, usage=dict(state.usage))
                self.done = True
                await self.flush()
                raise OutputValidationError(f"run {state.id}: {reason}")
            return
        state.queue(
            j.ToolFinished, call_id=results[0]["id"], outcome="done", content=[_text("final result accepted")]
        )
        for call in state.open_calls:
            if call.attempt == 0 and call.action in ("run", "wait"):
                text = "not run: the final result was given"
                state.queue(j.ToolFinished, call_id=call.call_id, outcome="cancelled", content=[_text(text)])
        if got_message:
            return  # a message came in meanwhile: the model is asked again
        dumped = output.dump(value)
        state.queue(
            j.RunStopped,
            status="completed",
            answer=orjson.dumps(dumped).decode(),
            output=dumped,
            output_type=output.type_path,
            usage=dict(state.usage),
        )
        self.done = True

    def _admit(self, block: dict[str, Any]) -> None:
        """Step 1-3 of DESIGN 5.2 for one call: input errors, deny rules, ask rules."""
        state, agent = self.state, self.agent
        call_id, name = block["id"], block["name"]
        tool = agent.tool(name)
        if tool is None:
            text = agent.unknown_tool_text(name)
            state.queue(j.ToolFinished, call_id=call_id, outcome="input_error", content=[_text(text)])
            return
        try:
            tool.validate(block.get("args") if block.get("args") is not None else {})
        except ToolInputError as exc:
            state.queue(j.ToolFinished, call_id=call_id, outcome="input_error", content=[_text(str(exc))])
            return
        decision, reason = agent.permission_for(tool)
        if decision == "deny":
            state.queue(
                j.ToolFinished, call_id=call_id, outcome="denied", content=[_text(f"denied: {reason}")]
            )
        elif decision == "ask":
            state.queue(j.ApprovalRequested, call_id=call_id, round=0, tool=name, args=block.get("args"))

    # ----------------------------------------------------------------------------------------------
    # People

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

    # ----------------------------------------------------------------------------------------------
    # The inbox

    async def _read_inbox(self) -> list[InboxItem]:
        state = self.state
        known = max(state.inbox_consumed, max((i.inbox_seq for i in self.pending_items), default=-1))
        hinted, when = self.inbox_hint
        if hinted <= known + 1 and time.monotonic() - when < self.agent.poll_interval:
            return []  # an append read the inbox's length less than a poll interval ago
        length = await self.store.run_io(self.store.inbox_length, state.id)
        self.inbox_hint = (length, time.monotonic())
        if length <= known + 1:
            return []
        return await self.store.run_io(self.store.read_inbox, state.id, known)

    def _journal_pending_items(self) -> bool:
        """Journal the items read during a model request; returns whether a message was among them."""
        items, self.pending_items = self.pending_items, []
        if items:
            consume(self.state, items)
        return any(item.type == "message" for item in items)

    async def _consume_inbox(self) -> bool:
        """Journal every unconsumed item (as the holder); returns whether there were any."""
        items = self.pending_items + await self._read_inbox()
        self.pending_items = []
        if not items:
            return False
        if any(item.type == "cancel" for item in items) and self.state.status not in _TERMINAL:
            await self._cancel_children()
        consume(self.state, items)
        self.act()
        if self.state.status == "cancelled":
            self.done = True
        return True

    # ----------------------------------------------------------------------------------------------
    # Tools

    async def _run_calls(self, call_ids: list[str]) -> None:
        """Start the calls (one append with whatever is queued), run them together, poll the inbox."""
        for call_id in call_ids:
            self._start(call_id)
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
                    self._start(call_id)
                await self.flush()
                for call_id in started:
                    self._launch(call_id)
        if self.flush_error is not None:
            self.flush_error = None
        await self.flush()

    def _can_start(self) -> bool:
        return not self.stopping and (self.renewer is None or self.renewer.fresh())

    def _start(self, call_id: str) -> None:
        """Queue ``tool_started`` for a call about to run (retries keep the journaled effect and key)."""
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
        state.queue(
            j.ToolStarted,
            call_id=call_id,
            tool=tool.name,
            effect=effect,
            idempotency_key=key,
            attempt=record.attempt + 1,
            max_attempts=limit,
        )

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
        while True:
            ctx = ToolContext(state.id, call_id, record.attempt, record.key or "", tool.name)
            try:
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
                if effect in _RETRY_EFFECTS and record.attempt < limit and self._can_start():
                    self._start(call_id)
                    await self.flush()
                    continue
                if effect in _RETRY_EFFECTS:
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
        if record.outcome is not None or call_id not in {c.call_id for c in state.open_calls}:
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

    async def _children_with_work(self) -> list[str]:
        """Open calls waiting on a child that has something to act on (they are re-entered)."""
        out = []
        for call in self.state.open_calls:
            record = self.state.call(call.call_id)
            if (
                record is not None
                and record.child_id is not None
                and await self.store.run_io(child_needs_work, self.store, record.child_id)
            ):
                out.append(call.call_id)
        return out

    async def _cancel_children(self) -> None:
        """Cancel the open subagent runs before the run's own cancel closes their calls (DURABILITY 6)."""
        for call in self.state.open_calls:
            record = self.state.call(call.call_id)
            if record is None or (record.effect != "resumable" and record.child_id is None):
                continue
            child_id = record.child_id or child_id_for(self.state.id, call.call_id)
            task = self.tasks.get(call.call_id)
            if task is not None:  # this drive holds the child: it sees the cancel within a poll interval
                self.cancelling.add(call.call_id)  # its result is dropped: the cancel closes the call
                await self.store.run_io(self.store.post, child_id, {"type": "cancel", "by": "parent"})
                await asyncio.wait({task})
                self.tasks.pop(call.call_id, None)
            else:
                await self.store.run_io(cancel_tree, self.store, child_id, "parent")

    # ----------------------------------------------------------------------------------------------
    # Stopping

    async def _release(self) -> bool:
        """Release the run; False when the inbox or journal grew (the caller consumes and drives again)."""
        state = self.state
        if self.acted and state.status not in _TERMINAL and state.history[-1].kind != "run_released":
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
        in_flight = list(self.tasks)
        self.tasks = {}
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
                if self.acted and state.status not in _TERMINAL:
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

    async def _give_up(self) -> None:
        try:
            await self.store.run_io(self.store.abandon, self.lease)
        except Exception as exc:  # abandon never raises by contract; a broken store is only logged
            log.warning("releasing run %s failed: %s", self.state.id, exc)


def _journaled_output(state: State) -> OutputSpec | None:
    """The output type a run was started with, when its module is imported here (never imported for it).

    Raises:
        ValueError: the run needs an output type this process does not have.
    """
    if state.output_type is None:
        return None
    module_name, _, qualname = state.output_type.partition(":")
    target: Any = sys.modules.get(module_name)
    for part in qualname.split("."):
        target = getattr(target, part, None) if target is not None else None
    if target is None:
        raise ValueError(
            f"run {state.id} was started with output_type {state.output_type}, which is not imported here. "
            "Fix: import it, or pass Agent(output_type=...)"
        )
    return output_spec(target)


def _text(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def backoff(attempt: int, base: float, retry_after: float | None, cap: float = 30.0) -> float:
    """Exponential backoff with full jitter, never shorter than the provider's ``retry-after``."""
    delay = min(cap, base * (2 ** max(0, attempt - 1)))
    delay = random.uniform(delay / 2, delay)
    return max(delay, retry_after or 0.0)
