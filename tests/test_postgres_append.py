"""What an append and a turn cost PostgresStore on the wire (DESIGN 13: one transaction and at most 3 client
round trips per append, 2 commits per one-call turn), read by a counting proxy (``_pg_wire.py``), and what
the append returns: the inbox's length, read in its own transaction, on the fast path and the slow one.
Both faces. One fresh schema per module; skipped without a server, failed when
``TETHER_REQUIRE_POSTGRES=1``."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).with_name("crash")))

from _chaos_agents import fresh_schema

from _pg_wire import Counts, WireCounter
from _store_runs import _batch, _info, _make
from tether import Agent, tool
from tether import journal as j
from tether.errors import ConflictError, LeaseLostError
from tether.testing import ScriptedModel, call

if os.environ.get("TETHER_REQUIRE_POSTGRES") != "1":
    pytest.importorskip("psycopg", reason="psycopg is not installed. Fix: pip install 'tether[postgres]'")

from tether.stores.postgres import PostgresStore

Append = Callable[[list[j.Entry], Any], int]


@pytest.fixture(scope="module")
def wire() -> Iterator[tuple[WireCounter, str]]:
    with fresh_schema("tether_test_pg_append") as dsn, WireCounter() as counter:
        store = PostgresStore(dsn)
        store.migrate()
        store.close()
        yield counter, counter.dsn(dsn)


@contextlib.contextmanager
def _faces(store: PostgresStore, run_id: str) -> Iterator[dict[str, Append]]:
    """Append a batch through each face; each returns what the store's append returned. The store closes
    when the block ends (the async pool on its loop)."""
    loop = asyncio.new_event_loop()

    def sync(batch: list[j.Entry], lease: Any) -> int:
        return store.append(run_id, batch, expected_seq=batch[0].seq, writer=batch[0].w,
                            lease_token=lease.token, info=_info(run_id))  # fmt: skip

    def awaited(batch: list[j.Entry], lease: Any) -> int:
        return loop.run_until_complete(store.aappend(run_id, batch, expected_seq=batch[0].seq, writer=batch[0].w,
                                                     lease_token=lease.token, info=_info(run_id)))  # fmt: skip

    try:
        yield {"sync": sync, "async": awaited}
    finally:
        loop.run_until_complete(store.aclose())
        loop.close()


@pytest.mark.parametrize("face", ["sync", "async"])
def test_an_append_is_one_transaction_of_one_statement_and_returns_the_inbox_length(
    face: str, wire: tuple[WireCounter, str]
) -> None:
    counter, dsn = wire
    store = PostgresStore(dsn, pool_min=1, pool_max=1)
    run_id = f"one-{face}"
    writer, lease = _make(store, run_id, held=True)
    with _faces(store, run_id) as faces:
        append = faces[face]
        assert (
            append(_batch(2, 1, writer, run_id=run_id), lease) == 0
        )  # the connection made, the statement seen once
        store.post(run_id, {"type": "message", "content": "hi"})
        costs: list[Counts] = []
        seq = 3
        for i in range(18):  # batches of 1, 2 and 3 entries, 6 of each
            before = counter.counts()
            assert (
                append(_batch(seq, 1 + i % 3, writer, run_id=run_id), lease) == 1
            )  # the post, counted in the same statement
            costs.append(counter.counts() - before)
            seq += 1 + i % 3
        assert all(c.transactions == 1 and c.statements == 1 for c in costs), costs
        assert all(c.round_trips == 1 + c.prepares for c in costs), costs  # psycopg preparing it: once
        assert sum(c.prepares for c in costs) == 3, costs  # a text per batch size, on one connection
        assert store.length(run_id) == seq


@pytest.mark.parametrize("face", ["sync", "async"])
def test_the_slow_path_settles_a_retry_and_refuses_other_writers_and_stale_tokens(
    face: str, wire: tuple[WireCounter, str]
) -> None:
    _, dsn = wire
    store = PostgresStore(dsn)
    run_id = f"slow-{face}"
    writer, lease = _make(store, run_id, held=True)
    with _faces(store, run_id) as faces:
        append = faces[face]
        batch = _batch(2, 2, writer, run_id=run_id)
        assert append(batch, lease) == 0
        store.post(run_id, {"type": "message", "content": "hi"})
        assert (
            append(batch, lease) == 1
        )  # a retried head (its COMMIT's outcome unknown): skipped, not doubled
        assert [e.seq for e in store.read(run_id)] == [0, 1, 2, 3]
        with pytest.raises(ConflictError):
            append(
                _batch(2, 1, j.new_writer_id(), run_id=run_id), lease
            )  # another writer's entry where this one's is stored
        stale = dataclasses.replace(lease, token=lease.token - 1)
        with pytest.raises(LeaseLostError):
            append(
                _batch(4, 1, writer, run_id=run_id), stale
            )  # a superseded token: refused whatever it holds
        assert append(_batch(4, 1, writer, run_id=run_id), lease) == 1  # the fast path again
        assert [e.seq for e in store.read(run_id)] == [0, 1, 2, 3, 4]


def test_a_one_call_turn_costs_two_transactions_and_at_most_six_round_trips(
    wire: tuple[WireCounter, str],
) -> None:
    counter, dsn = wire

    @tool(effect="read_only")
    def lookup(n: int) -> str:
        """Look a number up.

        Args:
            n: The number.
        """
        return f"result {n}"

    appends: list[Counts] = []

    def drive(turns: int) -> Counts:
        replies: list[object] = [call("lookup", n=i) for i in range(turns)]
        store = PostgresStore(dsn, ttl=600)  # no renewal falls inside the runs
        agent = Agent(ScriptedModel([*replies, "done"]), name="turns", tools=[lookup], store=store,
                      poll_interval=600)  # fmt: skip  # no inbox poll either: each append reads the length
        real = store.aappend

        async def counted(*args: Any, **kwargs: Any) -> int:
            before = counter.counts()
            try:
                return await real(*args, **kwargs)
            finally:
                appends.append(counter.counts() - before)

        store.aappend = counted  # type: ignore[method-assign]

        async def run() -> Counts:
            before = counter.counts()
            try:
                state = await agent.arun("go")
            finally:
                await store.aclose()
            assert state.status == "completed" and state.turn == turns + 1
            return counter.counts() - before

        return asyncio.run(run())

    small, large = drive(3), drive(13)  # the difference: 10 turns, a run's fixed costs left out
    per = large - small
    assert per.transactions == 2 * 10 and per.statements == 2 * 10, per  # the two appends, nothing else
    assert per.round_trips <= 6 * 10, per
    assert len(appends) == 2 * (3 + 13) + 2 * 2  # each run: 2 a turn, run_resumed, the final reply
    for cost in appends:  # each append: one statement, one transaction, at most 3 round trips
        assert cost.transactions == 1 and cost.statements == 1 and cost.round_trips <= 3, appends


def test_a_claim_a_batch_of_claims_and_a_release_are_each_one_statement(
    wire: tuple[WireCounter, str],
) -> None:
    from tether.stores.base import Owner

    counter, dsn = wire
    store = PostgresStore(dsn, pool_min=1, pool_max=1)
    for i in range(4):
        _make(store, f"claimed-{i}")
    costs: dict[str, Counts] = {}

    async def run() -> None:
        try:
            assert await store.aholder("claimed-0") is None  # the connection made, the schema checked
            before = counter.counts()
            lease = await store.aclaim_next(Owner.here())
            costs["claim_next"] = counter.counts() - before
            assert lease is not None and lease.run_id == "claimed-0"
            before = counter.counts()
            leases = await store.aclaim_next_batch([Owner.here() for _ in range(3)])
            costs["claim_next_batch"] = counter.counts() - before
            assert [held.run_id for held in leases] == ["claimed-1", "claimed-2", "claimed-3"]
            before = counter.counts()
            assert await store.arelease(lease, at_seq=2, inbox_len=0)
            costs["release"] = counter.counts() - before
            assert await store.aholder(lease.run_id) is None
        finally:
            await store.aclose()

    asyncio.run(run())
    for name, cost in costs.items():
        assert cost.transactions == 1 and cost.statements == 1 and cost.round_trips == 1, (name, cost)
