"""The Store contract (DESIGN 8, DURABILITY 1-6) and what every store gets from it.

A store keeps, for each run, its journal (append-only entries), its inbox (posted items) and who holds it.
Every public method has an ``a``-prefixed twin (DESIGN 8.1); a store implements each primitive in one face
at least, and the base gives the other (docs/decisions.md, "Two faces, one primary"). ``load``, ``save``,
``settle``, ``cancel``, ``follow``, ``fork`` and ``list_page`` are built on the primitives, once for both
faces (``operations``). Stores never fold entries: the listing record (``info``) comes from the writer.

The ``Store`` docstrings are the contract; ``tether.testing.StoreConformance`` checks it. The ``plan_*``
functions state the selection rules of ``claim_next``, ``prune`` and ``delete`` over ``RunInfo`` records:
stores that list in Python call them under their own locks, SQL stores say the same in SQL.
"""

from __future__ import annotations

import abc
import builtins
from collections.abc import AsyncIterator, Callable, Collection, Coroutine, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, ParamSpec, TypeVar

from .. import journal as j
from .._threads import LoopThread, Threads
from ..inbox import InboxItem
from ..state import State
from . import operations
from ._face import AsyncFace, SyncFace
from ._face import run_sync as run_sync  # re-exported: the stores import it from here
from ._listing import ListCursor, as_cutoff, listing_key
from ._planner import (
    check_batch,
    check_prune_statuses,
    delete_children_error,
    delete_subagent_error,
    listed_child_needs_work,
    plan_claim_next,
    plan_delete,
    plan_prune,
)
from ._records import Lease, Owner, RunInfo, pid_alive
from ._records import busy_error as busy_error  # re-exported: the stores import it from here

__all__ = ["Lease", "ListCursor", "Owner", "RunInfo", "Store", "as_cutoff", "check_batch", "check_prune_statuses",
           "delete_children_error", "delete_subagent_error", "listed_child_needs_work", "listing_key", "pid_alive",
           "plan_claim_next", "plan_delete", "plan_prune", "run_sync"]  # fmt: skip

P = ParamSpec("P")
T = TypeVar("T")

PRIMITIVES = ("create", "append", "read", "length", "post", "read_inbox", "inbox_length", "claim",
              "claim_next", "renew", "release", "abandon", "holder", "list", "delete", "prune")  # fmt: skip
"""The primitives a store implements, each in one face at least: ``name`` (sync) or ``a`` + ``name``."""

IO_THREADS = 4
"""Threads each store runs its I/O on; more calls at once wait for the first free one."""


