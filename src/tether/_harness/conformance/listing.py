"""The cases of finding and removing runs: listing, delete, prune and fork.

A part of ``tether.testing.StoreConformance`` (see ``tether._harness.conformance.suite``).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from ... import journal as j
from ...errors import RunBusyError, RunNotFoundError
from ...state import State
from ...stores.base import Owner, Store
from .support import (
    ConformanceBase,
    add,
    ago,
    append_sealed,
    comparable,
    journal_inbox,
    make_run,
    make_sealed,
    message,
    messages,
    writer_of,
)

__all__ = ["ListingCases"]


class ListingCases(ConformanceBase):
    """The cases of finding and removing runs: listing, delete, prune and fork."""

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

    def test_list_filters_order_time_bounds_and_cursor(self, store: Store) -> None:
        make_sealed(store, "a1", agent="x", updated_at=ago(30))
        make_sealed(store, "a2", agent="y", status="completed", updated_at=ago(20))
        make_sealed(store, "a3", agent="x", parent_id="a1", root_id="a1", updated_at=ago(10))
        assert [i.id for i in store.list()] == ["a3", "a2", "a1"]
        assert [i.id for i in store.list(limit=2)] == ["a3", "a2"]
        assert [i.id for i in store.list(agent="x")] == ["a3", "a1"]
        assert [i.id for i in store.list(status="completed")] == ["a2"]
        assert [i.id for i in store.list(parent_id="a1")] == ["a3"]
        assert [i.id for i in store.list(root_id="a1")] == ["a3", "a1"]
        assert store.list()[2].display_status == "running (no owner)"
        since = timedelta(seconds=15)  # as_cutoff takes a timedelta too, though list's annotation says not
        assert [i.id for i in store.list(updated_before=since)] == ["a2", "a1"]  # type: ignore[arg-type]
        mid = datetime.now(UTC) - timedelta(seconds=25)
        assert [i.id for i in store.list(updated_after=mid)] == ["a3", "a2"]
        assert [i.id for i in store.list(updated_after=mid.isoformat(), updated_before=datetime.now(UTC) - timedelta(seconds=15))] == ["a2"]  # fmt: skip
        page, cursor = store.list_page(limit=2)
        assert [i.id for i in page] == ["a3", "a2"] and cursor is not None
        make_sealed(store, "a4")  # added while paging: listed in a later page, nothing skipped
        seen = [i.id for i in page]
        while cursor is not None:
            page, cursor = store.list_page(limit=2, cursor=cursor)
            seen += [i.id for i in page]
        assert seen[:3] == ["a3", "a2", "a1"] and set(seen) == {"a1", "a2", "a3", "a4"}
        with pytest.raises(ValueError, match="cursor"):
            store.list(cursor="garbage!")

    def test_list_by_metadata(self, store: Store) -> None:
        one = {"user": "u1", "tenant": "t1", "a.b": "dotted key", "note": 'Zoë\'s "quote"'}
        two = {"user": "u2", "tenant": "t1"}
        make_sealed(store, "m1", metadata=one, updated_at=ago(30))
        writer, lease = make_sealed(store, "m2", held=True, metadata=two, updated_at=ago(20))
        make_sealed(store, "m3", updated_at=ago(10))  # no metadata at all
        assert lease is not None
        append_sealed(
            store, "m2", lease, messages(2, 1, writer, run_id="m2"), metadata=two, updated_at=ago(5)
        )
        assert [i.id for i in store.list()] == ["m2", "m3", "m1"]
        by_id = {i.id: i for i in store.list()}
        assert (by_id["m1"].metadata, by_id["m2"].metadata, by_id["m3"].metadata) == (one, two, {})
        assert [i.id for i in store.list(metadata={"user": "u1"})] == ["m1"]
        assert [i.id for i in store.list(metadata={"tenant": "t1"})] == ["m2", "m1"]
        assert [i.id for i in store.list(metadata={"tenant": "t1", "user": "u2"})] == ["m2"]  # every pair
        assert [i.id for i in store.list(metadata={"tenant": "t1", "user": "u3"})] == []
        assert [i.id for i in store.list(metadata={"user": "u"})] == []  # exact, never a prefix
        assert [i.id for i in store.list(metadata={"a.b": "dotted key", "note": one["note"]})] == ["m1"]
        assert [i.id for i in store.list(metadata={"tenant": "t1"}, updated_before=ago(15))] == ["m1"]
        assert [i.id for i in store.list(metadata={"tenant": "t1"}, agent="b")] == []
        assert [i.id for i in store.list(metadata={})] == ["m2", "m3", "m1"]  # no pair: no filter
        page, cursor = store.list_page(metadata={"tenant": "t1"}, limit=1)
        assert [i.id for i in page] == ["m2"] and cursor is not None
        page, cursor = store.list_page(metadata={"tenant": "t1"}, limit=1, cursor=cursor)
        assert [i.id for i in page] == ["m1"] and cursor is None
        with pytest.raises(ValueError, match="metadata"):
            store.list(metadata={"user": 1})  # type: ignore[dict-item]

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
        writer_of(states["r03"], lease.owner.writer)
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
        writer_of(source).add(
            j.RunStarted, agent="a", fingerprint={"model": "m"}, budgets={"max_turns": 5}, root_id="src"
        )
        writer_of(source).add(j.MessageAdded, role="user", content=[{"type": "text", "text": "hi"}])
        writer_of(source).add(
            j.ModelReplied, content=[{"type": "tool_call", "id": "c2_0", "name": "t", "args": {}}]
        )
        writer_of(source).add(
            j.ToolStarted, call_id="c2_0", tool="t", effect="unsafe", idempotency_key="tether:src:c2_0"
        )
        writer_of(source).add(j.ToolFinished, call_id="c2_0", content=[{"type": "text", "text": "ok"}])
        lease = store.create(
            "src",
            writer_of(source).next_batch(),
            source.info(),
            owner=Owner.here(writer_of(source).writer_id),
        )
        assert lease is not None
        writer_of(source).batch_saved()
        store.post("src", message("and then?"), item_id="item-0")
        journal_inbox(store, source, lease)  # seq 5: a message from the inbox
        writer_of(source).add(j.ModelReplied, content=[{"type": "text", "text": "done"}])
        writer_of(source).add(j.RunStopped, status="completed", answer="done")
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
