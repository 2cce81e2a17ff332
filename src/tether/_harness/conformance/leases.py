"""The cases of holding runs: leases and claim_next.

A part of ``tether.testing.StoreConformance`` (see ``tether._harness.conformance.suite``).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from ... import journal as j
from ...errors import LeaseLostError, RunBusyError, RunNotFoundError
from ...stores.base import Lease, Owner, Store
from .support import (
    _SPAWN,
    ConformanceBase,
    _claim_all,
    _claim_once,
    _hold_and_die,
    _wait_until,
    add,
    ago,
    append_sealed,
    journal_inbox,
    make_run,
    make_sealed,
    message,
    messages,
    writer_of,
)

__all__ = ["LeaseCases"]


class LeaseCases(ConformanceBase):
    """The cases of holding runs: leases and claim_next."""

    # ----------------------------------------------------------------------------------------------
    # leases

    def test_a_run_created_held_is_busy_for_another_store(self, store: Store, other: Store) -> None:
        _, lease = make_sealed(store, "r1", held=True)
        assert lease is not None
        with pytest.raises(RunBusyError, match=f"pid {os.getpid()} .*that process is alive") as caught:
            other.claim("r1", Owner.here())
        assert caught.value.owner["pid"] == os.getpid()
        assert other.holder("r1") == lease.owner
        with pytest.raises(RunNotFoundError):
            other.claim("nope", Owner.here())

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
        writer_of(fresh, second.owner.writer)
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
        assert store.list()[0].inbox_consumed == 0  # the consumed mark was stored with the append
        assert other.claim("r1", Owner.here()).token > lease.token

    def test_two_processes_claim_one_run_and_exactly_one_wins(self, store: Store, tmp_path: Path) -> None:
        self.needs_processes()
        make_run(store, "r1")
        start, done, results = _SPAWN.Barrier(4), _SPAWN.Event(), _SPAWN.Queue()
        url = self.store_url(tmp_path)
        procs = [self.process(_claim_once, url, "r1", start, done, results) for _ in range(4)]
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
        proc = self.process(_hold_and_die, self.store_url(tmp_path), "r1", str(token_file))
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

    def test_renewals_keep_a_short_lease_alive_and_release_ends_it(self, store: Store) -> None:
        self.needs_ttl(store)
        writer, lease = make_sealed(store, "r1", held=True, ttl=0.4)
        assert lease is not None
        for _ in range(5):
            time.sleep(0.1)
            renewed = store.renew(lease)
            assert renewed.expires_at > lease.expires_at  # type: ignore[operator]
            lease = renewed
        # 0.5 s after the claim: alive through renewals
        append_sealed(store, "r1", lease, messages(2, 1, writer))
        assert store.release(lease, at_seq=3, inbox_len=0)
        assert store.holder("r1") is None
        with pytest.raises(LeaseLostError):
            store.renew(lease)
        with pytest.raises(LeaseLostError):  # released: no append without a new claim
            append_sealed(store, "r1", lease, messages(3, 1, writer))

    def test_an_expired_lease_is_taken_over_and_the_old_holder_is_fenced(
        self, store: Store, other: Store
    ) -> None:
        self.needs_ttl(store)
        writer, lease = make_sealed(store, "r1", held=True, ttl=0.3)
        assert lease is not None
        with pytest.raises(RunBusyError):
            other.claim("r1", Owner.here(), ttl=0.3)
        _wait_until(lambda: other.holder("r1") is None)  # expiry is judged by the store's clock
        taken = other.claim("r1", Owner.here(), ttl=30.0)  # must outlast the rest of the case, under load
        assert taken.token == lease.token + 1
        with pytest.raises(LeaseLostError):  # it still "holds" token 1, whatever it thinks
            append_sealed(store, "r1", lease, messages(2, 1, writer))
        with pytest.raises(LeaseLostError):  # even with entries the store already has
            append_sealed(store, "r1", lease, other.read("r1")[1:2])
        with pytest.raises(LeaseLostError):
            store.renew(lease)
        assert store.release(lease, at_seq=2, inbox_len=0)  # nothing of ours to release
        store.abandon(lease)  # does not touch the new holder's lease
        assert other.holder("r1") == taken.owner
        append_sealed(other, "r1", taken, messages(2, 1, taken.owner.writer))
        assert other.length("r1") == 3
        # expired, not taken over: the holder's own append is refused too
        _wait_until(lambda: other.holder("r1") is None)
        with pytest.raises(LeaseLostError):
            append_sealed(other, "r1", taken, messages(3, 1, taken.owner.writer))

    def test_an_append_after_the_lease_lapsed_is_refused_with_the_lease_error(
        self, store: Store, other: Store
    ) -> None:
        """A holder that stopped renewing (paused, cut off) may think it still holds the run; every append it
        makes once its lease lapsed is refused with LeaseLostError: with no one else holding the run yet,
        after another claimant took it, and after that claimant appended (not a ConflictError about seqs)."""
        self.needs_ttl(store)
        writer, lapsed = make_sealed(store, "r1", held=True, ttl=0.3)
        assert lapsed is not None
        _wait_until(lambda: other.holder("r1") is None)  # expired, not renewed, nobody else holding it
        with pytest.raises(LeaseLostError, match="run r1 is no longer held by this writer"):
            append_sealed(store, "r1", lapsed, messages(2, 1, writer))
        assert other.length("r1") == 2, "nothing of the refused append was stored"
        claimed = other.claim("r1", Owner.here(), ttl=30.0)
        with pytest.raises(LeaseLostError):  # taken over, nothing appended by the new holder yet
            append_sealed(store, "r1", lapsed, messages(2, 1, writer))
        append_sealed(other, "r1", claimed, messages(2, 2, claimed.owner.writer, text="new holder"))
        with pytest.raises(LeaseLostError):  # at the seq it expected: the lease error, not a ConflictError
            append_sealed(store, "r1", lapsed, messages(2, 1, writer))
        with pytest.raises(LeaseLostError):  # and where the journal ends now
            append_sealed(store, "r1", lapsed, messages(4, 1, writer))
        assert [e.w for e in other.read("r1")[2:]] == [j.short_writer(claimed.owner.writer)] * 2
        # a claimed lease (not a created one) lapses the same way, and a retry of its own stored batch too
        other.abandon(claimed)
        again = other.claim("r1", Owner.here(), ttl=0.3)
        own = messages(4, 1, again.owner.writer)
        append_sealed(other, "r1", again, own)
        _wait_until(lambda: other.holder("r1") is None)
        with pytest.raises(LeaseLostError):
            append_sealed(other, "r1", again, messages(5, 1, again.owner.writer))
        with pytest.raises(LeaseLostError):
            append_sealed(other, "r1", again, own)
        assert other.length("r1") == 5

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
        writer_of(taker, new.owner.writer)
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
        assert store.claim_next(Owner.here()) is None
        _wait_until(lambda: store.holder("r1") is None)
        taken = store.claim_next(Owner.here(), ttl=30.0, agents=["a"])
        assert taken is not None and taken.run_id == "r1" and taken.token > lease.token
        assert taken.token == 2  # created held (1), then claimed once

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
        procs = [self.process(_claim_all, url, ["worker"], done, results) for _ in range(4)]
        for proc in procs:
            proc.start()
        claimed = [run_id for _ in procs for run_id in results.get(timeout=120)]
        done.set()
        for proc in procs:
            proc.join(60)
            assert proc.exitcode == 0
        assert sorted(claimed) == [f"r{n:02d}" for n in range(20)]  # each once
