"""Asking the model: budgets, compaction, retries, and the per-reply order of DESIGN 5.2."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

import orjson

from .. import journal as j
from ..context import build_request
from ..errors import UnencodableError
from ..events import Event, Reset, Retrying, TextDelta
from ..messages import Message
from ..messages import text_block as _text
from ..models.base import ModelReply, ModelRequest
from ..output import OUTPUT_TOOL, OutputSpec, OutputValidationError
from ..tools import ToolInputError
from .agent_spec import DrivenAgent
from .inbox import InboxWatch
from .request_watch import CANCELLED, await_watched
from .spans import NO_SPAN
from .writer import Writer

__all__ = ["COMPACT_INSTRUCTIONS", "COMPACT_PROMPT", "ModelStep", "backoff"]

COMPACT_INSTRUCTIONS = "You summarize conversations so that work can continue from the summary alone."
COMPACT_PROMPT = (
    "Summarize the conversation so far for yourself: the task, what was done, the results that matter, "
    "and what is left. Keep names, numbers and decisions exactly."
)


def backoff(attempt: int, base: float, retry_after: float | None, cap: float = 30.0) -> float:
    """Exponential backoff with full jitter, never shorter than the provider's ``retry-after``."""
    delay = min(cap, base * (2 ** max(0, attempt - 1)))
    delay = random.uniform(delay / 2, delay)
    return max(delay, retry_after or 0.0)


