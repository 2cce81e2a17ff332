"""The store conformance suite: subclass ``StoreConformance`` in a pytest module to check a Store.

```python
from tether.testing import StoreConformance

class TestMyStore(StoreConformance):
    def make_store(self, tmp_path):
        return MyStore(dsn_for(tmp_path))

    def store_url(self, tmp_path):
        return dsn_for(tmp_path)  # what tether.open_store opens to reach the same storage
```

Each test gets a fresh store from ``make_store(tmp_path)``. Concurrency cases run real processes (spawned,
not forked) that open the store with ``tether.open_store(self.store_url(tmp_path))``; a store that lives in
one process sets ``multiprocess_skip_reason``. Lease-expiry cases run when a claim with a ttl returns a
Lease with ``expires_at`` (a ttl store); lock stores skip them. The cases follow the ``Store`` docstrings
(``tether.stores.base``), DESIGN 8 and DURABILITY 2-6. This module imports pytest: import it only in tests (and for pytest's detailed assertion messages, call
``pytest.register_assert_rewrite("tether._conformance")`` in your ``conftest.py``).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from . import journal as j
from .errors import ConflictError, LeaseLostError, RunBusyError, RunNotFoundError
from .inbox import consume
from .state import State
from .stores import open_store
from .stores.base import Lease, Owner, Store

__all__ = ["StoreConformance"]

_SPAWN = multiprocessing.get_context("spawn")


# --------------------------------------------------------------------------------------------------
# Writing runs the way a driver does


def ago(seconds: float) -> str:
    """An ``updated_at`` that many seconds before now."""
    return (datetime.now(UTC) - timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def started(
    run_id: str, *, agent: str = "a", parent_id: str | None = None, root_id: str | None = None
) -> State:
    """A new run's State with ``run_started`` and a first message queued."""
    state = State(id=run_id)
    state.queue(j.RunStarted, agent=agent, parent_id=parent_id, root_id=root_id or run_id)
    state.queue(j.MessageAdded, role="user", content=[{"type": "text", "text": f"hello from {run_id}"}])
    return state


def make_run(
    store: Store,
    run_id: str,
    *,
    held: bool = False,
    ttl: float | None = None,
    agent: str = "a",
    parent_id: str | None = None,
    root_id: str | None = None,
    **info: Any,
) -> tuple[State, Lease | None]:
    """Create a run (held or not); ``info`` overrides the listing record (status, updated_at, ...)."""
    state = started(run_id, agent=agent, parent_id=parent_id, root_id=root_id)
    owner = Owner.here(state.writer) if held else None
    lease = store.create(run_id, state.next_batch(), {**state.info(), **info}, owner=owner, ttl=ttl)
    state.batch_saved()
    return state, lease


def add(store: Store, state: State, lease: Lease | None, n: int = 1, **info: Any) -> list[j.Entry]:
    """Append ``n`` messages as the holder of ``lease``; ``info`` overrides the listing record."""
    for i in range(n):
        state.queue(j.MessageAdded, role="user", content=[{"type": "text", "text": f"more {i}"}])
    batch = state.next_batch()
    store.append(
        state.id,
        batch,
        expected_seq=batch[0].seq,
        writer=state.writer,
        lease_token=lease.token if lease else None,
        info={**state.info(), **info},
    )
    state.batch_saved()
    return batch


def journal_inbox(store: Store, state: State, lease: Lease) -> int:
    """As a holder: journal every unconsumed inbox item; returns how many."""
    queued = consume(state, store.read_inbox(state.id, after_seq=state.inbox_consumed))
    if queued:
        batch = state.next_batch()
        store.append(
            state.id,
            batch,
            expected_seq=batch[0].seq,
            writer=state.writer,
            lease_token=lease.token,
            info=state.info(),
        )
        state.batch_saved()
    return len(queued)


def comparable(entry: j.Entry) -> dict[str, Any]:
    """An entry's fields but the writer's seal."""
    return {k: v for k, v in j.entry_to_dict(entry).items() if k not in ("w", "h", "b")}


def message(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "text", "text": text}]}


# --------------------------------------------------------------------------------------------------
# Child processes (spawned; each opens the store from its URL)


def _post_items(url: str, run_id: str, tag: str, count: int) -> list[int]:
    store = open_store(url)
    seqs = []
    for i in range(count):
        seq = store.post(run_id, message(f"{tag}-{i}"), item_id=f"{tag}-{i}")
        if store.post(run_id, message(f"{tag}-{i}"), item_id=f"{tag}-{i}") != seq:  # a retried post
            raise AssertionError(f"a retried post of {tag}-{i} got another inbox_seq")
        seqs.append(seq)
    store.close()
    return seqs


