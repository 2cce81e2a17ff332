"""Subagents: an Agent in another agent's tools runs as a run of its own (DESIGN 10, DURABILITY 6).

The child's id is derived from its parent's id and call id, so every (re)entry of the call finds the same
child: it is resumed if it exists and has not stopped, created otherwise, and its answer taken if it has
stopped. The parent's driver holds the child for the length of the call. A child that stops ``waiting``
makes the parent journal ``child_waiting``; the parent re-enters the call once the child has work again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from .. import budgets
from .. import journal as j
from ..errors import RunBusyError
from ..messages import text_block
from ..state import State
from ..stores.base import Lease, Owner, Store
from ..stores.operations import child_id_for, child_needs_work
from ..tools import Tool
from ..writing import JournalWriter
from .agent_spec import DrivenAgent
from .otel_trace import child_traceparent
from .writer import Writer

__all__ = ["ChildBusy", "ChildOutcome", "Children", "DriveChild", "subagent_tool"]

log = logging.getLogger("tether")

DriveChild = Callable[[DrivenAgent, Store, JournalWriter, Lease, dict[str, Any], Any], Awaitable[State]]
"""Drives a child run this process holds to its next stop: ``(agent, store, writer, lease, inherited,
deps)``."""


def subagent_tool(agent: DrivenAgent) -> Tool:
    """The tool a parent's model sees for ``agent``: its name and description, one ``prompt`` argument."""
    if not agent.description:
        raise ValueError(
            f"agent {agent.name} is used as a subagent but has no description. Fix: Agent(..., name=..., "
            "description='what it does') so the model knows when to call it"
        )

    def delegate(prompt: str) -> str:
        """Hand a task to the subagent.

        Args:
            prompt: The task, with everything the subagent needs to know.
        """
        raise RuntimeError("a subagent call is driven by tether, never invoked directly")

    return Tool(delegate, name=agent.name, description=agent.description, effect="resumable")


class ChildBusy(Exception):
    """The child run is held by another live process: the parent releases with the call open."""


@dataclass(frozen=True, slots=True)
class ChildOutcome:
    """How a subagent call ended: a result for ``tool_finished``, or None when the child waits."""

    outcome: str | None
    content: list[dict[str, Any]]
    usage: dict[str, int]
    pending: list[dict[str, Any]]
    child_id: str


class Children:
    """The subagent runs of one driven run: entering their calls, and finding those with work.

    Args:
        agent: the parent's agent.
        writer: the parent run's writer task.
        inherited: the parent's own inherited budgets (a subagent of a subagent).
        drive_child: drives a child run to its next stop (the driver, injected so this module does not
            import it).
        deps: the parent's dependencies; a subagent's tools get the same object (DESIGN 18).

    Attributes:
        busy: a child is held by another live process; the parent releases with that call open.
    """

    def __init__(
        self,
        agent: DrivenAgent,
        writer: Writer,
        inherited: dict[str, Any] | None,
        drive_child: DriveChild,
        deps: Any = None,
    ) -> None:
        self.agent = agent
        self.deps = deps
        self.writer = writer
        self.inherited = inherited
        self.drive_child = drive_child
        self.busy = False

    async def enter(
        self, call_id: str, prompt: str, sub: DrivenAgent
    ) -> tuple[str, list[dict[str, Any]], dict[str, int]] | None:
        """Drive the subagent run of ``call_id``; None when it waits (``child_waiting``) or is busy."""
        state, agent, store = self.writer.journal.state, self.agent, self.writer.store
        limits = budgets.tighter(agent.budgets(), self.inherited) if self.inherited else agent.budgets()
        left = budgets.remaining(limits, state.turn, state.usage, agent.price)
        try:
            result = await self._drive(state, call_id, prompt, sub, store, left)
        except ChildBusy as exc:
            log.warning("run %s: %s; releasing with call %s open", state.id, exc, call_id)
            self.busy = True
            return None
        if result.outcome is None:
            self.writer.add(j.ChildWaiting, call_id=call_id, child_id=result.child_id, pending=result.pending)
            await self.writer.flush()
            return None
        return result.outcome, result.content, result.usage

    async def with_work(self) -> list[str]:
        """Open calls waiting on a child that has something to act on (they are re-entered)."""
        state, store = self.writer.journal.state, self.writer.store
        out = []
        for call in state.open_calls:
            record = state.call(call.call_id)
            if (
                record is not None
                and record.child_id is not None
                and await store.aoperate(child_needs_work, record.child_id)
            ):
                out.append(call.call_id)
        return out

    async def _drive(
        self,
        parent: State,
        call_id: str,
        prompt: str,
        sub: DrivenAgent,
        store: Store,
        inherited: dict[str, Any],
    ) -> ChildOutcome:
        """Create or resume the child of ``call_id`` and drive it to its next stop."""
        child_id = child_id_for(parent.id, call_id)
        owner = Owner.here()
        lease = await _create_child(parent, call_id, child_id, prompt, sub, store, owner)
        if lease is None:
            child = await store.aload(child_id)
            if child.status in j.STOP_STATUSES and not await _has_items(store, child):
                return _outcome(child)
            lease = await _claim_child(store, child_id, owner, sub, self.agent.poll_interval)
        state = await store.aload(child_id)
        try:
            journal = JournalWriter(state, owner.writer)
            child = await self.drive_child(sub, store, journal, lease, inherited, self.deps)
        except (asyncio.CancelledError, KeyboardInterrupt, SystemExit):
            raise
        except Exception:
            child = await store.aload(child_id)  # a failed child: its run_stopped says why
            if child.status not in j.STOP_STATUSES:
                raise
        return _outcome(child)


