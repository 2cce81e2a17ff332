"""What every store does by way of its primitives: load, save, settle, cancel, follow, fork (DESIGN 8.1).

``Store``'s built-on methods call these functions, so a new store gets them by implementing the
primitives. They fold (``State.replay``) and journal inbox items (``tether._consume``) above the store,
never inside it: a concrete store only keeps entries. Each is a coroutine over a ``Face`` (``stores/_face.py``), the primitives as awaitables: ``Store``
runs it over its sync primitives with ``run_sync`` (``load``) or over its async twins (``aload``), so each
operation is written once for both faces. This module does not import ``stores.base`` (which imports it).
"""

from __future__ import annotations

import builtins
import dataclasses
import gc
import hashlib
from collections.abc import AsyncIterator, Sequence
from typing import Any, TypeVar

from .. import journal as j
from .._consume import consume, skip_all
from ..errors import ConflictError, RunBusyError, RunNotFoundError
from ..state import State
from ..writing import JournalWriter
from ._face import Face
from ._listing import ListCursor
from ._records import Lease, Owner, RunInfo

__all__ = [
    "append_missing",
    "cancel_tree",
    "catch_up",
    "check_state",
    "child_id_for",
    "child_needs_work",
    "exists",
    "follow",
    "fork",
    "fork_boundary",
    "ids_matching",
    "list_page",
    "load",
    "save",
    "settle",
    "skip_orphaned_items",
    "stored_length",
    "write_all",
]

T = TypeVar("T")


def child_id_for(parent_id: str, call_id: str) -> str:
    """A subagent call's run id: ``parent_id[:64] + "-" + sha256(parent_id NUL call_id)[:24]`` (DESIGN 10)."""
    digest = hashlib.sha256(f"{parent_id}\x00{call_id}".encode()).hexdigest()[:24]
    return f"{parent_id[:64]}-{digest}"


# --------------------------------------------------------------------------------------------------
# Reading


async def load(store: Face, run_id: str) -> State:
    """The run as its journal says: pure replay; never writes, never recovers."""
    j.validate_run_id(run_id)
    collecting = gc.isenabled()
    gc.disable()  # replay allocates many small objects and no cycles: the collector only slows it
    try:
        state = State.replay(run_id, await store.read(run_id))
    finally:
        if collecting:
            gc.enable()
    state.store_identity = store.identity
    return state


async def catch_up(store: Face, state: State) -> None:
    """Fold into ``state`` the durable entries it has not seen."""
    for entry in await store.read(state.id, after_seq=len(state.history) - 1):
        state.apply(entry)


async def exists(store: Face, run_id: str) -> bool:
    """Whether the store has the run."""
    try:
        await store.length(run_id)
    except RunNotFoundError:
        return False
    return True


def check_state(store: Face, state: State) -> None:
    """Refuse a State that belongs to another store.

    Raises:
        ValueError: ``state`` was saved in, or loaded from, another store.
    """
    if state.store_identity is not None and state.store_identity != store.identity:
        raise ValueError(
            f"run {state.id} was saved in {state.store_identity}, not in {store.identity}. Fix: use the store "
            "it came from (one State, one store)"
        )


async def follow(store: Face, run_id: str, after_seq: int, poll_interval: float) -> AsyncIterator[j.Entry]:
    """Replay, then tail, the entries of a run driven elsewhere (see ``Store.follow``)."""
    state = await load(store, run_id)  # the fold tells whether the run has stopped
    last = after_seq
    for entry in state.history[after_seq + 1 :]:
        last = entry.seq
        yield entry
    from asyncio import sleep  # here, not at the top: ``import tether`` loads no asyncio

    while state.status not in j.STOP_STATUSES:
        await sleep(poll_interval)
        for entry in await store.read(run_id, last):
            state.apply(entry)
            last = entry.seq
            yield entry


# --------------------------------------------------------------------------------------------------
# Writing