def _claim_once(url: str, run_id: str, start: Any, done: Any, results: Any) -> None:
    store = open_store(url)
    start.wait(30)
    try:
        lease = store.claim(run_id, Owner.here())
    except RunBusyError:
        results.put("busy")
        done.wait(30)
        return
    results.put(f"won {lease.token}")
    done.wait(30)  # hold it until every other process has tried
    store.abandon(lease)
    store.close()


def _claim_all(url: str, agents: list[str], done: Any, results: Any) -> None:
    store = open_store(url)
    claimed = []
    while (lease := store.claim_next(Owner.here(), agents=agents)) is not None:
        claimed.append(lease.run_id)
    results.put(claimed)
    done.wait(60)  # keep every lease until every process is done claiming
    store.close()


def _hold_and_die(url: str, run_id: str, token_file: str) -> None:
    store = open_store(url)
    state = started(run_id)
    lease = store.create(run_id, state.next_batch(), state.info(), owner=Owner.here(state.writer), ttl=1.0)
    assert lease is not None
    Path(token_file).write_text(str(lease.token))
    os.kill(os.getpid(), signal.SIGKILL)


# --------------------------------------------------------------------------------------------------


class StoreConformance:
    """The store contract as pytest tests. Subclass it (as ``Test...``) and implement ``make_store``."""

    multiprocess_skip_reason: str | None = None
    """Set to skip the cases that run several processes (a store that lives in one process)."""

    def make_store(self, tmp_path: Path) -> Store:
        """A new, empty store for one test."""
        raise NotImplementedError("Fix: implement make_store(self, tmp_path) in your test class")

    def store_url(self, tmp_path: Path) -> str:
        """The URL of ``make_store(tmp_path)``'s storage, for ``tether.open_store`` in child processes."""
        raise NotImplementedError("Fix: implement store_url(self, tmp_path), or set multiprocess_skip_reason")

    def reopen(self, store: Store, tmp_path: Path) -> Store:
        """A second store object on the same storage (another holder); the same object for a MemoryStore."""
        return open_store(self.store_url(tmp_path))

    @pytest.fixture
    def store(self, tmp_path: Path) -> Iterator[Store]:
        made = self.make_store(tmp_path)
        yield made
        made.close()

    @pytest.fixture
    def other(self, store: Store, tmp_path: Path) -> Iterator[Store]:
        made = self.reopen(store, tmp_path)
        yield made
        if made is not store:
            made.close()

    def needs_processes(self) -> None:
        if self.multiprocess_skip_reason:
            pytest.skip(self.multiprocess_skip_reason)

    @staticmethod
    def needs_ttl(store: Store) -> None:
        _, lease = make_run(store, "ttl-probe", held=True, ttl=30.0, agent="ttl-probe")
        assert lease is not None
        store.abandon(lease)
        store.delete("ttl-probe")
        if lease.expires_at is None:
            pytest.skip(
                "lease expiry applies to ttl stores; this store's lease is a lock the OS drops (no ttl)"
            )

    # ----------------------------------------------------------------------------------------------
    # create

    def test_create_reads_back_and_is_all_or_nothing(self, store: Store) -> None:
        state, lease = make_run(store, "r1")
        assert lease is None and store.holder("r1") is None
        assert store.read("r1") == state.history
        assert [e.seq for e in store.read("r1", after_seq=0)] == [1]
        assert (store.length("r1"), store.inbox_length("r1"), store.read_inbox("r1")) == (2, 0, [])
        assert store.load("r1").history == state.history and store.exists("r1")
        bad = started("r2").next_batch()
        unsealed = [j.RunStarted(seq=0, at=j.now_iso(), root_id="r2")]
        for entries in ([bad[1]], unsealed, [], list(reversed(bad))):
            with pytest.raises(ValueError):
                store.create("r2", entries, {})
            assert not store.exists("r2")  # a refused create leaves no trace
        make_run(store, "r2")
        assert store.length("r2") == 2 and store.inbox_length("r2") == 0

    def test_create_refuses_an_existing_id_and_changes_nothing(self, store: Store) -> None:
        state, _ = make_run(store, "r1")
        store.post("r1", message("kept"))
        for held in (False, True):
            with pytest.raises(ValueError, match="already exists"):
                make_run(store, "r1", held=held)
        assert store.read("r1") == state.history and store.inbox_length("r1") == 1
        assert store.holder("r1") is None

    def test_create_refuses_invalid_ids(self, store: Store) -> None:
        for run_id in ("../x", "", "a/b", "x" * 129, "a b"):
            with pytest.raises(ValueError, match="not valid"):
                store.create(run_id, started("ok").next_batch(), {})
        assert store.list() == []

    def test_create_held(self, store: Store, other: Store) -> None:
        state, lease = make_run(store, "r1", held=True)
        assert lease is not None and lease.token >= 1 and lease.run_id == "r1"
        assert store.holder("r1") == lease.owner and other.holder("r1") == lease.owner
        with pytest.raises(RunBusyError, match="Fix: wait for it"):
            other.claim("r1", Owner.here())
        add(store, state, lease)  # the creator appends with its lease
        assert store.release(lease, at_seq=3, inbox_len=0)
        assert store.holder("r1") is None
        assert other.claim("r1", Owner.here()).token > lease.token

    # ----------------------------------------------------------------------------------------------
    # append

    def test_a_retried_append_is_skipped(self, store: Store) -> None:
        state, lease = make_run(store, "r1", held=True)
        batch = add(store, state, lease, 3)
        for retry in (batch, batch[1:], batch[2:]):  # the whole append again, or its end
            store.append("r1", retry, expected_seq=retry[0].seq, writer=state.writer,
                         lease_token=lease.token if lease else None, info=state.info())  # fmt: skip
        assert store.read("r1") == state.history and store.length("r1") == 5

    def test_same_writer_different_content_conflicts(self, store: Store) -> None:
        state, lease = make_run(store, "r1", held=True)
        add(store, state, lease, 2)
        twin = State.replay("r1", store.read("r1")[:2])
        twin.writer = state.writer  # the same writer id, other content at seq 2 and 3
        twin.queue(j.MessageAdded, role="user", content=[{"type": "text", "text": "not what was stored"}])
        twin.queue(j.MessageAdded, role="user", content=[{"type": "text", "text": "nor this"}])
        batch = twin.next_batch()
        with pytest.raises(ConflictError, match=r"seq 2 holds a message entry") as caught:
            store.append("r1", batch, expected_seq=2, writer=state.writer, lease_token=_token(lease),
                         info=twin.info())  # fmt: skip
        assert not isinstance(caught.value, LeaseLostError) and caught.value.seq == 2
        assert store.read("r1") == state.history

    def test_partial_overlap_and_another_writer_conflict(self, store: Store) -> None:
        state, lease = make_run(store, "r1", held=True)
        stored = add(store, state, lease, 2)
        longer = j.seal(
            [*stored, j.MessageAdded(seq=4, at=j.now_iso())], state.writer
        )  # re-sealed: h differs
        with pytest.raises(ConflictError):
            store.append("r1", longer, expected_seq=2, writer=state.writer, lease_token=_token(lease),
                         info=state.info())  # fmt: skip
        intruder = j.seal(
            [j.MessageAdded(seq=3, at=j.now_iso()), j.MessageAdded(seq=4, at=j.now_iso())], "w2"
        )
        with pytest.raises(ConflictError, match="seq 3"):
            store.append("r1", intruder, expected_seq=3, writer="w2", lease_token=_token(lease), info={})
        assert store.read("r1") == state.history and store.length("r1") == 4

    def test_a_gap_is_refused(self, store: Store) -> None:
        state, lease = make_run(store, "r1", held=True)
        ahead = j.seal([j.MessageAdded(seq=3, at=j.now_iso())], state.writer)
        with pytest.raises(ConflictError, match="gap"):
            store.append("r1", ahead, expected_seq=3, writer=state.writer, lease_token=_token(lease),
                         info=state.info())  # fmt: skip
        with pytest.raises(ValueError, match="sealed batch"):
            store.append("r1", ahead, expected_seq=2, writer=state.writer, lease_token=_token(lease),
                         info=state.info())  # fmt: skip
        assert store.length("r1") == 2

    def test_missing_runs(self, store: Store) -> None:
        for call in (
            lambda: store.read("nope"),
            lambda: store.length("nope"),
            lambda: store.inbox_length("nope"),
            lambda: store.post("nope", message("x")),
            lambda: store.claim("nope", Owner.here()),
            lambda: store.holder("nope"),
            lambda: store.delete("nope"),
            lambda: store.load("nope"),
        ):
            with pytest.raises(RunNotFoundError):
                call()
        assert not store.exists("nope")

    # ----------------------------------------------------------------------------------------------
    # the inbox

    def test_posts_are_dense_and_idempotent(self, store: Store) -> None:
        make_run(store, "r1")
        assert store.post("r1", message("a"), item_id="i1") == 0
        assert store.post("r1", message("a"), item_id="i1") == 0
        assert store.post("r1", {**message("b"), "item_id": "i2"}) == 1
        assert store.post("r1", {"type": "cancel", "by": "bob"}) == 2
        assert store.post("r1", {"type": "decision", "call_id": "c2_0", "round": 0, "approved": True}) == 3
        items = store.read_inbox("r1")
        assert [(i.inbox_seq, i.type) for i in items] == [(0, "message"), (1, "message"), (2, "cancel"),
                                                           (3, "decision")]  # fmt: skip
        assert (items[0].item_id, items[1].item_id, items[2].body) == ("i1", "i2", {"by": "bob"})
        assert [i.inbox_seq for i in store.read_inbox("r1", after_seq=1)] == [2, 3]
        with pytest.raises(ValueError, match="type"):
            store.post("r1", {"type": "bogus"})
        assert store.inbox_length("r1") == 4

    def test_inbox_posts_from_many_processes_while_the_holder_appends(
        self, store: Store, tmp_path: Path
    ) -> None:
        self.needs_processes()
        state, lease = make_run(store, "r1", held=True)
        assert lease is not None
        url = self.store_url(tmp_path)
        with _SPAWN.Pool(4) as pool:
            pending = pool.starmap_async(_post_items, [(url, "r1", f"p{n}", 25) for n in range(4)])
            while not pending.ready():
                add(store, state, lease)  # the holder keeps appending and consuming meanwhile
                journal_inbox(store, state, lease)
                time.sleep(0.005)
            results = pending.get(120)
        while not store.release(lease, at_seq=len(state.history), inbox_len=state.inbox_consumed + 1):
            journal_inbox(store, state, lease)
        assert store.holder("r1") is None
        assert sorted(seq for seqs in results for seq in seqs) == list(range(100))
        for seqs in results:
            assert seqs == sorted(seqs)  # each poster's items in its own order
        items = store.read_inbox("r1")
        assert [i.inbox_seq for i in items] == list(range(100)) and len({i.item_id for i in items}) == 100
        journaled = [
            e.inbox_seq for e in store.read("r1") if isinstance(e, j.MessageAdded) and e.inbox_seq is not None
        ]
        assert journaled == list(range(100))  # each item journaled once, in inbox order

    # ----------------------------------------------------------------------------------------------
    # leases

    def test_a_superseded_token_is_refused(self, store: Store, other: Store) -> None:
        state, first = make_run(store, "r1", held=True)
        assert first is not None
        store.abandon(first)
        second = other.claim("r1", Owner.here())
        assert second.token > first.token
        with pytest.raises(LeaseLostError):
            add(store, state, first)
        with pytest.raises(LeaseLostError):
            store.renew(first)
        assert store.release(first, at_seq=2, inbox_len=0)  # nothing of its own left to release
        store.abandon(first)  # touches the new holder's lease in no way
        assert other.holder("r1") == second.owner
        fresh = other.load("r1")
        fresh.writer = second.owner.writer
        add(other, fresh, second)
        assert other.length("r1") == 3 and other.release(second, at_seq=3, inbox_len=0)

    def test_renew_and_release(self, store: Store) -> None:
        state, lease = make_run(store, "r1", held=True, ttl=30.0)
        assert lease is not None
        renewed = store.renew(lease)
        assert (renewed.token, renewed.run_id) == (lease.token, "r1")
        if lease.expires_at is not None:
            assert renewed.expires_at is not None and renewed.expires_at >= lease.expires_at
        add(store, state, renewed)
        assert store.release(renewed, at_seq=3, inbox_len=0) and store.holder("r1") is None
        with pytest.raises(LeaseLostError):
            store.renew(renewed)
        with pytest.raises(LeaseLostError):
            add(store, state, renewed)  # released: no append without a new claim

    def test_a_release_is_refused_when_the_journal_or_inbox_grew(self, store: Store, other: Store) -> None:
        state, lease = make_run(store, "r1", held=True)
        assert lease is not None
        other.post("r1", message("while held"))
        assert store.release(lease, at_seq=2, inbox_len=0) is False
        assert store.holder("r1") == lease.owner  # still held
        with pytest.raises(RunBusyError):
            other.claim("r1", Owner.here())
        assert journal_inbox(store, state, lease) == 1
        assert store.release(lease, at_seq=2, inbox_len=1) is False  # the journal grew past what it names
        assert store.release(lease, at_seq=3, inbox_len=1) is True
        assert store.holder("r1") is None
        assert other.claim("r1", Owner.here()).token > lease.token

    def test_two_processes_claim_one_run_and_exactly_one_wins(self, store: Store, tmp_path: Path) -> None:
        self.needs_processes()
        make_run(store, "r1")
        start, done, results = _SPAWN.Barrier(4), _SPAWN.Event(), _SPAWN.Queue()
        url = self.store_url(tmp_path)
        procs = [_SPAWN.Process(target=_claim_once, args=(url, "r1", start, done, results)) for _ in range(4)]
        for proc in procs:
            proc.start()
        outcomes = sorted(results.get(timeout=60) for _ in procs)
        done.set()
        for proc in procs:
            proc.join(60)
            assert proc.exitcode == 0
        assert outcomes[:3] == ["busy"] * 3 and outcomes[3].startswith("won ")

    def test_takeover_after_the_holder_process_dies(self, store: Store, tmp_path: Path) -> None:
        self.needs_processes()
        token_file = tmp_path / "token"
        proc = _SPAWN.Process(target=_hold_and_die, args=(self.store_url(tmp_path), "r1", str(token_file)))
        proc.start()
        proc.join(60)
        assert proc.exitcode == -signal.SIGKILL
        dead_token = int(token_file.read_text())
        deadline = time.monotonic() + 30  # a ttl store may wait for the lease (1 s) to expire
        while True:
            try:
                lease = store.claim("r1", Owner.here())
                break
            except RunBusyError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        assert lease.token > dead_token and store.holder("r1") == lease.owner
        dead = Lease("r1", dead_token, lease.owner)
        with pytest.raises(LeaseLostError):
            add(store, store.load("r1"), dead)

    def test_lease_expiry_and_takeover(self, store: Store, other: Store) -> None:
        self.needs_ttl(store)
        state, old = make_run(store, "r1", held=True, ttl=0.3)
        assert old is not None and old.expires_at is not None
        with pytest.raises(RunBusyError):
            other.claim("r1", Owner.here(), ttl=30.0)
        other.post("r1", message("posted during the takeover"), item_id="during")
        _wait_until(lambda: other.holder("r1") is None)
        new = other.claim("r1", Owner.here(), ttl=30.0)
        assert new.token > old.token and other.holder("r1") == new.owner
        taker = other.load("r1")
        taker.writer = new.owner.writer
        assert journal_inbox(other, taker, new) == 1
        with pytest.raises(LeaseLostError):  # the first holder's late append, consuming the same item
            journal_inbox(store, state, old)
        with pytest.raises(LeaseLostError):
            store.renew(old)
        assert store.release(old, at_seq=2, inbox_len=0)
        store.abandon(old)
        assert other.holder("r1") == new.owner
        assert other.release(new, at_seq=len(taker.history), inbox_len=1)
        seqs = [
            e.inbox_seq for e in other.read("r1") if isinstance(e, j.MessageAdded) and e.inbox_seq is not None
        ]
        assert seqs == [0]  # consumed exactly once

    def test_an_expired_lease_is_claimed_by_claim_next(self, store: Store) -> None:
        self.needs_ttl(store)
        _, lease = make_run(store, "r1", held=True, ttl=0.3)
        assert lease is not None
        assert store.claim_next(Owner.here(), agents=["a"]) is None
        _wait_until(lambda: store.holder("r1") is None)
        taken = store.claim_next(Owner.here(), ttl=30.0, agents=["a"])
        assert taken is not None and taken.run_id == "r1" and taken.token > lease.token

    # ----------------------------------------------------------------------------------------------
    # claim_next

    def test_claim_next_claims_roots_that_need_work_by_agent(self, store: Store) -> None:
        make_run(store, "done", status="completed", updated_at=ago(90))
        make_run(store, "held", held=True, updated_at=ago(80))
        make_run(store, "runner", agent="b", updated_at=ago(60))
        make_run(store, "parent-w", agent="c", status="waiting", updated_at=ago(50))
        make_run(store, "sub", agent="c", parent_id="parent-w", root_id="parent-w", updated_at=ago(40))
        make_run(store, "idle-w", agent="c", status="waiting", updated_at=ago(45))
        make_run(store, "posted", agent="d", status="completed", updated_at=ago(30))
        make_run(store, "old-w", agent="e", status="waiting", updated_at=ago(20))
        make_run(store, "old-kid", agent="e", status="completed", parent_id="old-w", root_id="old-w",
                 updated_at=ago(25))  # fmt: skip
        make_run(store, "failed", agent="d", status="failed", updated_at=ago(100))
        store.post("posted", message("reopen"))
        me = Owner.here()
        assert store.claim_next(me, agents=[]) is None
        assert store.claim_next(me, agents=["zzz"]) is None
        first = store.claim_next(me, agents=["d"])
        assert first is not None and first.run_id == "posted" and store.holder("posted") == me
        claimed = []
        while (lease := store.claim_next(me)) is not None:
            claimed.append(lease.run_id)
            assert store.holder(lease.run_id) == me and lease.token >= 1
        assert claimed == ["runner", "parent-w"]  # oldest first; never a child, a held or an idle root
        make_run(store, "idle-kid", agent="c", status="waiting", parent_id="idle-w", root_id="idle-w",
                 updated_at=ago(50))  # fmt: skip
        assert store.claim_next(me) is None  # a waiting child with nothing to do
        store.post("idle-kid", message("a decision would come here"))
        again = store.claim_next(me, agents=["c"])
        assert again is not None and again.run_id == "idle-w"  # the root, never the child

    def test_concurrent_claim_next_never_claims_a_run_twice(self, store: Store, tmp_path: Path) -> None:
        self.needs_processes()
        for n in range(20):
            make_run(store, f"r{n:02d}", agent="worker")
        make_run(store, "other", agent="someone-else")
        done, results = _SPAWN.Event(), _SPAWN.Queue()
        url = self.store_url(tmp_path)
        procs = [_SPAWN.Process(target=_claim_all, args=(url, ["worker"], done, results)) for _ in range(4)]
        for proc in procs:
            proc.start()
        claimed = [run_id for _ in procs for run_id in results.get(timeout=120)]
        done.set()
        for proc in procs:
            proc.join(60)
            assert proc.exitcode == 0
        assert sorted(claimed) == [f"r{n:02d}" for n in range(20)]  # each once

    # ----------------------------------------------------------------------------------------------
    # save

    def test_a_no_op_save_writes_nothing(self, store: Store) -> None:
        state = State(id="r1", messages=["hi"])
        store.save(state)
        before = (store.read("r1"), store.inbox_length("r1"), store.list())
        first = store.claim("r1", Owner.here())
        store.abandon(first)
        loaded = store.load("r1")
        for _ in range(3):
            assert store.save(loaded) is loaded
        assert (store.read("r1"), store.inbox_length("r1"), store.list()) == before
        assert store.claim("r1", Owner.here()).token == first.token + 1  # save took nothing

    def test_save_posts_changes_and_settles_an_unheld_run(self, store: Store) -> None:
        state = store.save(State(id="r1", messages=["hi"]))
        state.add_message("again")
        store.save(state)
        assert [e.kind for e in state.history] == ["run_started", "message", "message"]
        assert state.history[-1].inbox_seq == 0 and store.holder("r1") is None  # type: ignore[attr-defined]
        assert store.cancel("r1", by="bob") is not None and store.load("r1").status == "cancelled"

    # ----------------------------------------------------------------------------------------------
    # listing

    def test_listing_order_and_filters(self, store: Store) -> None:
        make_run(store, "a1", agent="x", updated_at=ago(50))
        make_run(store, "a2", agent="y", status="completed", updated_at=ago(40))
        tie = ago(30)
        make_run(store, "a3", agent="x", parent_id="a1", root_id="a1", updated_at=tie)
        make_run(store, "a4", agent="y", status="waiting", updated_at=tie)  # a tie: the id decides
        _, held = make_run(store, "a5", agent="x", held=True, updated_at=ago(10))
        assert [i.id for i in store.list()] == ["a5", "a4", "a3", "a2", "a1"]
        assert [i.id for i in store.list(limit=2)] == ["a5", "a4"]
        assert [i.id for i in store.list(agent="x")] == ["a5", "a3", "a1"]
        assert [i.id for i in store.list(status="completed")] == ["a2"]
        assert [i.id for i in store.list(parent_id="a1")] == ["a3"]
        assert [i.id for i in store.list(root_id="a1")] == ["a3", "a1"]
        assert [i.id for i in store.list(updated_before=ago(35))] == ["a2", "a1"]
        assert [i.id for i in store.list(updated_after=ago(35), agent="y")] == ["a4"]
        assert [i.id for i in store.list(updated_after=datetime.now(UTC) + timedelta(hours=1))] == []
        by_id = {i.id: i for i in store.list()}
        assert by_id["a1"].display_status == "running (no owner)" and by_id["a1"].lease_owner is None
        assert by_id["a5"].display_status == "running" and by_id["a5"].lease_owner is not None
        assert (by_id["a4"].length, by_id["a4"].turn, by_id["a4"].first_message) == (2, 0, "hello from a4")
        assert held is not None and by_id["a5"].lease_owner == f"{held.owner.host}:{held.owner.pid}"
        with pytest.raises(ValueError, match="cursor"):
            store.list(cursor="not a cursor")

    def test_keyset_pages_while_runs_are_added_and_updated(self, store: Store) -> None:
        states = {}
        for n in range(23):
            states[f"r{n:02d}"], _ = make_run(store, f"r{n:02d}", updated_at=ago(1000 - n))
        seen: list[str] = []
        page, cursor = store.list_page(limit=5)
        seen += [i.id for i in page]
        assert seen == ["r22", "r21", "r20", "r19", "r18"] and cursor is not None
        make_run(store, "new1")  # added while paging
        lease = store.claim("r03", Owner.here())  # an unseen run is updated while paging
        states["r03"].writer = lease.owner.writer
        add(store, states["r03"], lease, updated_at=j.now_iso())
        assert store.release(lease, at_seq=3, inbox_len=0)
        pages = 1
        while cursor is not None:
            page, cursor = store.list_page(limit=5, cursor=cursor)
            seen += [i.id for i in page]
            pages += 1
            if pages == 3:
                make_run(store, "new2")
            assert pages < 20
        assert set(seen) == {*states, "new1", "new2"}  # none skipped
        twice = {run_id for run_id in seen if seen.count(run_id) > 1}
        assert twice <= {"r03"}  # only an updated run may appear twice
        filtered, more = store.list_page(limit=50, agent="a", status="running")
        assert more is None and len(filtered) == 25

    # ----------------------------------------------------------------------------------------------
    # delete and prune

    def test_delete_rules(self, store: Store, other: Store) -> None:
        _, lease = make_run(store, "r1", held=True)
        assert lease is not None
        store.post("r1", message("x"))
        for s in (store, other):
            with pytest.raises(RunBusyError, match="Fix: wait for it"):
                s.delete("r1")
        assert store.length("r1") == 2 and store.inbox_length("r1") == 1
        store.abandon(lease)
        other.delete("r1")
        for call in (lambda: store.read("r1"), lambda: store.post("r1", message("late"))):
            with pytest.raises(RunNotFoundError):
                call()
        make_run(store, "r1")  # the id is free again, with an empty inbox
        assert store.inbox_length("r1") == 0 and store.length("r1") == 2

    def test_delete_of_a_tree(self, store: Store) -> None:
        make_run(store, "root")
        make_run(store, "kid", parent_id="root", root_id="root")
        _, held = make_run(store, "grandkid", held=True, parent_id="kid", root_id="root")
        make_run(store, "orphan", parent_id="gone", root_id="gone")
        with pytest.raises(ValueError, match=r"subagent of root\. Fix: delete its root root"):
            store.delete("kid")
        with pytest.raises(ValueError, match=r"has 2 subagent runs\. Fix: pass children=True"):
            store.delete("root")
        with pytest.raises(RunBusyError):
            store.delete("root", children=True)
        assert {i.id for i in store.list()} == {"root", "kid", "grandkid", "orphan"}  # nothing went
        assert held is not None
        store.abandon(held)
        store.delete("root", children=True)
        store.delete("orphan")  # a subagent run whose parent is gone
        assert store.list() == []

    def test_prune_rules(self, store: Store) -> None:
        old = ago(7200)
        make_run(store, "old-done", status="completed", updated_at=ago(7300))
        make_run(store, "old-failed", status="failed", updated_at=old)
        make_run(store, "old-running", updated_at=old)
        make_run(store, "new-done", status="completed")
        _, held = make_run(store, "old-held", held=True, status="completed", updated_at=old)
        make_run(store, "old-posted", status="completed", updated_at=old)
        store.post("old-posted", message("reopen it"))
        make_run(store, "tree", status="completed", updated_at=old)
        make_run(store, "tree-kid", status="cancelled", parent_id="tree", root_id="tree", updated_at=old)
        make_run(store, "kept", status="completed", updated_at=old)
        make_run(store, "kept-kid", status="waiting", parent_id="kept", root_id="kept", updated_at=old)
        make_run(store, "p2", updated_at=old)
        make_run(store, "p2-kid", status="completed", parent_id="p2", root_id="p2", updated_at=old)
        make_run(store, "ht", status="completed", updated_at=old)
        make_run(store, "ht-kid", held=True, status="completed", parent_id="ht", root_id="ht", updated_at=old)
        cutoff = datetime.now(UTC) - timedelta(hours=1)
        everything = {i.id for i in store.list(limit=1000)}
        assert store.prune(cutoff, dry_run=True) == ["old-done", "old-failed"]
        assert store.prune(timedelta(hours=1), children=True, dry_run=True) == [
            "old-done", "old-failed", "tree", "tree-kid"]  # fmt: skip
        assert store.prune(cutoff.isoformat(), statuses=("failed",), children=True, dry_run=True) == [
            "old-failed"
        ]
        assert store.prune(cutoff, statuses=["completed"], dry_run=True) == ["old-done"]
        assert store.prune(timedelta(hours=3), children=True, dry_run=True) == []
        assert {i.id for i in store.list(limit=1000)} == everything  # a dry run deletes nothing
        assert store.prune(cutoff, children=True) == ["old-done", "old-failed", "tree", "tree-kid"]
        left = {i.id for i in store.list(limit=1000)}
        assert left == everything - {"old-done", "old-failed", "tree", "tree-kid"}
        assert store.prune(cutoff, children=True) == []  # held runs are kept, never an error
        for bad in ((), ("running",), ("waiting", "completed")):
            with pytest.raises(ValueError, match="not stops"):
                store.prune(cutoff, statuses=bad)
        assert held is not None
        store.abandon(held)
        assert store.prune(cutoff) == ["old-held"]

    # ----------------------------------------------------------------------------------------------
    # fork

    def test_fork_rules(self, store: Store) -> None:
        source = State(id="src")
        source.queue(
            j.RunStarted, agent="a", fingerprint={"model": "m"}, budgets={"max_turns": 5}, root_id="src"
        )
        source.queue(j.MessageAdded, role="user", content=[{"type": "text", "text": "hi"}])
        source.queue(j.ModelReplied, content=[{"type": "tool_call", "id": "c2_0", "name": "t", "args": {}}])
        source.queue(
            j.ToolStarted, call_id="c2_0", tool="t", effect="unsafe", idempotency_key="tether:src:c2_0"
        )
        source.queue(j.ToolFinished, call_id="c2_0", content=[{"type": "text", "text": "ok"}])
        lease = store.create("src", source.next_batch(), source.info(), owner=Owner.here(source.writer))
        assert lease is not None
        source.batch_saved()
        store.post("src", message("and then?"), item_id="item-0")
        journal_inbox(store, source, lease)  # seq 5: a message from the inbox
        source.queue(j.ModelReplied, content=[{"type": "text", "text": "done"}])
        source.queue(j.RunStopped, status="completed", answer="done")
        add(store, source, lease, 0)
        assert store.release(lease, at_seq=8, inbox_len=1)
        for asked, boundary in ((None, 7), (7, 7), (6, 6), (5, 5), (4, 4), (3, 1), (2, 1), (1, 1), (0, 0)):
            fork_id = store.fork("src", at_seq=asked)
            assert fork_id != "src" and store.holder(fork_id) is None
            forked = store.read(fork_id)
            first = forked[0]
            assert isinstance(first, j.RunStarted) and first.forked_from == {"id": "src", "seq": boundary}
            assert (first.agent, first.fingerprint, first.budgets, first.root_id) == (
                "a", {"model": "m"}, {"max_turns": 5}, fork_id)  # fmt: skip
            assert len(forked) == boundary + 1
            for mine, theirs in zip(forked[1:], source.history[1 : boundary + 1], strict=True):
                assert mine.w != theirs.w and mine.seq == theirs.seq
                if isinstance(theirs, j.MessageAdded) and theirs.inbox_seq is not None:
                    assert (mine.inbox_seq, mine.item_id) == (None, None)  # type: ignore[attr-defined]
                    continue
                assert comparable(mine) == comparable(theirs)  # same kind, fields and time
            assert store.load(fork_id).open_calls == []
        kept = store.fork("src", at_seq=4, new_id="my-fork")
        assert kept == "my-fork" and store.read("my-fork")[3].idempotency_key == "tether:src:c2_0"  # type: ignore[attr-defined]
        fork = store.load("my-fork")
        assert fork.status == "running" and fork.inbox_consumed == -1
        fork.add_message("a new branch")
        store.save(fork)  # the fork's inbox starts empty: its first item is journaled
        assert fork.history[-1].kind == "message" and fork.history[-1].inbox_seq == 0  # type: ignore[attr-defined]
        with pytest.raises(ValueError, match="already exists"):
            store.fork("src", new_id="my-fork")
        with pytest.raises(ValueError, match="seqs 0 to 7"):
            store.fork("src", at_seq=8)
        with pytest.raises(RunNotFoundError):
            store.fork("nope")
        make_run(store, "kid", parent_id="src", root_id="src")
        with pytest.raises(ValueError, match=r"subagent of src\. Fix: fork its root src"):
            store.fork("kid")


def _token(lease: Lease | None) -> int | None:
    return lease.token if lease else None


def _wait_until(condition: Any, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"still not so after {seconds}s")
        time.sleep(0.02)