class Store(abc.ABC):
    """Where runs live: each run's journal, inbox and holder. Subclass it, implement the primitives, and
    pass ``tether.testing.StoreConformance``.

    Every primitive is thread-safe, and may be called from several processes on the same storage at once (a
    MemoryStore is the one store that lives in one process). Implement each one sync (``read``) or async
    (``aread``), or both: a sync primitive's twin runs it on the store's threads (``run_io``); an async-only
    primitive's sync method runs its coroutine on the store's own loop thread. A store overriding async
    twins is ``async_native``: the composite twins (``aload``, ...) then run over them on the caller's loop.

    Primitives (``PRIMITIVES``; ``identity`` is abstract): ``create``, ``append``, ``read``, ``length``,
    ``post``, ``read_inbox``, ``inbox_length``, ``claim``, ``claim_next``, ``renew``, ``release``,
    ``abandon``, ``holder``, ``list``, ``delete``, ``prune``. Built on them, for every store: ``load``,
    ``save``, ``settle``, ``cancel``, ``follow``, ``fork``, ``list_page``, ``exists``, ``ids_matching``.

    Words used below:
        held: a take (``create(owner=...)``, ``claim``, ``claim_next``) succeeded and the lease has not been
            released, abandoned, taken over or (ttl stores) expired. A ttl store may also treat a lease as
            free when its owner is a process of this host that no longer lives.
        root: a run without a parent; a tree is a root and every run whose ``root_id`` names it (subagent
            runs, at any depth).
        unconsumed items: the inbox holds items past the consumed mark, i.e.
            ``inbox_length > info["inbox_consumed"] + 1`` (``RunInfo.unconsumed``).
        info: the listing record the writer passes with each ``create`` and ``append`` (``State.info()``:
            agent, status, turn, created_at, updated_at, first_message, parent_id, root_id,
            inbox_consumed, and ``metadata`` when the run has any). Stores keep the last one and never fold
            entries; ``metadata`` never changes after ``create``.
    """

    ttl: float | None = None
    """Lease length for claims, in seconds; None for a store whose lease is a lock the OS drops."""

    append_reads_inbox: bool = False
    """Whether ``append`` returns the inbox's length, read in the append's own transaction (the writer then
    reads no length before it: DURABILITY 2.3's read before each append is that one, at the append)."""

    async_native: bool = False
    """Whether the store implements async primitives itself (set for each subclass, from its methods)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.async_native = any(
            getattr(cls, f"a{name}") is not getattr(Store, f"a{name}") for name in PRIMITIVES
        )

    def __init__(self) -> None:
        self.io_threads = Threads("tether-store", limit=IO_THREADS)
        self._loop_thread: LoopThread | None = None
        missing = [name for name in PRIMITIVES
                   if getattr(type(self), name) is getattr(Store, name)
                   and getattr(type(self), f"a{name}") is getattr(Store, f"a{name}")]  # fmt: skip
        if missing:
            raise TypeError(
                f"{type(self).__name__} implements neither {missing[0]} nor a{missing[0]}"
                f"{f' (nor {len(missing) - 1} other primitives)' if len(missing) > 1 else ''}. Fix: implement "
                "each primitive in one face, sync or async; the base gives the other"
            )

    # --------------------------------------------------------------------------------------------
    # Primitives

    @property
    @abc.abstractmethod
    def identity(self) -> str:
        """What this store is: the resolved path, or the DSN without its password. Equal stores share it.

        ``open_store(store.identity)`` opens the same storage (except for a MemoryStore).
        """

    def create(
        self,
        run_id: str,
        entries: Sequence[j.Entry],
        info: dict[str, Any],
        *,
        owner: Owner | None = None,
        ttl: float | None = None,
    ) -> Lease | None:
        """Write a new run: its first entries (one sealed batch from seq 0) and an empty inbox, all or nothing.

        With ``owner`` the run is taken in the same step (no other take can come between) and the Lease
        returned (its token is at least 1); ``ttl`` is the lease length (None: the store's ``ttl``). Without ``owner`` the run is created
        unheld and None is returned. A create that raises leaves no trace: the id stays free.

        Raises:
            ValueError: the id exists, is not a valid run id, or ``entries`` is not one sealed batch.
        """
        return self._on_loop(self.acreate(run_id, entries, info, owner=owner, ttl=ttl))

    def append(
        self,
        run_id: str,
        entries: Sequence[j.Entry],
        *,
        expected_seq: int,
        writer: str,
        lease_token: int | None,
        info: dict[str, Any],
    ) -> int | None:
        """Append one sealed batch at ``expected_seq``, fenced by the lease token, all or nothing (DURABILITY 3).

        The fence comes first and is part of the write itself: an append with a token that is not the
        run's current one, or whose lease is no longer held, is refused whatever it holds. Then, with n the
        stored length and k = min(len(entries), n - expected_seq), each of the first k entries must have
        the ``w`` and ``h`` of the stored entry at its seq (a retried append: those are skipped); the rest is
        appended, and ``info`` replaces the listing record. An empty ``entries`` writes nothing.

        Raises:
            ConflictError: a stored entry differs (another writer; the error names seq, kind and writer),
                or ``expected_seq > n`` (a gap); nothing is written.
            LeaseLostError: the token is not the run's current one, or the lease lapsed.
            RunNotFoundError: no such run.
            ValueError: ``entries`` is not one sealed batch numbered from ``expected_seq``.

        Returns:
            None, or (a store with ``append_reads_inbox``) the inbox's length read in the same transaction.
        """
        return self._on_loop(self.aappend(run_id, entries, expected_seq=expected_seq, writer=writer,
                                   lease_token=lease_token, info=info))  # fmt: skip

    def read(self, run_id: str, after_seq: int = -1) -> list[j.Entry]:
        """The durable entries with seq > ``after_seq``, decoded and checked, in seq order.

        Only whole appends are ever returned (never part of one being written).

        Raises:
            RunNotFoundError, CorruptJournalError, NewerFormatError.
        """
        return self._on_loop(self.aread(run_id, after_seq))

    def length(self, run_id: str) -> int:
        """How many entries the journal holds (a cheap read).

        Raises:
            RunNotFoundError: no such run.
        """
        return self._on_loop(self.alength(run_id))

    def post(self, run_id: str, item: dict[str, Any], *, item_id: str | None = None) -> int:
        """Durably add an item to the run's inbox and return its ``inbox_seq`` (DURABILITY 2).

        Anyone may post at any time, held or not. ``inbox_seq`` is dense from 0 and items become visible in
        that order. A retried post with a stored ``item_id`` (default: ``item["item_id"]``, else a fresh
        UUID) writes nothing and returns the stored ``inbox_seq``.

        Raises:
            RunNotFoundError: no such run.
            ValueError: the item's ``type`` is not ``decision``, ``message`` or ``cancel``.
        """
        return self._on_loop(self.apost(run_id, item, item_id=item_id))

    def read_inbox(self, run_id: str, after_seq: int = -1) -> list[InboxItem]:
        """The inbox items with inbox_seq > ``after_seq``, in order (durable before they are returned)."""
        return self._on_loop(self.aread_inbox(run_id, after_seq))

    def inbox_length(self, run_id: str) -> int:
        """How many items the inbox holds (one cheap read; the holder polls it)."""
        return self._on_loop(self.ainbox_length(run_id))

    def claim(self, run_id: str, owner: Owner, ttl: float | None = None) -> Lease:
        """Take the run and return a Lease with a new fencing token (greater than every earlier one).

        ``ttl`` is the lease length (None: the store's ``ttl``; ignored by lock stores). A claim is a short
        step, never a lock held by a transaction.

        Raises:
            RunBusyError: it is held (names pid, host, since and whether that process lives).
            RunNotFoundError: no such run.
        """
        return self._on_loop(self.aclaim(run_id, owner, ttl))

    def claim_next(
        self, owner: Owner, ttl: float | None = None, agents: Collection[str] | None = None
    ) -> Lease | None:
        """Claim the root of a tree that needs work and return its Lease; None when there is none.

        A claimable root has no parent, is not held, has its agent in ``agents`` (any agent when None; an
        empty collection claims nothing) and needs work, i.e. one of:

        - its status is ``running`` (a run submitted and not started, or one whose driver stopped or died);
        - it has unconsumed items;
        - its status is ``waiting`` and another run of its tree is not held and either has unconsumed items,
          or is no longer ``waiting`` and was updated after the root (the root has not seen it move on).

        A subagent run is never claimed itself: it is reached through its root. Roots are tried oldest
        ``updated_at`` first. The check and the take are one step (or the take is re-checked), so two
        concurrent ``claim_next`` never return the same run. ``failed``, ``stopped`` and ``completed`` runs
        without unconsumed items are never claimed.
        """
        return self._on_loop(self.aclaim_next(owner, ttl, agents))

    def renew(self, lease: Lease) -> Lease:
        """Extend the lease by its ``ttl`` from now (a no-op returning ``lease`` for lock stores).

        Raises:
            LeaseLostError: it was taken over, released or abandoned.
        """
        return self._on_loop(self.arenew(lease))

    def release(self, lease: Lease, *, at_seq: int, inbox_len: int) -> bool:
        """Give the run up, only if the journal has ``at_seq`` entries and the inbox ``inbox_len`` items.

        Returns False (still held) when either grew: the holder consumes again, then releases again. Returns
        True when released, and when the lease is no longer this holder's (nothing of its own to release).
        """
        return self._on_loop(self.arelease(lease, at_seq=at_seq, inbox_len=inbox_len))

    def abandon(self, lease: Lease) -> None:
        """Give the run up unconditionally (after an error) if this lease still holds it; never raises."""
        self._on_loop(self.aabandon(lease))

    def holder(self, run_id: str) -> Owner | None:
        """Who holds the run now (None: no one); never makes a concurrent take fail.

        Raises:
            RunNotFoundError: no such run.
        """
        return self._on_loop(self.aholder(run_id))

    def list(
        self,
        *,
        status: str | None = None,
        agent: str | None = None,
        parent_id: str | None = None,
        root_id: str | None = None,
        updated_before: datetime | str | None = None,
        updated_after: datetime | str | None = None,
        limit: int = 100,
        cursor: str | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> list[RunInfo]:
        """Up to ``limit`` runs, most recently updated first: by ``(updated_at, id)``, highest first.

        Filters combine with AND: ``status``, ``agent``, ``parent_id``, ``root_id`` match exactly (a root's
        ``root_id`` is its own id); ``metadata`` keeps the runs whose metadata holds every pair given, each
        exactly (``RunInfo.metadata``, from ``info["metadata"]``, set when the run is created);
        ``updated_before``/``updated_after`` are strict bounds (``as_cutoff`` turns a datetime or ISO string
        into the stored form). Read the arguments with ``ListQuery.of``. ``cursor`` resumes a listing where a page
        ended: decode it with ``ListCursor.decode`` and keep the runs ``ListCursor.admits``. Page with
        ``list_page``, which makes the cursors. ``lease_owner`` is ``host:pid`` while the run is held.
        A run whose records cannot be read is listed (status ``damaged``) rather than breaking the listing.

        Raises:
            ValueError: a bad cursor, time bound or metadata filter.
        """
        return self._on_loop(self.alist(status=status, agent=agent, parent_id=parent_id, root_id=root_id,
                                        updated_before=updated_before, updated_after=updated_after, limit=limit,
                                        cursor=cursor, metadata=metadata))  # fmt: skip

    def delete(self, run_id: str, *, children: bool = False) -> None:
        """Delete a run's journal and inbox (and with ``children=True`` its subagent runs), all or nothing.

        A subagent run whose parent exists is never deleted alone (its parent would re-create it and run
        its tools again): delete the root with ``children=True``. A subagent run whose parent is gone (an
        orphan) may be deleted. After a delete the id may be created again; posts to it fail with
        RunNotFoundError. (FileStore deletes the root first, so a crash part-way leaves only orphans.)

        Raises:
            RunBusyError: the run, or with ``children=True`` any of its subagent runs, is held; nothing is
                deleted.
            RunNotFoundError: no such run.
            ValueError: the run is a subagent of an existing run, or has subagent runs and ``children`` is
                False.
        """
        self._on_loop(self.adelete(run_id, children=children))

    def prune(
        self,
        older_than: datetime | timedelta | str,
        *,
        statuses: Sequence[str] = j.STOP_STATUSES,
        children: bool = False,
        dry_run: bool = False,
    ) -> builtins.list[str]:
        """Delete old stopped runs and return their ids (with ``dry_run``, only return them).

        Prune works on trees. A root goes when all of these hold: its status is in ``statuses`` (each one
        of ``completed``, ``cancelled``, ``failed``, ``stopped``), its ``updated_at`` is before the cutoff
        (a datetime, naive meaning UTC; an ISO string; or a timedelta before now), no one holds it, and it
        has no unconsumed items (those may reopen it). A root with subagent runs goes only with
        ``children=True``, and then with its whole tree, only when every run of the tree is stopped (any
        stop status) and not held. A subagent run is never pruned on its own, so never while its root is
        kept. Held runs are skipped (kept), never an error: prune does not raise RunBusyError. Each tree is
        checked and deleted in one step: a run taken, posted to or reopened meanwhile is kept.

        Returns:
            The deleted ids: roots oldest first, each followed by its subagent runs.

        Raises:
            ValueError: a status that is not a stop, or a bad cutoff.
        """
        return self._on_loop(self.aprune(older_than, statuses=statuses, children=children, dry_run=dry_run))

    # --------------------------------------------------------------------------------------------
    # Built on the primitives

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Store) and other.identity == self.identity

    def __hash__(self) -> int:
        return hash(self.identity)

    async def run_io(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run a sync primitive on the store's own threads (``io_threads``), never the default executor."""
        if kwargs:
            return await self.io_threads.run(lambda: fn(*args, **kwargs))
        return await self.io_threads.run(fn, *args)

    def load(self, run_id: str) -> State:
        """The run as its journal says: pure replay; never writes, never recovers."""
        return self.operate(operations.load, run_id)

    def exists(self, run_id: str) -> bool:
        """Whether the store has the run."""
        return self.operate(operations.exists, run_id)

    def check_state(self, state: State) -> None:
        """Refuse a State that belongs to another store (ValueError)."""
        operations.check_state(AsyncFace(self), state)

    def save(self, state: State) -> State:
        """Write what the store lacks: a new run, or the changes made on ``state``; nothing if none.

        A new run (no history) is created unheld. Changes (``add_message``, ``approve``, ``deny``) are posted
        to the run's inbox; then, when no one holds the run (and it is not a subagent run), this process
        takes it, journals the inbox and releases it (``settle``), and ``state`` catches up with the
        journal. When a driver holds it, the driver journals them within its poll interval. A save with
        nothing to write takes nothing and writes nothing; ``state`` only catches up.
        """
        return self.operate(operations.save, state)

    def catch_up(self, state: State) -> None:
        """Fold into ``state`` the durable entries it has not seen."""
        self.operate(operations.catch_up, state)

    def settle(self, run_id: str, *, by_parent: bool = False) -> State | None:
        """Take the run if no one holds it, journal its inbox, release it; None when it is held.

        This is the short-lived taker of DURABILITY 1 (``store.save``, ``store.cancel``, ``tether approve``):
        it consumes first and writes nothing else; approved calls are started later by a driver. A take
        with nothing to consume writes nothing. A subagent run is not taken by a poster (DURABILITY 6: its
        root's driver consumes its inbox): None is returned for it, unless ``by_parent`` says the caller
        acts for its parent (it holds the parent, or cancels the tree from the top, children first).
        """
        return self.operate(operations.settle, run_id, by_parent=by_parent)

    def cancel(self, run_id: str, by: str | None = None) -> State | None:
        """Ask to cancel the run and, first, its open subagent runs: posted, journaled now if no one holds it.

        Each run of the tree gets a cancel item in its inbox, children first (DURABILITY 6), and is settled
        at once when no one holds it. Returns the run after the cancel was journaled, or None when a driver
        holds it (it stops the run within its poll interval).
        """
        return self.operate(operations.cancel_tree, run_id, by)

    def follow(
        self, run_id: str, after_seq: int = -1, *, poll_interval: float = 0.2
    ) -> AsyncIterator[j.Entry]:
        """Replay, then tail, the entries of a run driven elsewhere: no gaps, no duplicates.

        Ends when the run has stopped (``completed``, ``failed``, ``cancelled`` or ``stopped``) and nothing
        is left to read; a consumer may stop earlier.
        """
        return operations.follow(AsyncFace(self), run_id, after_seq, poll_interval)

    def ids_matching(self, short: str) -> builtins.list[str]:
        """The ids of the runs that ``short`` abbreviates, sorted; an id equal to ``short`` is one of them.

        ``short`` abbreviates an id when each of its ``-``-separated parts begins the id's part in the same
        place: ``0195f3a2`` abbreviates every id beginning with it (a root and its subagent runs), and
        ``0195f3a2-7c3e`` the subagent runs whose own part begins with ``7c3e``. Generic: a scan of ``list``
        (a store may answer it from an index instead).

        Raises:
            ValueError: ``short`` is not a valid run id.
        """
        return self.operate(operations.ids_matching, short)

    def fork(self, run_id: str, at_seq: int | None = None, new_id: str | None = None) -> str:
        """Copy a run's journal up to a turn boundary into a new run, created unheld; return the new id.

        ``at_seq`` (default: the last entry) is rounded down to a turn boundary: the last ``run_started``,
        ``message``, ``model_replied``, ``tool_finished``, ``compacted`` or ``run_stopped`` at or before it
        after which no call is open (after the last ``tool_finished`` of a reply, or right after a reply
        without calls, a message or a stop); a driver's bookkeeping after it (``run_resumed``,
        ``run_released``, ``model_failed``, ...) is left out. The new run's journal is a new ``run_started`` (the source's agent,
        fingerprint, budgets, output type and metadata, ``forked_from {"id": run_id, "seq": boundary}``) followed by the source's
        entries 1..boundary with the same seqs, kinds, fields and times, re-sealed as one append by a new
        writer (``w`` and ``h`` cover the seq, so they are new). Inherited ``tool_started`` entries keep their
        idempotency keys. Inherited entries that came from the source's inbox lose that link (``inbox_seq``
        and ``item_id`` None; ``inbox_skipped`` gets ``inbox_seq`` -1), because the fork's inbox starts
        empty. A fork of a ``running`` point needs work, so a worker may pick it up at once. Generic: built on
        ``read`` and ``create``.

        Raises:
            RunNotFoundError: no such run.
            ValueError: ``at_seq`` outside the journal, ``new_id`` exists or is invalid, or the run is a
                subagent run (fork its root).
        """
        return self.operate(operations.fork, run_id, at_seq, new_id)

    def list_page(
        self,
        *,
        status: str | None = None,
        agent: str | None = None,
        parent_id: str | None = None,
        root_id: str | None = None,
        updated_before: datetime | str | None = None,
        updated_after: datetime | str | None = None,
        limit: int = 100,
        cursor: str | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> tuple[builtins.list[RunInfo], str | None]:
        """One page of ``list`` and the cursor of the next page (None: there is no more).

        Pages are newest first, by a keyset cursor on ``(updated_at, id)``. A run updated while paging may
        appear twice (again in a later page), never be skipped, as far as the writers' clocks agree: once
        the runs present at the start are listed, later pages list the runs updated since. Generic: built
        on ``list``.

        Raises:
            ValueError: a bad cursor, time bound, metadata filter or limit.
        """
        filters = {"status": status, "agent": agent, "parent_id": parent_id, "root_id": root_id,
                   "updated_before": updated_before, "updated_after": updated_after, "metadata": metadata}  # fmt: skip
        return self.operate(operations.list_page, filters, limit=limit, cursor=cursor)

    # --------------------------------------------------------------------------------------------
    # The async face: the twin of every public method (DESIGN 8.1), "without blocking the event loop"
    #
    # A primitive's twin runs the sync primitive on the store's threads unless the store overrides it
    # (then the store is ``async_native``). A composite's twin runs its operation over the async twins on
    # the caller's loop for an async-native store, else the sync composite on the store's threads (one trip).
    # fmt: off

    async def acreate(self, run_id: str, entries: Sequence[j.Entry], info: dict[str, Any], *,
                      owner: Owner | None = None, ttl: float | None = None) -> Lease | None:
        """``create``, awaited."""
        return await self.run_io(self.create, run_id, entries, info, owner=owner, ttl=ttl)

    async def aappend(self, run_id: str, entries: Sequence[j.Entry], *, expected_seq: int, writer: str,
                      lease_token: int | None, info: dict[str, Any]) -> int | None:
        """``append``, awaited. A cancelled await may leave the outcome unknown, as a lost connection does:
        a retry of the same batch settles it (the same-writer rule)."""
        return await self.run_io(self.append, run_id, entries, expected_seq=expected_seq, writer=writer,
                          lease_token=lease_token, info=info)

    async def aread(self, run_id: str, after_seq: int = -1) -> builtins.list[j.Entry]:
        """``read``, awaited."""
        return await self.run_io(self.read, run_id, after_seq)

    async def alength(self, run_id: str) -> int:
        """``length``, awaited."""
        return await self.run_io(self.length, run_id)

    async def apost(self, run_id: str, item: dict[str, Any], *, item_id: str | None = None) -> int:
        """``post``, awaited."""
        return await self.run_io(self.post, run_id, item, item_id=item_id)

    async def aread_inbox(self, run_id: str, after_seq: int = -1) -> builtins.list[InboxItem]:
        """``read_inbox``, awaited."""
        return await self.run_io(self.read_inbox, run_id, after_seq)

    async def ainbox_length(self, run_id: str) -> int:
        """``inbox_length``, awaited."""
        return await self.run_io(self.inbox_length, run_id)

    async def aclaim(self, run_id: str, owner: Owner, ttl: float | None = None) -> Lease:
        """``claim``, awaited."""
        return await self.run_io(self.claim, run_id, owner, ttl)

    async def aclaim_next(self, owner: Owner, ttl: float | None = None,
                          agents: Collection[str] | None = None) -> Lease | None:
        """``claim_next``, awaited."""
        return await self.run_io(self.claim_next, owner, ttl, agents)

    async def arenew(self, lease: Lease) -> Lease:
        """``renew``, awaited."""
        return await self.run_io(self.renew, lease)

    async def arelease(self, lease: Lease, *, at_seq: int, inbox_len: int) -> bool:
        """``release``, awaited."""
        return await self.run_io(self.release, lease, at_seq=at_seq, inbox_len=inbox_len)

    async def aabandon(self, lease: Lease) -> None:
        """``abandon``, awaited; never raises."""
        await self.run_io(self.abandon, lease)

    async def aholder(self, run_id: str) -> Owner | None:
        """``holder``, awaited."""
        return await self.run_io(self.holder, run_id)

    async def alist(self, *, status: str | None = None, agent: str | None = None, parent_id: str | None = None,
                    root_id: str | None = None, updated_before: datetime | str | None = None,
                    updated_after: datetime | str | None = None, limit: int = 100, cursor: str | None = None,
                    metadata: Mapping[str, str] | None = None) -> builtins.list[RunInfo]:
        """``list``, awaited."""
        return await self.run_io(self.list, status=status, agent=agent, parent_id=parent_id, root_id=root_id,
                                 updated_before=updated_before, updated_after=updated_after, limit=limit,
                                 cursor=cursor, metadata=metadata)

    async def adelete(self, run_id: str, *, children: bool = False) -> None:
        """``delete``, awaited."""
        await self.run_io(self.delete, run_id, children=children)

    async def aprune(self, older_than: datetime | timedelta | str, *, statuses: Sequence[str] = j.STOP_STATUSES,
                     children: bool = False, dry_run: bool = False) -> builtins.list[str]:
        """``prune``, awaited."""
        return await self.run_io(self.prune, older_than, statuses=statuses, children=children, dry_run=dry_run)

    async def aload(self, run_id: str) -> State:
        """``load``, awaited."""
        return await self.aoperate(operations.load, run_id)

    async def aexists(self, run_id: str) -> bool:
        """``exists``, awaited."""
        return await self.aoperate(operations.exists, run_id)

    async def asave(self, state: State) -> State:
        """``save``, awaited."""
        return await self.aoperate(operations.save, state)

    async def acatch_up(self, state: State) -> None:
        """``catch_up``, awaited."""
        await self.aoperate(operations.catch_up, state)

    async def asettle(self, run_id: str, *, by_parent: bool = False) -> State | None:
        """``settle``, awaited."""
        return await self.aoperate(operations.settle, run_id, by_parent=by_parent)

    async def acancel(self, run_id: str, by: str | None = None) -> State | None:
        """``cancel``, awaited."""
        return await self.aoperate(operations.cancel_tree, run_id, by)

    async def aids_matching(self, short: str) -> builtins.list[str]:
        """``ids_matching``, awaited (a sync store's own ``ids_matching``, which may use an index)."""
        if not self.async_native:
            return await self.run_io(self.ids_matching, short)
        return await self.aoperate(operations.ids_matching, short)

    async def afork(self, run_id: str, at_seq: int | None = None, new_id: str | None = None) -> str:
        """``fork``, awaited."""
        return await self.aoperate(operations.fork, run_id, at_seq, new_id)

    async def alist_page(self, *, status: str | None = None, agent: str | None = None,
                         parent_id: str | None = None, root_id: str | None = None,
                         updated_before: datetime | str | None = None, updated_after: datetime | str | None = None,
                         limit: int = 100, cursor: str | None = None, metadata: Mapping[str, str] | None = None
                         ) -> tuple[builtins.list[RunInfo], str | None]:
        """``list_page``, awaited."""
        filters = {"status": status, "agent": agent, "parent_id": parent_id, "root_id": root_id,
                   "updated_before": updated_before, "updated_after": updated_after, "metadata": metadata}
        return await self.aoperate(operations.list_page, filters, limit=limit, cursor=cursor)

    async def aclose(self) -> None:
        """``close``, awaited (an async-native store closes its async connections too)."""
        await self.run_io(self.close)

    async def aclose_loop(self) -> None:
        """Close what this store holds for the running event loop (PostgresStore: that loop's async pool).

        Await it before an event loop of your own ends (an ASGI app's shutdown) when the store was used
        on it: a pool left running when its loop ends can keep ``asyncio.run`` from returning. The store
        stays usable: its sync face, and other loops (a later call on this loop opens a new pool).
        ``Worker.run`` does this for the loop it runs (``Agent.run`` keeps one loop per thread, open).
        """
        return None  # nothing is per loop here: a store's async face runs on its threads

    # fmt: on
    # --------------------------------------------------------------------------------------------
    # Running an operation on either face

    def operate(self, op: Callable[..., Coroutine[Any, Any, T]], *args: Any, **kwargs: Any) -> T:
        """Run an operation of ``tether.stores.operations`` over the sync primitives, on this thread."""
        return run_sync(op(SyncFace(self), *args, **kwargs))

    async def aoperate(self, op: Callable[..., Coroutine[Any, Any, T]], *args: Any, **kwargs: Any) -> T:
        """Run an operation over the async twins on this loop (an async-native store), else on a store thread."""
        if self.async_native:
            return await op(AsyncFace(self), *args, **kwargs)
        return await self.run_io(self.operate, op, *args, **kwargs)

    def _on_loop(self, coro: Coroutine[Any, Any, T]) -> T:
        """The sync face of an async-only primitive: ``coro`` on the store's own loop thread."""
        if self._loop_thread is None:
            self._loop_thread = LoopThread(f"tether-store-loop-{id(self):x}")
        return self._loop_thread.run(coro)

    def close(self) -> None:
        """Release resources (the I/O threads, the loop thread, connections)."""
        self.io_threads.shutdown()
        if self._loop_thread is not None:
            self._loop_thread.close()