async def write_all(store: Face, writer: JournalWriter, lease: Lease | None) -> None:
    """Append every entry ``writer`` has not saved yet (its batch in flight first, byte-identical)."""
    state = writer.state
    while writer.unsaved:
        batch = writer.next_batch()
        await store.append(
            state.id,
            batch,
            expected_seq=batch[0].seq,
            writer=writer.writer_id,
            lease_token=lease.token if lease else None,
            info=state.info(),
        )
        writer.batch_saved()


async def stored_length(store: Face, state: State) -> int:
    """The stored journal's length, once checked to continue what ``state`` holds.

    Raises:
        ConflictError: the journal holds another entry where ``state`` has one it did not read from the
            store (another writer went on with the run meanwhile).
    """
    stored = await store.length(state.id)
    shared = min(stored, len(state.history))
    if shared:
        theirs = (await store.read(state.id, after_seq=shared - 2))[0]
        if theirs.h != state.history[shared - 1].h:
            raise ConflictError(
                f"run {state.id} seq {theirs.seq} holds a {theirs.kind} entry this State does not have. Fix: "
                "store.load(id) again and continue from there",
                run_id=state.id,
                seq=theirs.seq,
            )
    return stored


async def append_missing(store: Face, state: State, lease: Lease) -> None:
    """As the holder of ``lease``, append the entries ``state`` holds past the stored journal.

    Such entries come from a drive that failed to save them. They are sealed again by the lease's writer:
    the store never got them, so no byte-identical retry is owed, and ``state`` then holds the sealed
    copies the store keeps.

    Raises:
        ConflictError: see ``stored_length``; nothing is written.
    """
    stored = await stored_length(store, state)
    if stored >= len(state.history):
        return
    missing = j.seal(
        state.history[stored:], lease.owner.writer, run_id=state.id, version=state.format_version
    )
    await store.append(
        state.id,
        missing,
        expected_seq=stored,
        writer=lease.owner.writer,
        lease_token=lease.token,
        info=state.info(),
    )
    state.take_sealed(missing)


async def save(store: Face, state: State) -> State:
    """Write what the store lacks (see ``Store.save``)."""
    check_state(store, state)
    if not state.history:
        initial = State(id=state.id)
        writer = JournalWriter(initial)
        writer.add(j.RunStarted, root_id=state.id)
        for message in state.messages:
            writer.add(j.MessageAdded, role=message.role, content=list(message.content))
        batch = writer.next_batch()
        await store.create(state.id, batch, initial.info())
        for entry in batch:
            state.apply(entry)
        state.store_identity = store.identity
        return state
    changes = state.take_local_changes()
    if await stored_length(store, state) < len(state.history):
        lease = await store.claim(state.id, Owner.here(), store.ttl)
        try:
            await append_missing(store, state, lease)
        finally:
            await store.abandon(lease)
    for item in changes:
        target = item.get("run_id") or state.id  # a decision on a subagent's call goes to its inbox
        run_h = state.history[0].h if target == state.id else None
        body = {k: v for k, v in item.items() if k != "run_id"}
        await store.post(target, {**body, "run_h": run_h}, item_id=item["item_id"])
    state.local_changes_posted()
    if changes:
        await settle(store, state.id)
    await catch_up(store, state)
    state.store_identity = store.identity
    return state


async def settle(store: Face, run_id: str, *, by_parent: bool = False) -> State | None:
    """Take the run if no one holds it, journal its inbox, release it (see ``Store.settle``)."""
    entries = await store.read(run_id)
    first = entries[0] if entries else None
    if isinstance(first, j.RunStarted) and first.parent_id is not None and not by_parent:
        return None
    try:
        lease: Lease | None = await store.claim(run_id, Owner.here(), store.ttl)
    except RunBusyError:
        return None
    assert lease is not None
    try:
        state = State.replay(run_id, entries)
        await catch_up(store, state)
        writer = JournalWriter(state, lease.owner.writer)
        while True:
            consume(writer, await store.read_inbox(run_id, after_seq=state.inbox_consumed))
            await write_all(store, writer, lease)
            if await store.release(lease, at_seq=len(state.history), inbox_len=state.inbox_consumed + 1):
                lease = None
                state.store_identity = store.identity
                return state
    finally:
        if lease is not None:
            await store.abandon(lease)


