"""The store conformance suite's support (see ``tether._harness.conformance.suite``): writing runs the way a driver does,
the child processes of the concurrency cases, and the base class with the fixtures every case uses.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.pool
import os
import pickle
import signal
import time
import weakref
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from ... import journal as j
from ..._consume import consume
from ...errors import RunBusyError
from ...state import State
from ...stores import open_store, register_scheme
from ...stores._schemes import StoreFactory, registered
from ...stores.base import Lease, Owner, Store
from ...stores.operations import write_all
from ...writing import JournalWriter
from .faces import FACES, through

_SPAWN = multiprocessing.get_context("spawn")


# --------------------------------------------------------------------------------------------------
# Writing runs the way a driver does

_WRITERS: weakref.WeakKeyDictionary[State, JournalWriter] = weakref.WeakKeyDictionary()


def writer_of(state: State, writer_id: str | None = None) -> JournalWriter:
    """The JournalWriter that writes a hand-made run, made on first use.

    With ``writer_id`` it is replaced by a new one writing as that id from where ``state`` is now (every
    entry of its history durable), as a taker does with its lease owner's writer id.
    """
    writer = _WRITERS.get(state)
    if writer is None or writer_id is not None:
        writer = _WRITERS[state] = JournalWriter(state, writer_id)
    return writer


def ago(seconds: float) -> str:
    """An ``updated_at`` that many seconds before now."""
    return (datetime.now(UTC) - timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def started(
    run_id: str, *, agent: str = "a", parent_id: str | None = None, root_id: str | None = None
) -> State:
    """A new run's State with ``run_started`` and a first message queued."""
    state = State(id=run_id)
    writer_of(state).add(j.RunStarted, agent=agent, parent_id=parent_id, root_id=root_id or run_id)
    writer_of(state).add(
        j.MessageAdded, role="user", content=[{"type": "text", "text": f"hello from {run_id}"}]
    )
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
    writer = writer_of(state)
    owner = Owner.here(writer.writer_id) if held else None
    lease = store.create(run_id, writer.next_batch(), {**state.info(), **info}, owner=owner, ttl=ttl)
    writer.batch_saved()
    return state, lease


def add(store: Store, state: State, lease: Lease | None, n: int = 1, **info: Any) -> list[j.Entry]:
    """Append ``n`` messages (after what is queued) as the holder of ``lease``; ``info`` overrides the
    listing record."""
    writer = writer_of(state)
    for i in range(n):
        writer.add(j.MessageAdded, role="user", content=[{"type": "text", "text": f"more {i}"}])
    batch = writer.next_batch()
    store.append(
        state.id,
        batch,
        expected_seq=batch[0].seq,
        writer=writer.writer_id,
        lease_token=lease.token if lease else None,
        info={**state.info(), **info},
    )
    writer.batch_saved()
    return batch


def journal_inbox(store: Store, state: State, lease: Lease) -> int:
    """As a holder: journal every unconsumed inbox item; returns how many."""
    queued = consume(writer_of(state), store.read_inbox(state.id, after_seq=state.inbox_consumed))
    store.operate(write_all, writer_of(state), lease)
    return len(queued)


def comparable(entry: j.Entry) -> dict[str, Any]:
    """An entry's fields but the writer's seal."""
    return {k: v for k, v in j.entry_to_dict(entry).items() if k not in ("w", "h", "b")}


def message(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "text", "text": text}]}


# --------------------------------------------------------------------------------------------------
# Runs made by hand: sealed entries and listing records, no State (the store primitives alone)


def record(run_id: str, **fields: Any) -> dict[str, Any]:
    """A listing record (``info``) for ``run_id``: a running root of agent ``a``; ``fields`` override it."""
    info = {
        "agent": "a",
        "status": "running",
        "turn": 0,
        "created_at": j.now_iso(),
        "updated_at": j.now_iso(),
        "first_message": "hi",
        "parent_id": None,
        "root_id": run_id,
        "inbox_consumed": -1,
    }
    info.update(fields)
    return info


def first_batch(
    run_id: str, writer: str, parent_id: str | None = None, root_id: str | None = None
) -> list[j.Entry]:
    """A run's first append, sealed by ``writer``: ``run_started`` and the message "hi" (seq 0 and 1)."""
    at = j.now_iso()
    return j.seal(
        [
            j.RunStarted(seq=0, at=at, agent="a", parent_id=parent_id, root_id=root_id or run_id),
            j.MessageAdded(seq=1, at=at, content=[{"type": "text", "text": "hi"}]),
        ],
        writer,
        run_id=run_id,
    )


def messages(start: int, count: int, writer: str, text: str = "x", *, run_id: str = "r1") -> list[j.Entry]:
    """One append of ``count`` messages from seq ``start`` of run ``run_id``, sealed by ``writer``."""
    at = j.now_iso()
    return j.seal(
        [
            j.MessageAdded(seq=start + i, at=at, content=[{"type": "text", "text": text}])
            for i in range(count)
        ],
        writer,
        run_id=run_id,
    )


