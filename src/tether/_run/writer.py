"""The writer task of one driven run: every append, one at a time, with group commit (DESIGN 5.3).

Entries are added through the run's ``JournalWriter``; ``Writer.flush`` appends what is queued, and what is
queued while an append runs goes into the next one. An append in progress always completes, even when its
task is cancelled, so the driver always knows whether it is durable. Each trip to the store's thread also
reads the inbox's length (DURABILITY 2.3: before each append, or in the append's own transaction for a store
with ``append_reads_inbox``) and starts the sync tools whose
``tool_started`` that append made durable. A store with native async twins (``Store.async_native``) is
awaited on the loop instead, its append shielded from the drive's cancellation in the same way.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import journal as j
from ..events import EntryEvent, Event
from ..stores.base import Lease, Store
from ..writing import JournalWriter
from .invoke import submit_tool_job
from .renewal import Renewer
from .spans import NO_TRACE, NoTrace

__all__ = ["StartGate", "Writer"]

log = logging.getLogger("tether")


@dataclass(slots=True)
class StartGate:
    """Whether this drive may start a tool now: not while it stops (DURABILITY 1.6), and not when its
    last successful lease renewal is older than ttl/2 (DURABILITY 4)."""

    stopping: bool = False
    renewer: Renewer | None = None

    def open(self) -> bool:
        """Whether a tool may start."""
        return not self.stopping and (self.renewer is None or self.renewer.fresh())


@dataclass(slots=True)
class _Job:
    call_id: str
    run: Callable[[], None]


class Writer:
    """Appends one driven run's entries, one append at a time.

    Args:
        store: where the run lives.
        lease: this process's hold on the run (its token fences every append).
        journal: the run's JournalWriter (``journal.state`` is the run).
        gate: whether a tool may start (a stopping drive starts none, even after a durable append).
        emit: receives each entry once its append returned (``agent.stream``).

    Attributes:
        acted: whether this drive has queued ``run_resumed`` (its first acting entry, DURABILITY 1.5).
        save_failed: the error of the last append, while none has succeeded since.
        inbox_hint: the inbox's length as the last append read it, and when (``time.monotonic``).
        handed_over: the calls whose sync tool the store's thread started after an append.
        trace: the drive's tracing recorder (``NO_TRACE`` when off); it sees each batch once appended.
    """

    def __init__(
        self,
        store: Store,
        lease: Lease,
        journal: JournalWriter,
        gate: StartGate,
        emit: Callable[[Event], None] | None = None,
    ) -> None:
        self.store = store
        self.lease = lease
        self.journal = journal
        self.gate = gate
        self.emit = emit
        self.acted = False
        self.save_failed: BaseException | None = None
        self.inbox_hint: tuple[int, float] = (0, float("-inf"))
        self.handed_over: set[str] = set()
        self.trace: NoTrace = NO_TRACE
        self.add = journal.add  # queue the next entry (folded into the State at once)
        self._lock = asyncio.Lock()
        self._after_append: dict[int, _Job] = {}  # sync tools to start, by the seq of their tool_started

    def act(self) -> None:
        """Queue ``run_resumed`` before this drive's first entry that acts."""
        if not self.acted:
            self.acted = True
            host, pid = j.host_and_pid()
            self.journal.add(
                j.RunResumed, writer=self.journal.writer_id, token=self.lease.token, host=host, pid=pid
            )

    def start_after_append(self, seq: int, call_id: str, job: Callable[[], None]) -> None:
        """Have the store's thread start ``job`` (a sync tool) right after the append holding ``seq``."""
        self._after_append[seq] = _Job(call_id, job)

    async def flush(self) -> None:
        """Append everything queued; an append in progress always completes, even when cancelled.

        Raises:
            The store's error when an append fails (the entries stay queued: the next flush retries them,
            byte-identical); CancelledError once the append in progress has returned.
        """
        journal = self.journal
        if not journal.unsaved:
            return  # nothing queued, and so no append in progress either (its entries count as unsaved)
        async with self._lock:
            while journal.unsaved:
                batch = journal.next_batch()
                jobs: dict[int, _Job] = {}
                if self._after_append:
                    jobs = {
                        e.seq: self._after_append.pop(e.seq) for e in batch if e.seq in self._after_append
                    }
                info = journal.state.info()
                native = self.store.async_native
                future: asyncio.Future[int] = (
                    asyncio.ensure_future(self._aappend(batch, info, jobs))
                    if native
                    else self.store.io_threads.run_through(self._append, batch, info, jobs)
                )
                cancelled = False
                while not future.done():
                    try:  # a cancel of this task is raised here only once the append returned
                        await (asyncio.shield(future) if native else future)
                    except asyncio.CancelledError:
                        cancelled = True
                    except Exception:
                        break  # the append failed (its future is done): settled below
                error = future.exception()
                if error is not None:
                    self._after_append.update(jobs)  # a retry of the same seqs starts them
                    if cancelled:
                        raise asyncio.CancelledError() from error
                    self.save_failed = error
                    raise error
                journal.batch_saved()
                self.save_failed = None
                self.inbox_hint = (future.result(), time.monotonic())
                self.trace.journaled(batch)
                if self.emit is not None:
                    for entry in batch:
                        self.emit(EntryEvent(entry))
                if cancelled:
                    raise asyncio.CancelledError()

    def _append(self, batch: list[j.Entry], info: dict[str, Any], jobs: dict[int, _Job]) -> int:
        """Read the inbox's length, append a batch, and start the sync tools it made durable, on one trip.

        Runs on the store's thread. The length is read before the append (DURABILITY 2.3), or by the append
        itself in its transaction (``Store.append_reads_inbox``: no trip of its own). One started
        tool runs on this very thread once the append is reported (outside the store's thread limit), the
        others each on a tool thread.
        """
        run_id, store = self.journal.state.id, self.store
        length = None if store.append_reads_inbox else store.inbox_length(run_id)
        read = store.append(
            run_id,
            batch,
            expected_seq=batch[0].seq,
            writer=self.journal.writer_id,
            lease_token=self.lease.token,
            info=info,
        )
        self._start_tools(jobs, here=True)
        return _hint(length, read)

    async def _aappend(self, batch: list[j.Entry], info: dict[str, Any], jobs: dict[int, _Job]) -> int:
        """``_append`` on a store's native async twins (``Store.async_native``): each tool on a tool thread."""
        run_id, store = self.journal.state.id, self.store
        length = None if store.append_reads_inbox else await store.ainbox_length(run_id)
        read = await store.aappend(
            run_id,
            batch,
            expected_seq=batch[0].seq,
            writer=self.journal.writer_id,
            lease_token=self.lease.token,
            info=info,
        )
        self._start_tools(jobs, here=False)
        return _hint(length, read)

    def _start_tools(self, jobs: dict[int, _Job], *, here: bool) -> None:
        """Start the sync tools an append made durable; ``here``: the first on this store thread."""
        if not jobs or self.gate.stopping:  # a stopping drive starts no tool (the drive settles its calls)
            return
        # Nothing here may raise now that the append is durable: a raise would have it retried, and its
        # tools started twice. submit_tool_job runs a job in place when no thread can be started.
        first, *others = jobs.values()
        for job in others if here else jobs.values():
            self.handed_over.add(job.call_id)
            submit_tool_job(job.run)
        if here:
            self.handed_over.add(first.call_id)
            self.store.io_threads.then(first.run, submit_tool_job)  # this thread, once the append is reported

    async def release(self) -> bool:
        """Flush, then release the run if the journal and inbox are as this drive left them.

        Returns:
            False when either grew (the caller consumes the inbox and tries again).
        """
        await self.flush()
        state = self.journal.state
        renewer = self.gate.renewer
        if renewer is not None:  # a renewal that runs after the release finds no lease: not a loss
            renewer.releasing = True
        released = False
        try:
            released = await self.store.arelease(
                self.lease, at_seq=len(state.history), inbox_len=state.inbox_consumed + 1
            )
            return released
        finally:
            if renewer is not None and not released:  # still held (the journal or inbox grew, or an error)
                renewer.releasing = False

    async def give_up(self) -> None:
        """Abandon the lease (after an error); never raises."""
        try:
            await self.store.aabandon(self.lease)
        except Exception as exc:  # abandon never raises by contract; a broken store is only logged
            log.warning("releasing run %s failed: %s", self.journal.state.id, exc)


def _hint(before: int | None, read: int | None) -> int:
    """The inbox's length for ``Writer.inbox_hint``: the one read before the append, else the append's own;
    neither (a store with ``append_reads_inbox`` that returned none): a length that has the next poll read."""
    if before is not None:
        return before
    return sys.maxsize if read is None else read