async def cancel_tree(
    store: Face, run_id: str, by: str | None = None, by_parent: bool = False
) -> State | None:
    """Cancel a run and, first, every open subagent run under it (DURABILITY 6).

    Each run gets a cancel item in its inbox and is settled at once when no one holds it (a held run's
    driver acts on it within its poll interval). ``by_parent`` lets a parent's cancel take its child
    (DURABILITY 6: a child is otherwise reached only through its root). Returns the run as settled, or
    None when it is held.
    """
    state = await load(store, run_id)
    if state.status not in j.STOP_STATUSES:
        for call in state.open_calls:
            record = state.call(call.call_id)
            if record is not None and (record.effect == "resumable" or record.child_id is not None):
                child_id = record.child_id or child_id_for(run_id, call.call_id)
                if await exists(store, child_id):
                    await cancel_tree(store, child_id, by, by_parent=True)
    await store.post(run_id, {"type": "cancel", "by": by, "seen_seq": len(state.history)})
    return await settle(store, run_id, by_parent=by_parent)


async def skip_orphaned_items(store: Face, root: State) -> int:
    """Journal as skipped the inbox items of subagent runs whose call in their parent has closed.

    Such items can have no effect (no one will drive that child again), and left unconsumed they would make
    ``claim_next`` offer the tree's root for ever. Returns how many runs were settled this way.
    """
    settled = 0
    for info in await store.list(root_id=root.id, limit=10_000):
        if info.parent_id is None or info.inbox_len <= info.inbox_consumed + 1:
            continue
        parent = root if info.parent_id == root.id else await load(store, info.parent_id)
        child = await load(store, info.id)
        record = parent.call(child.parent_call_id or "")
        if record is not None and record.outcome is None:
            continue  # the call is open: the parent's driver re-enters it and the child consumes them
        try:
            lease = await store.claim(info.id, Owner.here(), store.ttl)
        except RunBusyError:
            continue
        try:
            child = await load(store, info.id)
            writer = JournalWriter(child, lease.owner.writer)
            while True:
                skip_all(
                    writer,
                    await store.read_inbox(info.id, child.inbox_consumed),
                    "the subagent call is closed",
                )
                await write_all(store, writer, lease)
                if await store.release(lease, at_seq=len(child.history), inbox_len=child.inbox_consumed + 1):
                    break
        except BaseException:
            await store.abandon(lease)
            raise
        settled += 1
    return settled


# --------------------------------------------------------------------------------------------------
# Forking

_BOUNDARY_KINDS = frozenset(
    {"run_started", "message", "model_replied", "tool_finished", "compacted", "run_stopped"}
)
_INBOX_FIELDS = {"inbox_seq": None, "item_id": None}


async def fork(store: Face, run_id: str, at_seq: int | None, new_id: str | None) -> str:
    """Copy a run's journal up to a turn boundary into a new run, created unheld (see ``Store.fork``)."""
    entries = await store.read(j.validate_run_id(run_id))
    if not entries:
        raise ValueError(f"run {run_id} has no entries to fork. Fix: pick another run")
    last = len(entries) - 1
    if at_seq is None:
        at_seq = last
    if not 0 <= at_seq <= last:
        raise ValueError(
            f"run {run_id} has seqs 0 to {last}, not {at_seq}. Fix: pass --at between 0 and {last}"
        )
    started = entries[0]
    if not isinstance(started, j.RunStarted):
        raise ValueError(f"run {run_id} does not begin with run_started. Fix: pick another run")
    if started.parent_id is not None:
        raise ValueError(
            f"run {run_id} is a subagent of {started.parent_id}. Fix: fork its root "
            f"{started.root_id or started.parent_id}"
        )
    boundary = fork_boundary(entries, at_seq)
    state = State(id=new_id)
    writer = JournalWriter(state)
    writer.add(
        j.RunStarted,
        agent=started.agent,
        fingerprint=started.fingerprint,
        budgets=started.budgets,
        root_id=state.id,
        forked_from={"id": run_id, "seq": boundary},
        output_type=started.output_type,
        metadata=started.metadata,  # a fork lists under its source's metadata
    )
    for entry in entries[1 : boundary + 1]:
        state.apply(_inherited(entry))
    info = {**state.info(), "updated_at": state.history[0].at}
    await store.create(state.id, writer.next_batch(), info)
    return state.id