def make_sealed(
    store: Store, run_id: str, *, held: bool = False, ttl: float | None = None, **info: Any
) -> tuple[str, Lease | None]:
    """Create ``run_id`` from ``first_batch`` with a new writer id (held or not); returns (writer, lease)."""
    writer = j.new_writer_id()
    parent, root = info.get("parent_id"), info.get("root_id")
    lease = store.create(
        run_id,
        first_batch(run_id, writer, parent, root),
        record(run_id, **info),
        owner=Owner.here(writer) if held else None,
        ttl=ttl,
    )
    return writer, lease


def append_sealed(store: Store, run_id: str, lease: Lease, entries: list[j.Entry], **info: Any) -> None:
    """Append ``entries`` (one sealed batch) as the holder of ``lease``; ``info`` overrides the record."""
    store.append(
        run_id,
        entries,
        expected_seq=entries[0].seq,
        writer=entries[0].w,
        lease_token=lease.token,
        info=record(run_id, **info),
    )


# --------------------------------------------------------------------------------------------------
# Child processes (spawned; each opens the store from its URL, through the schemes registered here too)


def child_schemes(url: str) -> dict[str, StoreFactory]:
    """The URL schemes registered in this process, for each child process to register before it opens the
    store at ``url`` (a factory travels by reference: its module is imported in the child). Factories a
    child cannot import are left out, unless ``url`` needs one.

    Raises:
        TypeError: ``url``'s scheme is registered to a factory a child process cannot import (a lambda, a
            local function).
    """
    schemes = {}
    for name, factory in registered().items():
        try:
            pickle.dumps(factory)
            schemes[name] = factory
        except Exception as exc:
            if url.partition(":")[0] != name:
                continue
            raise TypeError(
                f"store URL scheme {name!r} is registered to {factory!r}, which a child process cannot import "
                f"({exc}). Fix: register a module-level function or class, or list the scheme as an entry "
                "point in the group tether.stores"
            ) from None
    return schemes


def _register(schemes: dict[str, StoreFactory]) -> None:
    """In a child process: register the parent's schemes (a Pool's initializer)."""
    for name, factory in schemes.items():
        register_scheme(name, factory, replace=True)


def _in_child(schemes: dict[str, StoreFactory], target: Any, *args: Any) -> None:
    """In a child process: register the parent's schemes, then run ``target(*args)``."""
    _register(schemes)
    target(*args)


def _post_items(url: str, run_id: str, tag: str, count: int, retry: bool = True) -> list[int]:
    store = open_store(url)
    seqs = []
    for i in range(count):
        seq = store.post(run_id, message(f"{tag}-{i}"), item_id=f"{tag}-{i}")
        if retry and store.post(run_id, message(f"{tag}-{i}"), item_id=f"{tag}-{i}") != seq:  # a retried post
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
    lease = store.create(
        run_id,
        writer_of(state).next_batch(),
        state.info(),
        owner=Owner.here(writer_of(state).writer_id),
        ttl=1.0,
    )
    assert lease is not None
    Path(token_file).write_text(str(lease.token))
    os.kill(os.getpid(), signal.SIGKILL)


def _token(lease: Lease | None) -> int | None:
    return lease.token if lease else None


def _wait_until(condition: Any, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"still not so after {seconds}s")
        time.sleep(0.02)


class ConformanceBase:
    """What every case of ``StoreConformance`` uses: the store under test, a second holder, the skips."""

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

    @pytest.fixture(params=FACES)
    def store(self, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
        """The store under test, through each face in turn: its sync methods, then its async twins."""
        made = through(request.param, self.make_store(tmp_path))
        yield made
        made.close()

    @pytest.fixture
    def other(self, store: Store, tmp_path: Path) -> Iterator[Store]:
        made = self.reopen(getattr(store, "store", store), tmp_path)
        yield made
        if made is not getattr(store, "store", store):
            made.close()

    def needs_processes(self) -> None:
        if self.multiprocess_skip_reason:
            pytest.skip(self.multiprocess_skip_reason)

    @staticmethod
    def process(target: Any, url: str, *args: Any) -> multiprocessing.process.BaseProcess:
        """A spawned (not started) process running ``target(url, *args)`` with this process's URL schemes."""
        return _SPAWN.Process(target=_in_child, args=(child_schemes(url), target, url, *args))

    @staticmethod
    def pool(processes: int, url: str) -> multiprocessing.pool.Pool:
        """A pool of spawned processes opening ``url``, with this process's URL schemes registered in each."""
        return _SPAWN.Pool(processes, initializer=_register, initargs=(child_schemes(url),))

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
