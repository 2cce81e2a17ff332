"""Subagents: an Agent in another agent's tools runs as a run of its own (DESIGN 10, DURABILITY 6).

The child's id is derived from its parent's id and call id, so every (re)entry of the call finds the same
child: it is resumed if it exists and has not stopped, created otherwise, and its answer taken if it has
stopped. The parent's driver holds the child for the length of the call. A child that stops ``waiting``
makes the parent journal ``child_waiting``; the parent re-enters the call once the child has work again.
"""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import journal as j
from ..errors import RunBusyError, RunNotFoundError
from ..messages import text_block
from ..state import State
from ..stores.base import Lease, Owner, Store
from ..tools import Tool

if TYPE_CHECKING:
    from ..agent import Agent

__all__ = ["ChildBusy", "ChildOutcome", "child_id_for", "child_needs_work", "drive_child", "subagent_tool"]


def child_id_for(parent_id: str, call_id: str) -> str:
    """The child run's id: ``parent_id[:64] + "-" + sha256(parent_id NUL call_id)[:24]``."""
    digest = hashlib.sha256(f"{parent_id}\x00{call_id}".encode()).hexdigest()[:24]
    return f"{parent_id[:64]}-{digest}"


def subagent_tool(agent: Agent) -> Tool:
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


async def drive_child(
    parent: State, call_id: str, prompt: str, sub: Agent, store: Store, inherited: dict[str, Any], poll: float
) -> ChildOutcome:
    """Create or resume the child of ``call_id`` and drive it to its next stop."""
    from .drive import Drive

    child_id = child_id_for(parent.id, call_id)
    owner = Owner.here()
    lease = await _create_child(parent, call_id, child_id, prompt, sub, store, owner)
    if lease is None:
        child = await store.run_io(store.load, child_id)
        if child.status in j.STOP_STATUSES and not await _has_items(store, child):
            return _outcome(child)
        lease = await _claim_child(store, child_id, owner, sub, poll)
    state = await store.run_io(store.load, child_id)
    state.writer = owner.writer
    try:
        child = await Drive(sub, store, state, lease, inherited=inherited).run()
    except (asyncio.CancelledError, KeyboardInterrupt, SystemExit):
        raise
    except Exception:
        child = await store.run_io(store.load, child_id)  # a failed child: its run_stopped says why
        if child.status not in j.STOP_STATUSES:
            raise
    return _outcome(child)


async def _create_child(
    parent: State, call_id: str, child_id: str, prompt: str, sub: Agent, store: Store, owner: Owner
) -> Lease | None:
    state = State(id=child_id)
    state.writer = owner.writer
    state.queue(
        j.RunStarted,
        agent=sub.name,
        fingerprint=sub.fingerprint(),
        budgets=sub.budgets(),
        parent_id=parent.id,
        root_id=parent.root_id or parent.id,
        parent_call_id=call_id,
    )
    state.queue(j.MessageAdded, role="user", content=[text_block(prompt)])
    batch = state.next_batch()
    ttl = sub._ttl(store)
    try:
        return await store.run_io(store.create, child_id, batch, state.info(), owner=owner, ttl=ttl)
    except ValueError:
        if await store.run_io(store.exists, child_id):
            return None  # made by an earlier entry of this call
        raise


async def _claim_child(store: Store, child_id: str, owner: Owner, sub: Agent, poll: float) -> Lease:
    """Take the child, waiting up to its lease's ttl for a dead holder's lease to expire (DURABILITY 6)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + (store.ttl or 0.0)
    while True:
        try:
            return await store.run_io(store.claim, child_id, owner, sub._ttl(store))
        except RunBusyError as exc:
            if loop.time() >= deadline:
                raise ChildBusy(str(exc)) from exc
            await asyncio.sleep(min(poll, max(0.01, deadline - loop.time())))


async def _has_items(store: Store, child: State) -> bool:
    return bool(await store.run_io(store.inbox_length, child.id) > child.inbox_consumed + 1)


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


def child_needs_work(store: Store, child_id: str) -> bool:
    """Whether a waiting child (or one of its own children) has something to act on (DURABILITY 6)."""
    try:
        child = store.load(child_id)
    except RunNotFoundError:
        return True  # re-entering the call creates it
    if child.status != "waiting":
        return True
    if store.inbox_length(child_id) > child.inbox_consumed + 1:
        return True
    return any(
        call.child_id is not None and child_needs_work(store, call.child_id)
        for call in (child.call(c.call_id) for c in child.open_calls)
        if call is not None
    )


def cancel_tree(store: Store, run_id: str, by: str | None = None, by_parent: bool = False) -> State | None:
    """Cancel a run and, first, every open subagent run under it (DURABILITY 6).

    Each run gets a cancel item in its inbox and is settled at once when no one holds it (a held run's
    driver acts on it within its poll interval). ``by_parent`` lets a parent's cancel take its child
    (DURABILITY 6: a child is otherwise reached only through its root). Returns the run as settled, or
    None when it is held.
    """
    state = store.load(run_id)
    if state.status not in j.STOP_STATUSES:
        for call in state.open_calls:
            record = state.call(call.call_id)
            if record is not None and (record.effect == "resumable" or record.child_id is not None):
                child_id = record.child_id or child_id_for(run_id, call.call_id)
                if store.exists(child_id):
                    cancel_tree(store, child_id, by, by_parent=True)
    store.post(run_id, {"type": "cancel", "by": by, "seen_seq": len(state.history)})
    return store.settle(run_id, by_parent=by_parent)


def skip_orphaned_items(store: Store, root: State) -> int:
    """Journal as skipped the inbox items of subagent runs whose call in their parent has closed.

    Such items can have no effect (no one will drive that child again), and left unconsumed they would make
    ``claim_next`` offer the tree's root for ever. Returns how many runs were settled this way.
    """
    from ..inbox import skip_all

    settled = 0
    for info in store.list(root_id=root.id, limit=10_000):
        if info.parent_id is None or info.inbox_len <= info.inbox_consumed + 1:
            continue
        parent = root if info.parent_id == root.id else store.load(info.parent_id)
        child = store.load(info.id)
        record = parent.call(child.parent_call_id or "")
        if record is not None and record.outcome is None:
            continue  # the call is open: the parent's driver re-enters it and the child consumes them
        try:
            lease = store.claim(info.id, Owner.here(), store.ttl)
        except RunBusyError:
            continue
        try:
            child = store.load(info.id)
            child.writer = lease.owner.writer
            while True:
                skip_all(
                    child, store.read_inbox(info.id, child.inbox_consumed), "the subagent call is closed"
                )
                store.append_state(child, lease)
                if store.release(lease, at_seq=len(child.history), inbox_len=child.inbox_consumed + 1):
                    break
        except BaseException:
            store.abandon(lease)
            raise
        settled += 1
    return settled
