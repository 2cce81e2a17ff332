"""The Store contract (DESIGN 8.1, DURABILITY 1-4) and what every store gets from it.

A store keeps, for each run, its journal (append-only entries), its inbox (posted items) and who holds it.
Primitives are synchronous and thread-safe; an async store overrides the ``a``-prefixed twins, which by
default run the primitive on the store's own executor. ``load``, ``save``, ``cancel`` and ``follow`` are
built on the primitives. Stores never fold entries: the listing record (``info``) comes from the writer.
"""

from __future__ import annotations

import abc
import asyncio
import gc
import os
import socket
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

from .. import journal as j
from ..errors import ConflictError, RunBusyError
from ..inbox import InboxItem, consume
from ..state import State

__all__ = ["Lease", "Owner", "RunInfo", "Store", "pid_alive"]

P = ParamSpec("P")
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Owner:
    """Who takes a run: the writer id, pid, host and since when."""

    writer: str
    pid: int
    host: str
    since: str

    @classmethod
    def here(cls, writer: str | None = None) -> Owner:
        """An owner for this process (a fresh writer id unless given)."""
        return cls(writer or j.new_writer_id(), os.getpid(), socket.gethostname(), j.now_iso())

    def describe(self) -> str:
        """``pid 123 on host h since T``."""
        return f"pid {self.pid} on host {self.host} since {self.since}"

    def to_dict(self) -> dict[str, Any]:
        """The JSON form stores keep."""
        return {"writer": self.writer, "pid": self.pid, "host": self.host, "since": self.since}

    @classmethod
    def from_dict(cls, obj: dict[str, Any]) -> Owner:
        """Read the JSON form."""
        return cls(
            str(obj.get("writer", "")),
            int(obj.get("pid", 0)),
            str(obj.get("host", "")),
            str(obj.get("since", "")),
        )


@dataclass(frozen=True, slots=True)
class Lease:
    """A held run: the fencing token (incremented by each claim), the owner, the expiry (None: a lock).

    ``ttl`` is the length it was claimed for; ``renew`` extends it by that much again.
    """

    run_id: str
    token: int
    owner: Owner
    expires_at: float | None = None
    ttl: float | None = None


@dataclass(frozen=True, slots=True)
class RunInfo:
    """One run as ``store.list()`` shows it."""

    id: str
    agent: str | None
    status: str
    first_message: str | None
    created_at: str | None
    updated_at: str | None
    turn: int
    parent_id: str | None
    root_id: str | None
    lease_owner: str | None
    lease_expires_at: float | None
    length: int = 0
    inbox_len: int = 0
    inbox_consumed: int = -1

    @property
    def display_status(self) -> str:
        """The status as ``tether ls`` shows it: ``running (no owner)`` for a running run no one holds."""
        if self.status == "running" and self.lease_owner is None:
            return "running (no owner)"
        return self.status


def pid_alive(pid: int, host: str) -> bool | None:
    """Whether ``pid`` lives; None when it is on another host and cannot be told."""
    if host != socket.gethostname():
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def busy_error(run_id: str, owner: Owner | None) -> RunBusyError:
    """The RunBusyError for a take that found ``run_id`` held by ``owner``."""
    if owner is None:
        return RunBusyError(
            f"run {run_id} is driven by another holder. Fix: wait for it, or stop that process", run_id=run_id
        )
    alive = pid_alive(owner.pid, owner.host)
    state = {True: "alive", False: "no longer alive", None: "on another host"}[alive]
    return RunBusyError(
        f"run {run_id} is driven by {owner.describe()} (that process is {state}). Fix: wait for it, or stop "
        "that process",
        run_id=run_id,
        owner=owner.to_dict(),
    )


