"""The state every step of a drive shares: writing, the inbox, and the helpers (DESIGN 5.3, DURABILITY 2).

``DriveCore`` holds one driven run: the State, the lease, the writer (``flush``: one append at a time,
whatever was queued meanwhile goes into the next one) and the inbox reading. ``ModelSteps``,
``ToolSteps`` and ``Drive`` build on it, one concern a module.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import journal as j
from ..events import EntryEvent, Event
from ..inbox import InboxItem, consume
from ..output import OutputSpec, imported_type, output_spec
from ..state import State
from ..stores.base import Lease, Store
from .invoke import submit_tool_job
from .renewal import Renewer
from .subagents import cancel_tree, child_id_for, child_needs_work

if TYPE_CHECKING:
    from ..agent import Agent


__all__ = ["COMPACT_INSTRUCTIONS", "COMPACT_PROMPT", "DriveCore", "backoff"]

log = logging.getLogger("tether")

COMPACT_INSTRUCTIONS = "You summarize conversations so that work can continue from the summary alone."
COMPACT_PROMPT = (
    "Summarize the conversation so far for yourself: the task, what was done, the results that matter, "
    "and what is left. Keep names, numbers and decisions exactly."
)


class DriveCore:
    """One held run being driven: its State, lease, writer and inbox."""

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
        # Sync tool jobs (call id, job) keyed by the seq of their tool_started: the store's thread starts each
        # right after the append that makes that entry durable, and notes its call in ``handed_over``.
        # ``prestarted`` holds their futures until _invoke awaits them.
        self.after_append: dict[int, tuple[str, Callable[[], None]]] = {}
        self.prestarted: dict[str, asyncio.Future[Any]] = {}
        self.handed_over: set[str] = set()
        self.validated: dict[str, dict[str, Any]] = {}  # a reply's arguments as _admit validated them

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
        if not self.state.unsaved:
            return  # nothing queued, and so no append in progress either (its entries count as unsaved)
        async with self.flush_lock:
            while self.state.unsaved:
                batch = self.state.next_batch()
                jobs = {}
                if self.after_append:
                    jobs = {e.seq: self.after_append.pop(e.seq) for e in batch if e.seq in self.after_append}
                future = self.store.io_threads.run_through(self._append, batch, self.state.info(), jobs)
                cancelled = False
                while not future.done():
                    try:
                        await future  # a cancel of this task is raised here only once the append returned
                    except asyncio.CancelledError:
                        cancelled = True
                    except Exception:
                        break  # the append failed (its future is done): settled below
                error = future.exception()
                if error is not None:
                    self.after_append.update(jobs)  # a retry of the same seqs starts them
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

    def _append(
        self, batch: list[j.Entry], info: dict[str, Any], jobs: dict[int, tuple[str, Callable[[], None]]]
    ) -> int:
        """Read the inbox's length, append a batch, and start the sync tools it made durable, on one trip.

        The length is read before the append (DURABILITY 2.3). One started tool runs on this very thread
        once the append is reported (outside the store's thread limit), the others each on a tool thread.
        """
        length = self.store.inbox_length(self.state.id)
        self.store.append(
            self.state.id,
            batch,
            expected_seq=batch[0].seq,
            writer=self.state.writer,
            lease_token=self.lease.token,
            info=info,
        )
        if jobs and not self.stopping:  # a stopping drive starts no tool (_close_after settles its calls)
            # Nothing here may raise now that the append is durable: a raise would have it retried, and its
            # tools started twice. submit_tool_job runs a job in place when no thread can be started.
            (first_call, first), *others = jobs.values()
            for call_id, job in others:
                self.handed_over.add(call_id)
                submit_tool_job(job)
            self.handed_over.add(first_call)
            self.store.io_threads.then(first, submit_tool_job)  # this thread, once the append is reported
        return length

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
        if any(item.type == "cancel" for item in items) and self.state.status not in j.STOP_STATUSES:
            await self._cancel_children()
        consume(self.state, items)
        self.act()
        if self.state.status == "cancelled":
            self.done = True
        return True

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
                await self.store.run_io(cancel_tree, self.store, child_id, "parent", True)

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
    target = imported_type(state.output_type)
    if target is None:
        raise ValueError(
            f"run {state.id} was started with output_type {state.output_type}, which is not imported here. "
            "Fix: import it, or pass Agent(output_type=...)"
        )
    return output_spec(target)


def backoff(attempt: int, base: float, retry_after: float | None, cap: float = 30.0) -> float:
    """Exponential backoff with full jitter, never shorter than the provider's ``retry-after``."""
    delay = min(cap, base * (2 ** max(0, attempt - 1)))
    delay = random.uniform(delay / 2, delay)
    return max(delay, retry_after or 0.0)