def fork_boundary(entries: Sequence[j.Entry], at_seq: int) -> int:
    """The last seq at or before ``at_seq`` that ends a turn (see ``Store.fork``).

    That is a ``run_started``, ``message``, ``model_replied``, ``tool_finished``, ``compacted`` or
    ``run_stopped`` entry after which no call is open.
    """
    state = State(id="fork")
    boundary = 0
    for entry in entries[: at_seq + 1]:
        state.apply(entry)
        if entry.kind in _BOUNDARY_KINDS and not state.open_calls:
            boundary = entry.seq
    return boundary


def _inherited(entry: j.Entry) -> j.Entry:
    """A source entry as a fork keeps it: unsealed, and no longer tied to the source's inbox."""
    changes: dict[str, Any] = {"w": "", "h": "", "b": 0, "v": None}  # sealed again, in the fork's format
    if isinstance(entry, j.InboxSkipped):
        changes.update(inbox_seq=-1, item_id=None)
    else:
        for name, value in _INBOX_FIELDS.items():
            if hasattr(entry, name):
                changes[name] = value
    return dataclasses.replace(entry, **changes)


# --------------------------------------------------------------------------------------------------
# Listing and short ids


async def list_page(
    store: Face, filters: dict[str, Any], *, limit: int = 100, cursor: str | None = None
) -> tuple[builtins.list[RunInfo], str | None]:
    """One page of ``list`` and the cursor of the next page (see ``Store.list_page``).

    ``filters`` are ``list``'s filters (``status``, ``agent``, ..., ``metadata``).
    """
    if limit < 1:
        raise ValueError(f"limit {limit} is not positive. Fix: pass limit >= 1")
    filters = {k: v for k, v in filters.items() if v is not None and (k != "metadata" or v)}
    here = ListCursor.decode(cursor)
    found = await store.list(**filters, limit=limit + 1, cursor=cursor)
    page = found[:limit]
    top = here.top
    if top is None and page:
        top = page[0].updated_at or ""
    if len(found) > limit:
        last = page[-1]
        return page, ListCursor(here.since, top, last.updated_at or "", last.id).encode()
    if top is None:
        return page, None
    following = ListCursor(since=top).encode()
    return page, (following if await store.list(**filters, limit=1, cursor=following) else None)


async def child_needs_work(store: Face, child_id: str) -> bool:
    """Whether a waiting child (or one of its own children) has something to act on (DURABILITY 6)."""
    try:
        child = await load(store, child_id)
    except RunNotFoundError:
        return True  # re-entering the call creates it
    if child.status != "waiting":
        return True
    if await store.inbox_length(child_id) > child.inbox_consumed + 1:
        return True
    for open_call in child.open_calls:
        call = child.call(open_call.call_id)
        if call is not None and call.child_id is not None and await child_needs_work(store, call.child_id):
            return True
    return False


async def ids_matching(store: Face, short: str, page: int = 1000) -> list[str]:
    """The ids of the runs that ``short`` abbreviates, sorted (see ``Store.ids_matching``); built on ``list``."""
    j.validate_run_id(short)
    parts = short.split("-")
    found: set[str] = set()
    cursor: str | None = None
    while True:
        runs, cursor = await list_page(store, {}, limit=page, cursor=cursor)
        found.update(info.id for info in runs if abbreviates(parts, info.id))
        if cursor is None:
            return sorted(found)


def abbreviates(parts: Sequence[str], run_id: str) -> bool:
    """Whether the ``-``-separated ``parts`` of a short id begin the parts of ``run_id``, in order."""
    theirs = run_id.split("-")
    return len(theirs) >= len(parts) and all(t.startswith(p) for p, t in zip(parts, theirs, strict=False))