class Store(abc.ABC):
    """Where runs live. Subclass it and implement the primitives; pass ``tether.testing``'s suite.

    Primitives (sync, thread-safe):
        create, append, read, length, post, read_inbox, inbox_length, claim, renew, release, holder,
        list, delete.
    Built on them: load, save, cancel, follow, and the ``a``-prefixed async twins.
    """

    ttl: float | None = None
    """Lease length for claims, in seconds; None for a store whose lease is a lock the OS drops."""

    def __init__(self) -> None:
        self._executor: ThreadPoolExecutor | None = None
        self._executor_lock = threading.Lock()

    # --------------------------------------------------------------------------------------------
    # Primitives

    @property
    @abc.abstractmethod
    def identity(self) -> str:
        """What this store is: the resolved path, or the DSN without its password. Equal stores share it."""

    @abc.abstractmethod
    def create(
        self,
        run_id: str,
        entries: Sequence[j.Entry],
        info: dict[str, Any],
        *,
        owner: Owner | None = None,
        ttl: float | None = None,
    ) -> Lease | None:
        """Write a new run's first entries and an empty inbox, all or nothing.

        With ``owner``, the run is taken in the same step and the Lease returned.

        Raises:
            ValueError: the id exists.
        """

    @abc.abstractmethod
    def append(
        self,
        run_id: str,
        entries: Sequence[j.Entry],
        *,
        expected_seq: int,
        writer: str,
        lease_token: int | None,
        info: dict[str, Any],
    ) -> None:
        """Append sealed entries at ``expected_seq``, fenced by the lease token, all or nothing.

        With n the stored length and k = min(len(entries), n - expected_seq), entries already stored with
        the same ``w`` and ``h`` are skipped (a retried append); the rest are appended.

        Raises:
            ConflictError: a stored entry differs (another writer), or ``expected_seq > n`` (a gap).
            LeaseLostError: the token is not the run's current one.
            RunNotFoundError: no such run.
        """

    @abc.abstractmethod
    def read(self, run_id: str, after_seq: int = -1) -> list[j.Entry]:
        """The durable entries with seq > ``after_seq``, decoded and checked.

        Raises:
            RunNotFoundError, CorruptJournalError, NewerFormatError.
        """

    @abc.abstractmethod
    def length(self, run_id: str) -> int:
        """How many entries the journal holds (a cheap read)."""

    @abc.abstractmethod
    def post(self, run_id: str, item: dict[str, Any], *, item_id: str | None = None) -> int:
        """Durably add an item to the run's inbox and return its ``inbox_seq``.

        A retried post with a stored ``item_id`` returns the stored ``inbox_seq``.
        """

    @abc.abstractmethod
    def read_inbox(self, run_id: str, after_seq: int = -1) -> list[InboxItem]:
        """The inbox items with inbox_seq > ``after_seq``, in order."""

    @abc.abstractmethod
    def inbox_length(self, run_id: str) -> int:
        """How many items the inbox holds (one cheap read; the holder polls it)."""

    @abc.abstractmethod
    def claim(self, run_id: str, owner: Owner, ttl: float | None = None) -> Lease:
        """Take the run and return a Lease with a new fencing token.

        Raises:
            RunBusyError: a live process holds it (names pid, host, since and whether it lives).
            RunNotFoundError: no such run.
        """

    @abc.abstractmethod
    def renew(self, lease: Lease) -> Lease:
        """Extend the lease.

        Raises:
            LeaseLostError: it was taken over or released.
        """

    @abc.abstractmethod
    def release(self, lease: Lease, *, at_seq: int, inbox_len: int) -> bool:
        """Give the run up, only if the journal has ``at_seq`` entries and the inbox ``inbox_len`` items.

        Returns False (still held) when either grew: the holder consumes again, then releases again.
        """

    @abc.abstractmethod
    def abandon(self, lease: Lease) -> None:
        """Give the run up unconditionally (after an error); never raises."""

    @abc.abstractmethod
    def holder(self, run_id: str) -> Owner | None:
        """Who holds the run now (None: no one); never makes a concurrent take fail."""

    @abc.abstractmethod
    def list(
        self,
        *,
        status: str | None = None,
        agent: str | None = None,
        parent_id: str | None = None,
        root_id: str | None = None,
        limit: int = 100,
    ) -> list[RunInfo]:
        """Runs, most recently updated first."""

    @abc.abstractmethod
    def delete(self, run_id: str) -> None:
        """Delete a run's journal and inbox.

        Raises:
            RunBusyError: the run is held.
            RunNotFoundError: no such run.
        """

    # --------------------------------------------------------------------------------------------
    # Built on the primitives

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Store) and other.identity == self.identity

    def __hash__(self) -> int:
        return hash(self.identity)

    @property
    def executor(self) -> ThreadPoolExecutor:
        """The store's own executor: store I/O never runs on the default one."""
        with self._executor_lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="tether-store")
            return self._executor

    async def run_io(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run a sync primitive on the store's executor."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, lambda: fn(*args, **kwargs))

    def load(self, run_id: str) -> State:
        """The run as its journal says: pure replay; never writes, never recovers."""
        j.validate_run_id(run_id)
        collecting = gc.isenabled()
        gc.disable()  # replay allocates many small objects and no cycles: the collector only slows it
        try:
            state = State.replay(run_id, self.read(run_id))
        finally:
            if collecting:
                gc.enable()
        state.store_identity = self.identity
        return state

    def exists(self, run_id: str) -> bool:
        """Whether the store has the run."""
        from ..errors import RunNotFoundError

        try:
            self.length(run_id)
        except RunNotFoundError:
            return False
        return True

    def check_state(self, state: State) -> None:
        """Refuse a State that belongs to another store."""
        if state.store_identity is not None and state.store_identity != self.identity:
            raise ValueError(
                f"run {state.id} was saved in {state.store_identity}, not in {self.identity}. Fix: use the store "
                "it came from (one State, one store)"
            )

    def append_state(self, state: State, lease: Lease | None) -> None:
        """Append what ``state`` has queued and not saved (its batch in flight first, byte-identical)."""
        while state.unsaved:
            batch = state.next_batch()
            self.append(
                state.id,
                batch,
                expected_seq=batch[0].seq,
                writer=state.writer,
                lease_token=lease.token if lease else None,
                info=state.info(),
            )
            state.batch_saved()

    def save(self, state: State) -> State:
        """Write what the store lacks: a new run, or the changes made on ``state`` (nothing if none).

        Changes (``add_message``, ``approve``, ``deny``) are posted to the run's inbox; when no one holds
        the run, this process takes it, journals the inbox and releases it, and ``state`` catches up with
        the journal. When a driver holds it, the driver journals them within its poll interval.
        """
        self.check_state(state)
        if not state.history:
            initial = State(id=state.id, messages=state.messages)
            initial.queue(j.RunStarted, root_id=state.id)
            for message in state.messages:
                initial.queue(j.MessageAdded, role=message.role, content=list(message.content))
            batch = initial.next_batch()
            self.create(state.id, batch, initial.info())
            for entry in batch:
                state.apply(entry)
            state.mark_saved()
            state.messages[:] = initial.messages
            state.store_identity = self.identity
            return state
        if state.unsaved:
            lease = self.claim(state.id, Owner.here(state.writer), self.ttl)
            try:
                self.append_state(state, lease)
            finally:
                self.abandon(lease)
        for item in state.take_local_changes():
            self.post(state.id, {**item, "run_h": state.history[0].h}, item_id=item["item_id"])
        state.local_changes_posted()
        self.settle(state.id)
        self.catch_up(state)
        state.store_identity = self.identity
        return state

    def catch_up(self, state: State) -> None:
        """Fold into ``state`` the durable entries it has not seen."""
        for entry in self.read(state.id, after_seq=len(state.history) - 1):
            state.apply(entry)
        state.mark_saved()

    def settle(self, run_id: str) -> State | None:
        """Take the run if no one holds it, journal its inbox, release it; None when it is held.

        This is the short-lived taker of DURABILITY 1 (``store.save``, ``store.cancel``, ``tether approve``):
        it consumes first and writes nothing else; approved calls are started later by a driver.
        """
        try:
            lease = self.claim(run_id, Owner.here(), self.ttl)
        except RunBusyError:
            return None
        try:
            state = State.replay(run_id, self.read(run_id))
            state.writer = lease.owner.writer
            while True:
                consume(state, self.read_inbox(run_id, after_seq=state.inbox_consumed))
                self.append_state(state, lease)
                if self.release(lease, at_seq=len(state.history), inbox_len=state.inbox_consumed + 1):
                    lease = None  # type: ignore[assignment]
                    state.store_identity = self.identity
                    return state
        finally:
            if lease is not None:
                self.abandon(lease)

    def cancel(self, run_id: str, by: str | None = None) -> State | None:
        """Ask to cancel the run: posted to its inbox, journaled now if no one holds it.

        Returns the run after the cancel was journaled, or None when a driver holds it (it stops the run
        within its poll interval).
        """
        self.post(run_id, {"type": "cancel", "by": by, "seen_seq": self.length(run_id)})
        return self.settle(run_id)

    async def follow(
        self, run_id: str, after_seq: int = -1, *, poll_interval: float = 0.2
    ) -> AsyncIterator[j.Entry]:
        """Replay, then tail, the entries of a run driven elsewhere: no gaps, no duplicates.

        Ends when the run has stopped (``completed``, ``failed``, ``cancelled`` or ``stopped``) and nothing
        is left to read; a consumer may stop earlier.
        """
        last = after_seq
        while True:
            entries = await self.run_io(self.read, run_id, last)
            for entry in entries:
                last = entry.seq
                yield entry
            if entries and entries[-1].kind == "run_stopped":
                return
            await asyncio.sleep(poll_interval)

    def conflict(self, run_id: str, seq: int, stored: j.Entry) -> ConflictError:
        """The ConflictError for an append that met another writer's entry at ``seq``."""
        return ConflictError(
            f"run {run_id} seq {seq} holds a {stored.kind} entry from writer {stored.w[:8]}, not this one. "
            "Fix: store.load(id) again and continue from there",
            run_id=run_id,
            seq=seq,
        )

    def close(self) -> None:
        """Release resources (the executor, connections)."""
        if self._executor is not None:
            self._executor.shutdown(wait=False)
            self._executor = None