class ModelStep:
    """Asks the model for one driven run and journals its reply (DESIGN 5.2, 5.5).

    Args:
        agent: the driving agent.
        writer: the run's writer task.
        inbox: the run's inbox watch (a cancel abandons a request in flight; other items wait for its reply).
        output: the structured output the run must end with, or None.
        admitted: filled with each call's validated arguments as a reply is planned; the tool step takes
            them from there instead of validating again.
        inherited: a parent's remaining budgets (for a subagent's run).
        emit: where text deltas and resets go (``agent.stream``).
    """

    def __init__(
        self,
        agent: DrivenAgent,
        writer: Writer,
        inbox: InboxWatch,
        *,
        output: OutputSpec | None,
        admitted: dict[str, dict[str, Any]],
        inherited: dict[str, Any] | None = None,
        emit: Callable[[Event], None] | None = None,
    ) -> None:
        self.agent = agent
        self.writer = writer
        self.state = writer.journal.state
        self.inbox = inbox
        self.output = output
        self.admitted = admitted
        self.inherited = inherited
        self.emit = emit
        self.output_failures = 0

    async def ask(self) -> None:
        """Ask the model once (or compact, or stop on a budget) and journal what comes back."""
        state, agent = self.state, self.agent
        reason = agent.budget_exceeded(state, self.inherited)
        if reason is not None:
            self.writer.act()
            self.writer.add(j.RunStopped, status="stopped", reason=reason, usage=dict(state.usage))
            await self.writer.flush()
            return
        self.writer.act()
        if agent.compact_at is not None and state.context_tokens >= agent.compact_at * agent.context_window:
            await self.compact()
            return
        await self.writer.flush()
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
        span = self.writer.trace.chat(request)
        if span is NO_SPAN:  # awaited in this task; the inbox is read only once the request waits
            reply = await await_watched(
                agent.model.request(request, on_text), self.inbox, agent.poll_interval
            )
        else:  # traced: the request runs in a task of its own, with its span current there
            reply = await self._traced(span.task(agent.model.request(request, on_text)))
        if reply is CANCELLED:
            await self.inbox.consume()
            return
        if isinstance(reply, Exception):
            await self._model_failed(reply)
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
        self.writer.act()
        failures = 0
        while True:
            await self.writer.flush()
            base = build_request(state, agent.instructions, [])
            ask = [*base.messages, Message.user(COMPACT_PROMPT)]
            request = ModelRequest(base.index, COMPACT_INSTRUCTIONS, ask, [], state.id)
            try:
                reply = await self.writer.trace.chat(request, "compaction").task(
                    agent.model.request(request, None)
                )
                break
            except Exception as exc:
                retryable = bool(getattr(exc, "retryable", False))
                self.writer.add(
                    j.ModelFailed,
                    error_type=type(exc).__name__,
                    error=str(exc)[:2000],
                    retryable=retryable,
                    purpose="compaction",
                )
                failures += 1
                if not retryable or failures > agent.model_retries:
                    await self.writer.flush()
                    raise
                await self._retry_after(exc, failures)
        summary = "".join(b.get("text", "") for b in reply.content if b.get("type") == "text").strip()
        self.writer.add(j.Compacted, summary=summary, upto_seq=len(state.history), usage=reply.usage)
        await self.writer.flush()

    async def _traced(self, ask: asyncio.Task[ModelReply]) -> ModelReply | Exception:
        """Wait for a request's task while watching the inbox for a cancel.

        Returns:
            The reply, the exception the request raised, or ``CANCELLED`` when a cancel came in.
        """
        try:
            while True:
                done, _ = await asyncio.wait({ask}, timeout=self.agent.poll_interval)
                if done:
                    error = None if ask.cancelled() else ask.exception()
                    return error if isinstance(error, Exception) else ask.result()
                items = await self.inbox.read()
                if items:
                    self.inbox.hold(items)
                    if any(item.type == "cancel" for item in items):
                        ask.cancel()
                        return CANCELLED
        except BaseException:
            ask.cancel()
            raise

    async def _model_failed(self, exc: Exception) -> None:
        state, agent = self.state, self.agent
        retryable = bool(getattr(exc, "retryable", False))
        self.writer.add(
            j.ModelFailed, error_type=type(exc).__name__, error=str(exc)[:2000], retryable=retryable
        )
        self.inbox.journal_held()
        if retryable and state.failures_since_reply <= agent.model_retries:
            await self.writer.flush()
            await self._retry_after(exc, state.failures_since_reply)
            return
        reason = f"{type(exc).__name__}: {exc}"
        self.writer.add(j.RunStopped, status="failed", reason=reason[:2000], usage=dict(state.usage))
        try:
            await self.writer.flush()
        except Exception as save_error:
            exc.add_note(f"saving the run also failed: {type(save_error).__name__}: {save_error}")
        raise exc

    async def _retry_after(self, exc: Exception, failures: int) -> None:
        """Wait before asking again after ``failures`` retryable failures in a row, saying so to ``emit``."""
        agent = self.agent
        delay = agent.retry_delay_for(failures, getattr(exc, "retry_after", None))
        if self.emit is not None:
            status = getattr(exc, "status_code", None)
            self.emit(
                Retrying(
                    request=self.state.requests,
                    attempt=failures + 1,
                    attempts=agent.model_retries + 1,
                    delay=delay,
                    error_type=type(exc).__name__,
                    error=str(exc),
                    status_code=status if isinstance(status, int) else None,
                )
            )
        await asyncio.sleep(delay)

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
        try:
            entry = self.writer.add(
                j.ModelReplied,
                content=content,
                stop_reason=reply.stop_reason,
                usage=reply.usage,
                model=reply.model,
            )
        except UnencodableError as exc:  # a request that cannot succeed as it is: the run fails, saying why
            await self._model_failed(exc)
            return
        assert isinstance(entry, j.ModelReplied)
        content = entry.content  # as journaled (lone surrogates replaced): what a resumed run plans from
        calls = [b for b in content if b["type"] == "tool_call"]
        results = [b for b in calls if self.output is not None and b["name"] == OUTPUT_TOOL]
        for block in calls:
            if block not in results:
                self._admit(block)
        got_message = self.inbox.journal_held()
        if state.status == "cancelled":
            await self.writer.flush()
            return
        if self.output is not None and (results or not calls):
            await self._final_result(results, content, got_message)
        elif not calls and not got_message:
            text = "".join(b.get("text", "") for b in content if b.get("type") == "text")
            self.writer.add(j.RunStopped, status="completed", answer=text, usage=dict(state.usage))
        if not any(c.action in ("run", "retry") for c in state.open_calls):
            await self.writer.flush()

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
            self.writer.add(j.MessageAdded, role="user", content=[_text(problem)])
        for extra in results[1:]:
            text = f"only one final result is taken. Fix: call {OUTPUT_TOOL} once"
            self.writer.add(j.ToolFinished, call_id=extra["id"], outcome="input_error", content=[_text(text)])
        if results:
            try:
                value = output.validate(results[0].get("args"))
                dumped = output.dump(value)
                answer = orjson.dumps(dumped).decode()
            except ValueError as exc:
                problem = str(exc)
            except TypeError as exc:  # valid, but no journal can hold it (an integer beyond 64 bits)
                problem = (
                    f"the final result cannot be journaled: {exc}. Fix: call {OUTPUT_TOOL} with JSON values"
                )
            if problem is not None:
                self.writer.add(
                    j.ToolFinished, call_id=results[0]["id"], outcome="input_error", content=[_text(problem)]
                )
        if problem is not None:
            self.output_failures += 1
            if self.output_failures > self.agent.output_retries:
                reason = f"the final result did not validate after {self.output_failures} tries: {problem}"
                self.writer.add(j.RunStopped, status="failed", reason=reason, usage=dict(state.usage))
                await self.writer.flush()
                raise OutputValidationError(f"run {state.id}: {reason}")
            return
        self.writer.add(
            j.ToolFinished, call_id=results[0]["id"], outcome="done", content=[_text("final result accepted")]
        )
        for call in state.open_calls:
            if call.attempt == 0 and call.action in ("run", "wait"):
                text = "not run: the final result was given"
                self.writer.add(
                    j.ToolFinished, call_id=call.call_id, outcome="cancelled", content=[_text(text)]
                )
        if got_message:
            return  # a message came in meanwhile: the model is asked again
        self.writer.add(
            j.RunStopped,
            status="completed",
            answer=answer,
            output=dumped,
            output_type=output.type_path,
            usage=dict(state.usage),
        )

    def _admit(self, block: dict[str, Any]) -> None:
        """Step 1-3 of DESIGN 5.2 for one call: input errors, deny rules, ask rules."""
        agent = self.agent
        call_id, name = block["id"], block["name"]
        tool = agent.tools.get(name)
        if tool is None:
            text = agent.unknown_tool_text(name)
            self.writer.add(j.ToolFinished, call_id=call_id, outcome="input_error", content=[_text(text)])
            return
        try:
            kwargs = tool.validate(block.get("args") if block.get("args") is not None else {})
        except ToolInputError as exc:
            self.writer.add(j.ToolFinished, call_id=call_id, outcome="input_error", content=[_text(str(exc))])
            return
        self.admitted[call_id] = kwargs
        # Conditions are evaluated here and only here: the append holding model_replied records the
        # outcome (an approval_requested, or none), so a recovered run never evaluates them again.
        decision, reason = agent.permission_for(tool, tool.arguments(kwargs))
        if decision == "deny":
            self.writer.add(
                j.ToolFinished, call_id=call_id, outcome="denied", content=[_text(f"denied: {reason}")]
            )
        elif decision == "ask":
            self.writer.add(
                j.ApprovalRequested,
                call_id=call_id,
                round=0,
                tool=name,
                args=block.get("args"),
                question=reason or None,
            )