async def _create_child(
    parent: State, call_id: str, child_id: str, prompt: str, sub: DrivenAgent, store: Store, owner: Owner
) -> Lease | None:
    writer = JournalWriter(State(id=child_id), owner.writer)
    writer.add(
        j.RunStarted,
        agent=sub.name,
        fingerprint=sub.fingerprint(),
        budgets=sub.budgets(),
        parent_id=parent.id,
        root_id=parent.root_id or parent.id,
        parent_call_id=call_id,
        traceparent=child_traceparent(sub),
        metadata=dict(parent.metadata),  # inherited (DESIGN 18), so a tree lists under its root's metadata
    )
    writer.add(j.MessageAdded, role="user", content=[text_block(prompt)])
    batch = writer.next_batch()
    ttl = sub.lease_ttl_for(store)
    try:
        return await store.acreate(child_id, batch, writer.state.info(), owner=owner, ttl=ttl)
    except ValueError:
        if await store.aexists(child_id):
            return None  # made by an earlier entry of this call
        raise


async def _claim_child(store: Store, child_id: str, owner: Owner, sub: DrivenAgent, poll: float) -> Lease:
    """Take the child, waiting up to its lease's ttl for a dead holder's lease to expire (DURABILITY 6)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + (store.ttl or 0.0)
    while True:
        try:
            return await store.aclaim(child_id, owner, sub.lease_ttl_for(store))
        except RunBusyError as exc:
            if loop.time() >= deadline:
                raise ChildBusy(str(exc)) from exc
            await asyncio.sleep(min(poll, max(0.01, deadline - loop.time())))


async def _has_items(store: Store, child: State) -> bool:
    return bool(await store.ainbox_length(child.id) > child.inbox_consumed + 1)


def _outcome(child: State) -> ChildOutcome:
    usage = dict(child.usage)
    if child.status == "completed":
        return ChildOutcome("done", [text_block(child.answer or "")], usage, [], child.id)
    if child.status == "waiting":
        pending = [
            {
                "call_id": p.call_id,
                "tool": p.tool,
                "args": p.args,
                "round": p.round,
                "asked_at": p.asked_at,
                "question": p.question,
                "run_id": p.run_id,
            }
            for p in child.pending_approvals
        ]
        return ChildOutcome(None, [], usage, pending, child.id)
    if child.status == "cancelled":
        return ChildOutcome("aborted", [text_block("subagent cancelled")], usage, [], child.id)
    text = f"subagent run {child.id} {child.status}: {child.reason or 'no reason given'}"
    return ChildOutcome("error", [text_block(text)], usage, [], child.id)
