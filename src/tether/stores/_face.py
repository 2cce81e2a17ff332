"""The two faces a store's operations run over: its sync primitives and its async ones (DESIGN 8.1).

Each composite operation (``tether.stores.operations``) is written once, as a coroutine over a ``Face``:
the primitives as awaitables. ``AsyncFace`` awaits the store's ``a``-prefixed twins; ``SyncFace`` calls
the sync primitives and returns at once, so a coroutine over it never suspends and ``run_sync`` drives it to
its end on the calling thread, with no event loop. One text of each operation serves ``load`` and
``aload``, ``save`` and ``asave``, and so on.
"""

from __future__ import annotations

import builtins
from collections.abc import Coroutine, Sequence
from typing import Any, Protocol, TypeVar

from .. import journal as j
from ..inbox import InboxItem
from ._records import Lease, Owner, RunInfo

__all__ = ["AsyncFace", "Face", "SyncFace", "run_sync"]

T = TypeVar("T")


class Face(Protocol):
    """The store primitives the operations use, as coroutines (see ``tether.stores.base.Store``)."""

    @property
    def ttl(self) -> float | None: ...

    @property
    def identity(self) -> str: ...

    async def create(
        self,
        run_id: str,
        entries: Sequence[j.Entry],
        info: dict[str, Any],
        *,
        owner: Owner | None = None,
        ttl: float | None = None,
    ) -> Lease | None: ...

    async def append(
        self,
        run_id: str,
        entries: Sequence[j.Entry],
        *,
        expected_seq: int,
        writer: str,
        lease_token: int | None,
        info: dict[str, Any],
    ) -> None: ...

    async def read(self, run_id: str, after_seq: int = -1) -> builtins.list[j.Entry]: ...

    async def length(self, run_id: str) -> int: ...

    async def post(self, run_id: str, item: dict[str, Any], *, item_id: str | None = None) -> int: ...

    async def read_inbox(self, run_id: str, after_seq: int = -1) -> builtins.list[InboxItem]: ...

    async def inbox_length(self, run_id: str) -> int: ...

    async def claim(self, run_id: str, owner: Owner, ttl: float | None = None) -> Lease: ...

    async def release(self, lease: Lease, *, at_seq: int, inbox_len: int) -> bool: ...

    async def abandon(self, lease: Lease) -> None: ...

    async def list(self, **filters: Any) -> builtins.list[RunInfo]: ...


class SyncFace:
    """The store's sync primitives as coroutines that never suspend (driven by ``run_sync``)."""

    __slots__ = ("store",)

    def __init__(self, store: Any) -> None:  # a ``Store`` (not imported: ``stores.base`` imports this module)
        self.store = store

    @property
    def ttl(self) -> float | None:
        return self.store.ttl

    @property
    def identity(self) -> str:
        return self.store.identity

    async def create(self, run_id: str, entries: Sequence[j.Entry], info: dict[str, Any], *,
                     owner: Owner | None = None, ttl: float | None = None) -> Lease | None:  # fmt: skip
        return self.store.create(run_id, entries, info, owner=owner, ttl=ttl)

    async def append(self, run_id: str, entries: Sequence[j.Entry], *, expected_seq: int, writer: str,
                     lease_token: int | None, info: dict[str, Any]) -> None:  # fmt: skip
        self.store.append(run_id, entries, expected_seq=expected_seq, writer=writer, lease_token=lease_token,
                          info=info)  # fmt: skip

    async def read(self, run_id: str, after_seq: int = -1) -> builtins.list[j.Entry]:
        return self.store.read(run_id, after_seq)

    async def length(self, run_id: str) -> int:
        return self.store.length(run_id)

    async def post(self, run_id: str, item: dict[str, Any], *, item_id: str | None = None) -> int:
        return self.store.post(run_id, item, item_id=item_id)

    async def read_inbox(self, run_id: str, after_seq: int = -1) -> builtins.list[InboxItem]:
        return self.store.read_inbox(run_id, after_seq)

    async def inbox_length(self, run_id: str) -> int:
        return self.store.inbox_length(run_id)

    async def claim(self, run_id: str, owner: Owner, ttl: float | None = None) -> Lease:
        return self.store.claim(run_id, owner, ttl)

    async def release(self, lease: Lease, *, at_seq: int, inbox_len: int) -> bool:
        return self.store.release(lease, at_seq=at_seq, inbox_len=inbox_len)

    async def abandon(self, lease: Lease) -> None:
        self.store.abandon(lease)

    async def list(self, **filters: Any) -> builtins.list[RunInfo]:
        return self.store.list(**filters)


class AsyncFace:
    """The store's async twins (native, or the sync primitive on the store's threads)."""

    __slots__ = ("store",)

    def __init__(self, store: Any) -> None:  # a ``Store`` (not imported: ``stores.base`` imports this module)
        self.store = store

    @property
    def ttl(self) -> float | None:
        return self.store.ttl

    @property
    def identity(self) -> str:
        return self.store.identity

    async def create(self, run_id: str, entries: Sequence[j.Entry], info: dict[str, Any], *,
                     owner: Owner | None = None, ttl: float | None = None) -> Lease | None:  # fmt: skip
        return await self.store.acreate(run_id, entries, info, owner=owner, ttl=ttl)

    async def append(self, run_id: str, entries: Sequence[j.Entry], *, expected_seq: int, writer: str,
                     lease_token: int | None, info: dict[str, Any]) -> None:  # fmt: skip
        await self.store.aappend(run_id, entries, expected_seq=expected_seq, writer=writer,
                                 lease_token=lease_token, info=info)  # fmt: skip

    async def read(self, run_id: str, after_seq: int = -1) -> builtins.list[j.Entry]:
        return await self.store.aread(run_id, after_seq)

    async def length(self, run_id: str) -> int:
        return await self.store.alength(run_id)

    async def post(self, run_id: str, item: dict[str, Any], *, item_id: str | None = None) -> int:
        return await self.store.apost(run_id, item, item_id=item_id)

    async def read_inbox(self, run_id: str, after_seq: int = -1) -> builtins.list[InboxItem]:
        return await self.store.aread_inbox(run_id, after_seq)

    async def inbox_length(self, run_id: str) -> int:
        return await self.store.ainbox_length(run_id)

    async def claim(self, run_id: str, owner: Owner, ttl: float | None = None) -> Lease:
        return await self.store.aclaim(run_id, owner, ttl)

    async def release(self, lease: Lease, *, at_seq: int, inbox_len: int) -> bool:
        return await self.store.arelease(lease, at_seq=at_seq, inbox_len=inbox_len)

    async def abandon(self, lease: Lease) -> None:
        await self.store.aabandon(lease)

    async def list(self, **filters: Any) -> builtins.list[RunInfo]:
        return await self.store.alist(**filters)


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Drive a coroutine over a ``SyncFace`` to its end on this thread; it must never suspend.

    Raises:
        RuntimeError: the coroutine awaited something that suspends (it was written for an event loop).
    """
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise RuntimeError(
        "a store operation suspended on its sync face. Fix: await its a-prefixed twin from async code"
    )
