"""SQLiteStore's group commit across runs (``stores/sqlite/_writers.py``): writes of several runs that
wait for this process's write lock together share one transaction, and each keeps its own outcome."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from _store_runs import _append, _batch, _make
from tether.errors import ConflictError, LeaseLostError
from tether.stores.sqlite import SQLiteStore


@pytest.fixture
def db(tmp_path: Path) -> Iterator[SQLiteStore]:
    store = SQLiteStore(tmp_path / "runs.db")
    yield store
    store.close()


def _queued_together(db: SQLiteStore, writes: list[Any]) -> list[Any]:
    """Run each write on a thread of its own while this thread holds the write lock, so that they all
    queue, then let them go: the first to get the lock commits them all. Returns each outcome."""
    outcomes: list[Any] = [None] * len(writes)
    commits: list[int] = []
    real = db._writers._commit

    def commit(batch: list[Any]) -> None:
        commits.append(len(batch))
        real(batch)

    db._writers._commit = commit  # type: ignore[method-assign]

    def run(i: int) -> None:
        try:
            outcomes[i] = writes[i]()
        except Exception as exc:
            outcomes[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(writes))]
    with db._writers._turn():
        for thread in threads:
            thread.start()
        while len(db._writers._queue) < len(writes):
            threading.Event().wait(0.001)
    for thread in threads:
        thread.join(10)
    assert commits == [len(writes)], "one transaction for all of them"
    return outcomes


def test_appends_of_many_runs_waiting_together_share_one_commit_and_each_is_durable(db: SQLiteStore) -> None:
    held = {f"r{i}": _make(db, f"r{i}", held=True) for i in range(6)}
    writes = [
        (lambda rid=rid, w=w, lease=lease: _append(db, rid, lease, _batch(2, 3, w)))
        for rid, (w, lease) in held.items()
    ]
    assert _queued_together(db, writes) == [None] * 6
    for rid in held:
        assert db.length(rid) == 5


def test_an_append_refused_in_a_shared_commit_fails_alone(db: SQLiteStore) -> None:
    good_w, good = _make(db, "good", held=True)
    lost_w, lost = _make(db, "lost", held=True)
    stale_w, stale = _make(db, "stale", held=True)
    db.abandon(lost)
    assert lost is not None and good is not None and stale is not None
    writes = [
        lambda: _append(db, "good", good, _batch(2, 2, good_w)),
        lambda: _append(db, "lost", lost, _batch(2, 2, lost_w)),
        lambda: _append(db, "stale", stale, _batch(5, 1, stale_w)),  # a gap
        lambda: db.release(good, at_seq=2, inbox_len=0),  # the journal will have grown: refused
    ]
    outcomes = _queued_together(db, writes)
    assert outcomes[0] is None
    assert isinstance(outcomes[1], LeaseLostError)
    assert isinstance(outcomes[2], ConflictError)
    assert outcomes[3] in (True, False)  # queued after or before the append: either is a true answer
    assert db.length("good") == 4 and db.length("lost") == 2 and db.length("stale") == 2


def test_a_commit_that_fails_fails_every_write_of_it_and_stores_none(db: SQLiteStore) -> None:
    held = {f"f{i}": _make(db, f"f{i}", held=True) for i in range(3)}
    real_connect = db._writers._connect

    class _FailingCommit:
        def __init__(self, conn: sqlite3.Connection) -> None:
            self.conn = conn

        def execute(self, sql: str, *args: Any) -> Any:
            if sql == "COMMIT":
                raise sqlite3.OperationalError("disk I/O error")
            return self.conn.execute(sql, *args)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.conn, name)

    db._writers._connect = lambda: _FailingCommit(real_connect())  # type: ignore[assignment,return-value]
    writes = [
        (lambda rid=rid, w=w, lease=lease: _append(db, rid, lease, _batch(2, 1, w)))
        for rid, (w, lease) in held.items()
    ]
    outcomes = _queued_together(db, writes)
    db._writers._connect = real_connect  # type: ignore[method-assign]
    assert all(isinstance(o, sqlite3.OperationalError) for o in outcomes)
    for rid, (w, lease) in held.items():
        assert db.length(rid) == 2
        _append(db, rid, lease, _batch(2, 1, w))  # the retry stores it
        assert db.length(rid) == 3
