"""The cases of writing runs: create, append, the inbox and save.

A part of ``tether.testing.StoreConformance`` (see ``tether._harness.conformance.suite``).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from ... import journal as j
from ...errors import ConflictError, LeaseLostError, RunBusyError, RunNotFoundError
from ...state import State
from ...stores.base import Owner, Store
from .support import (
    ConformanceBase,
    _post_items,
    _token,
    add,
    append_sealed,
    journal_inbox,
    make_run,
    make_sealed,
    message,
    messages,
    record,
    started,
    writer_of,
)

__all__ = ["JournalCases"]


class JournalCases(ConformanceBase):
    """The cases of writing runs: create, append, the inbox and save."""

    # ----------------------------------------------------------------------------------------------
    # create

    def test_create_reads_back_and_is_all_or_nothing(self, store: Store) -> None:
        state, lease = make_run(store, "r1")
        assert lease is None and store.holder("r1") is None
        assert store.read("r1") == state.history
        assert [e.seq for e in store.read("r1", after_seq=0)] == [1]
        assert (store.length("r1"), store.inbox_length("r1"), store.read_inbox("r1")) == (2, 0, [])
        assert store.load("r1").history == state.history and store.exists("r1")
        bad = writer_of(started("r2")).next_batch()
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
            with pytest.raises(ValueError, match=r"run r1 already exists. Fix: store.load\('r1'\)"):
                make_run(store, "r1", held=held)
        with pytest.raises(ValueError, match=r"run r1 already exists. Fix: store.load\('r1'\)"):
            make_sealed(store, "r1")  # made by hand, as the primitives' callers do
        assert store.read("r1") == state.history and store.inbox_length("r1") == 1
        assert store.length("r1") == 2 and store.holder("r1") is None

    def test_create_refuses_invalid_ids(self, store: Store) -> None:
        for run_id in ("../x", "", "a/b", "x" * 129, "a b"):
            with pytest.raises(ValueError, match="not valid"):
                store.create(run_id, writer_of(started("ok")).next_batch(), {})
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
            store.append("r1", retry, expected_seq=retry[0].seq, writer=writer_of(state).writer_id,
                         lease_token=lease.token if lease else None, info=state.info())  # fmt: skip
        assert store.read("r1") == state.history and store.length("r1") == 5

    def test_same_writer_different_content_conflicts(self, store: Store) -> None:
        state, lease = make_run(store, "r1", held=True)
        add(store, state, lease, 2)
        twin = State.replay("r1", store.read("r1")[:2])
        writer_of(twin, writer_of(state).writer_id)  # the same writer id, other content at seq 2 and 3
        writer_of(twin).add(
            j.MessageAdded, role="user", content=[{"type": "text", "text": "not what was stored"}]
        )
        writer_of(twin).add(j.MessageAdded, role="user", content=[{"type": "text", "text": "nor this"}])
        batch = writer_of(twin).next_batch()
        with pytest.raises(ConflictError, match=r"seq 2 holds a message entry") as caught:
            store.append("r1", batch, expected_seq=2, writer=writer_of(state).writer_id, lease_token=_token(lease),
                         info=twin.info())  # fmt: skip
        assert not isinstance(caught.value, LeaseLostError) and caught.value.seq == 2
        assert store.read("r1") == state.history

    def test_partial_overlap_and_another_writer_conflict(self, store: Store) -> None:
        state, lease = make_run(store, "r1", held=True)
        stored = add(store, state, lease, 2)
        longer = j.seal(
            [*stored, j.MessageAdded(seq=4, at=j.now_iso())], writer_of(state).writer_id, run_id="r1"
        )  # re-sealed: h differs
        with pytest.raises(ConflictError):
            store.append("r1", longer, expected_seq=2, writer=writer_of(state).writer_id, lease_token=_token(lease),
                         info=state.info())  # fmt: skip
        intruder = j.seal(
            [j.MessageAdded(seq=3, at=j.now_iso()), j.MessageAdded(seq=4, at=j.now_iso())], "w2", run_id="r1"
        )
        with pytest.raises(ConflictError, match="seq 3"):
            store.append("r1", intruder, expected_seq=3, writer="w2", lease_token=_token(lease), info={})
        assert store.read("r1") == state.history and store.length("r1") == 4

    def test_a_gap_is_refused(self, store: Store) -> None:
        state, lease = make_run(store, "r1", held=True)
        ahead = j.seal([j.MessageAdded(seq=3, at=j.now_iso())], writer_of(state).writer_id, run_id="r1")
        with pytest.raises(ConflictError, match="gap"):
            store.append("r1", ahead, expected_seq=3, writer=writer_of(state).writer_id, lease_token=_token(lease),
                         info=state.info())  # fmt: skip
        with pytest.raises(ValueError, match="sealed batch"):
            store.append("r1", ahead, expected_seq=2, writer=writer_of(state).writer_id, lease_token=_token(lease),
                         info=state.info())  # fmt: skip
        assert store.length("r1") == 2

    def test_a_retry_is_skipped_and_other_content_another_writer_and_a_gap_are_refused(
        self, store: Store
    ) -> None:
        writer, lease = make_sealed(store, "r1", held=True)
        assert lease is not None
        batch = messages(2, 2, writer)
        append_sealed(store, "r1", lease, batch)
        append_sealed(store, "r1", lease, batch)  # a retry whose write had landed: nothing written
        assert store.length("r1") == 4
        longer = j.seal([*batch, j.MessageAdded(seq=4, at=j.now_iso())], writer, run_id="r1")
        with pytest.raises(ConflictError):  # resealed: the b countdown (and so h) differ from what is stored
            append_sealed(store, "r1", lease, longer)
        append_sealed(store, "r1", lease, messages(4, 1, writer))
        assert [e.seq for e in store.read("r1")] == [0, 1, 2, 3, 4]
        intruder = messages(3, 2, j.new_writer_id())
        with pytest.raises(ConflictError, match="seq 3 holds a message entry from writer") as caught:
            append_sealed(store, "r1", lease, intruder)
        assert not isinstance(caught.value, LeaseLostError) and caught.value.seq == 3
        with pytest.raises(ConflictError, match="gap"):
            append_sealed(store, "r1", lease, messages(7, 1, writer))
        with pytest.raises(ValueError, match="sealed batch"):
            store.append("r1", messages(5, 1, writer), expected_seq=6, writer=writer, lease_token=lease.token,
                         info=record("r1"))  # fmt: skip
        assert store.length("r1") == 5

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

    def test_a_post_is_idempotent_by_item_id_and_keeps_seen_seq_and_run_h(self, store: Store) -> None:
        make_sealed(store, "r1")
        item = {
            "type": "decision",
            "call_id": "c2_0",
            "round": 0,
            "approved": True,
            "seen_seq": 2,
            "run_h": "abc",
        }
        assert store.post("r1", item, item_id="i1") == 0
        assert store.post("r1", item, item_id="i1") == 0
        assert store.post("r1", {"type": "message", "item_id": "i2"}) == 1
        assert store.post("r1", {"type": "message", "item_id": "i2"}) == 1
        assert store.post("r1", {"type": "cancel"}) == 2  # a fresh id
        assert store.inbox_length("r1") == 3
        first, *_ = store.read_inbox("r1")
        assert (first.item_id, first.type, first.seen_seq, first.run_h) == ("i1", "decision", 2, "abc")
        assert first.body == {"call_id": "c2_0", "round": 0, "approved": True}
        assert [i.inbox_seq for i in store.read_inbox("r1", after_seq=0)] == [1, 2]
        with pytest.raises(ValueError, match="type"):
            store.post("r1", {"type": "bogus"})
        with pytest.raises(RunNotFoundError):
            store.post("nope", {"type": "cancel"})
        assert store.inbox_length("r1") == 3

    def test_post_numbering_is_dense_under_four_processes(self, store: Store, tmp_path: Path) -> None:
        self.needs_processes()
        make_sealed(store, "r1")
        url = self.store_url(tmp_path)
        with self.pool(4, url) as pool:
            results = pool.starmap(_post_items, [(url, "r1", f"p{i}", 50, False) for i in range(4)])
        got = sorted(seq for seqs in results for seq in seqs)
        assert got == list(range(200))
        for seqs in results:
            assert seqs == sorted(seqs)  # each poster's items in its own order
        items = store.read_inbox("r1")
        assert [item.inbox_seq for item in items] == list(range(200))
        assert len({item.item_id for item in items}) == 200
        assert store.inbox_length("r1") == 200

    def test_inbox_posts_from_many_processes_while_the_holder_appends(
        self, store: Store, tmp_path: Path
    ) -> None:
        self.needs_processes()
        state, lease = make_run(store, "r1", held=True)
        assert lease is not None
        url = self.store_url(tmp_path)
        with self.pool(4, url) as pool:
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
