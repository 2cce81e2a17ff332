"""The async face of every store (DESIGN 8.1): the ``a``-prefixed twins never block the event loop, a store
that implements only async primitives gets its sync face from the base and passes the conformance suite
through both faces, and the driver awaits a store's native twins rather than sending it to threads."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Collection, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

pytest.register_assert_rewrite("tether._harness.conformance.suite")

from tether import Agent, State, tool  # noqa: E402
from tether import journal as j  # noqa: E402
from tether._harness.conformance.suite import StoreConformance  # noqa: E402
from tether.inbox import InboxItem  # noqa: E402
from tether.stores import FileStore, MemoryStore, Store  # noqa: E402
from tether.stores.base import Lease, Owner, RunInfo  # noqa: E402
from tether.stores.sqlite import SQLiteStore  # noqa: E402
from tether.testing import ScriptedModel, call  # noqa: E402


class AsyncOnlyStore(Store):
    """A store implementing only the async primitives: each suspends once, then keeps the run in memory.

    Its sync methods (``read``, ``load``, ...) come from ``Store``, which runs these coroutines on the
    store's own loop thread; ``sync_calls`` counts those trips.
    """

    def __init__(self) -> None:
        super().__init__()
        self._runs = MemoryStore()  # the bookkeeping only; every method here is a coroutine that suspends
        self.sync_calls = 0

    @property
    def identity(self) -> str:
        return f"async-only:{id(self):x}"

    def _on_loop(self, coro: Any) -> Any:
        self.sync_calls += 1
        return super()._on_loop(coro)

    async def acreate(self, run_id: str, entries: Sequence[j.Entry], info: dict[str, Any], *,
                      owner: Owner | None = None, ttl: float | None = None) -> Lease | None:  # fmt: skip
        await asyncio.sleep(0)
        return self._runs.create(run_id, entries, info, owner=owner, ttl=ttl)

    async def aappend(self, run_id: str, entries: Sequence[j.Entry], *, expected_seq: int, writer: str,
                      lease_token: int | None, info: dict[str, Any]) -> None:  # fmt: skip
        await asyncio.sleep(0)
        self._runs.append(run_id, entries, expected_seq=expected_seq, writer=writer, lease_token=lease_token,
                          info=info)  # fmt: skip

    async def aread(self, run_id: str, after_seq: int = -1) -> list[j.Entry]:
        await asyncio.sleep(0)
        return self._runs.read(run_id, after_seq)

    async def alength(self, run_id: str) -> int:
        await asyncio.sleep(0)
        return self._runs.length(run_id)

    async def apost(self, run_id: str, item: dict[str, Any], *, item_id: str | None = None) -> int:
        await asyncio.sleep(0)
        return self._runs.post(run_id, item, item_id=item_id)

    async def aread_inbox(self, run_id: str, after_seq: int = -1) -> list[InboxItem]:
        await asyncio.sleep(0)
        return self._runs.read_inbox(run_id, after_seq)

    async def ainbox_length(self, run_id: str) -> int:
        await asyncio.sleep(0)
        return self._runs.inbox_length(run_id)

    async def aclaim(self, run_id: str, owner: Owner, ttl: float | None = None) -> Lease:
        await asyncio.sleep(0)
        return self._runs.claim(run_id, owner, ttl)

    async def aclaim_next(self, owner: Owner, ttl: float | None = None,
                          agents: Collection[str] | None = None) -> Lease | None:  # fmt: skip
        await asyncio.sleep(0)
        return self._runs.claim_next(owner, ttl, agents)

    async def arenew(self, lease: Lease) -> Lease:
        await asyncio.sleep(0)
        return self._runs.renew(lease)

    async def arelease(self, lease: Lease, *, at_seq: int, inbox_len: int) -> bool:
        await asyncio.sleep(0)
        return self._runs.release(lease, at_seq=at_seq, inbox_len=inbox_len)

    async def aabandon(self, lease: Lease) -> None:
        await asyncio.sleep(0)
        self._runs.abandon(lease)

    async def aholder(self, run_id: str) -> Owner | None:
        await asyncio.sleep(0)
        return self._runs.holder(run_id)

    async def alist(self, **filters: Any) -> list[RunInfo]:  # type: ignore[override]
        await asyncio.sleep(0)
        return self._runs.list(**filters)

    async def adelete(self, run_id: str, *, children: bool = False) -> None:
        await asyncio.sleep(0)
        self._runs.delete(run_id, children=children)

    async def aprune(self, older_than: datetime | timedelta | str, *, statuses: Sequence[str] = j.STOP_STATUSES,
                     children: bool = False, dry_run: bool = False) -> list[str]:  # fmt: skip
        await asyncio.sleep(0)
        return self._runs.prune(older_than, statuses=statuses, children=children, dry_run=dry_run)


class TestAsyncOnlyStore(StoreConformance):
    multiprocess_skip_reason = "this async-only store keeps its runs in one process's memory"

    def make_store(self, tmp_path: Path) -> Store:
        return AsyncOnlyStore()

    def reopen(self, store: Store, tmp_path: Path) -> Store:
        return store


def test_a_store_with_neither_face_of_a_primitive_is_refused_with_the_fix() -> None:
    class Half(Store):
        identity = "half"  # type: ignore[assignment]

        async def aread(self, run_id: str, after_seq: int = -1) -> list[j.Entry]:
            return []

    with pytest.raises(TypeError, match=r"implements neither create nor acreate.*Fix: implement"):
        Half()


def test_which_face_is_native() -> None:
    assert AsyncOnlyStore.async_native
    assert not MemoryStore.async_native and not FileStore.async_native and not SQLiteStore.async_native


# --------------------------------------------------------------------------------------------------
# No blocking of the loop: a ticker keeps ticking while a slow store call runs


def _slow_sync_store(kind: str, tmp_path: Path) -> Store:
    return {"memory": MemoryStore, "file": lambda: FileStore(tmp_path / "runs"),
            "sqlite": lambda: SQLiteStore(tmp_path / "runs.db")}[kind]()  # fmt: skip


async def _with_ticker(call: Callable[[threading.Event], Awaitable[Any]]) -> tuple[Any, int]:
    """Await ``call(released)`` while a ticker task ticks; ``released`` is set after its third tick."""
    released, ticks = threading.Event(), 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.005)
            ticks += 1
            if ticks == 3:
                released.set()

    task = asyncio.create_task(ticker())
    try:
        return await call(released), ticks
    finally:
        task.cancel()


@pytest.mark.parametrize("kind", ["memory", "file", "sqlite"])
def test_twins_of_a_sync_store_run_on_its_threads_while_the_loop_ticks(kind: str, tmp_path: Path) -> None:
    store = _slow_sync_store(kind, tmp_path)
    store.save(State(id="r1", messages=["hello"]))
    waited: list[bool] = []
    gates: list[threading.Event] = []  # the ticker's event of the call in progress
    read = store.read

    def slow_read(run_id: str, after_seq: int = -1) -> list[j.Entry]:
        waited.append(gates[-1].wait(10))  # returns at once only when the loop ticked three times meanwhile
        return read(run_id, after_seq)

    store.read = slow_read  # type: ignore[method-assign]

    async def main() -> None:
        for twin in (lambda: store.aload("r1"), lambda: store.afork("r1"), lambda: store.acancel("r1")):

            async def one(released: threading.Event, twin: Any = twin) -> Any:
                gates.append(released)
                return await twin()

            result, ticks = await _with_ticker(one)
            assert result is not None and ticks >= 3

    asyncio.run(main())
    assert len(waited) >= 3 and all(waited)  # every slow read saw the ticker tick: the loop was never blocked
    assert store.load("r1").status == "cancelled"
    store.close()


def test_twins_of_an_async_only_store_are_awaited_on_the_callers_loop() -> None:
    store = AsyncOnlyStore()

    async def main() -> None:
        state = await store.asave(State(id="r1", messages=["hello"]))
        assert (await store.aload("r1")).history == state.history
        assert [info.id for info in await store.alist()] == ["r1"]
        page, cursor = await store.alist_page(limit=1)
        assert [info.id for info in page] == ["r1"] and cursor is None
        fork = await store.afork("r1", new_id="r2")
        assert await store.aexists(fork) and await store.aids_matching("r") == ["r1", "r2"]
        assert (await store.acancel("r1")).status == "cancelled"  # type: ignore[union-attr]
        assert await store.aprune(timedelta(0), statuses=["cancelled"]) == ["r1"]
        await store.adelete("r2")
        assert await store.alist() == []

    asyncio.run(main())
    assert store.sync_calls == 0  # nothing went through the sync face
    store.close()


@tool
def double(n: int) -> int:
    """Double a number.

    Args:
        n: The number.
    """
    return 2 * n


def test_the_driver_awaits_native_twins() -> None:
    store = AsyncOnlyStore()
    agent = Agent(model=ScriptedModel([call("double", n=21), "42"]), tools=[double], store=store)
    state = asyncio.run(agent.arun("double 21", id="d1"))
    assert state.status == "completed" and state.answer == "42"
    assert store.sync_calls == 0  # every store call of the drive was awaited on the caller's loop
    again = agent.run("double 21", id="d1", if_exists="resume")  # Agent.run drives on its own loop: the same
    assert again.status == "completed" and store.sync_calls == 0
    assert store.load("d1").history == state.history  # the sync face: on the store's loop thread
    assert store.sync_calls == 1
    store.close()
