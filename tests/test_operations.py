"""The operations every store gets from its primitives (``tether.stores.operations``), on a real FileStore."""

from __future__ import annotations

from pathlib import Path

import pytest

from tether import ConflictError, FileStore, Message, State
from tether import journal as j
from tether._harness.conformance.support import writer_of
from tether.stores.base import Owner


def _text(text: str) -> list[dict[str, str]]:
    return [{"type": "text", "text": text}]


def test_save_refuses_a_state_whose_unsaved_entries_another_writer_overtook(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    store.save(State(id="r1", messages=[Message.user("hi")]))
    stale = store.load("r1")
    writer_of(stale).add(j.MessageAdded, role="user", content=_text("kept in memory only"))
    other = FileStore(tmp_path)
    lease = other.claim("r1", Owner.here())
    went_on = other.load("r1")
    writer = writer_of(went_on, lease.owner.writer)
    writer.add(j.MessageAdded, role="user", content=_text("written by another process"))
    other.append("r1", writer.next_batch(), expected_seq=2, writer=writer.writer_id, lease_token=lease.token,
                 info=went_on.info())  # fmt: skip
    other.abandon(lease)
    with pytest.raises(ConflictError, match=r"run r1 seq 2 holds a message entry this State does not have"):
        store.save(stale)
    assert [e.content for e in store.load("r1").history[1:]] == [
        _text("hi"),
        _text("written by another process"),
    ]


def test_save_writes_what_a_state_holds_past_the_journal_sealed_as_the_store_keeps_it(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    store.save(State(id="r1", messages=[Message.user("hi")]))
    state = store.load("r1")
    writer_of(state).add(j.MessageAdded, role="user", content=_text("not saved by its drive"))
    assert state.history[-1].h == ""  # made, folded, never sealed
    store.save(state)
    stored = FileStore(tmp_path).load("r1").history
    assert [e.h for e in stored] == [e.h for e in state.history] and all(e.h for e in state.history)
    assert stored[-1].content == _text("not saved by its drive") and store.holder("r1") is None
