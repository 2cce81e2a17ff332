"""Asking the model: budgets, compaction, retries, and the per-reply order of DESIGN 5.2."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

import orjson

from .. import journal as j
from ..context import build_request
from ..events import Reset, TextDelta
from ..messages import Message
from ..models.base import ModelReply, ModelRequest
from ..output import OUTPUT_TOOL, OutputValidationError
from ..tools import ToolInputError

if TYPE_CHECKING:
    pass

from ..messages import text_block as _text
from .core import COMPACT_INSTRUCTIONS, COMPACT_PROMPT, DriveCore

__all__ = ["ModelSteps"]

log = logging.getLogger("tether")


class ModelSteps(DriveCore):
    """The steps of a drive that ask the model and journal its reply."""

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
            self.validated[call_id] = tool.validate(
                block.get("args") if block.get("args") is not None else {}
            )
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
