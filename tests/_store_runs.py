"""Entries, listing records and runs made by hand, for the tests of one store's primitives."""

from __future__ import annotations

from typing import Any

from tether import journal as j
from tether.stores.base import Lease, Owner, Store


def _info(run_id: str, **fields: Any) -> dict[str, Any]:
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


def _first(
    run_id: str, writer: str, parent_id: str | None = None, root_id: str | None = None
) -> list[j.Entry]:
    at = j.now_iso()
    return j.seal(
        [
            j.RunStarted(seq=0, at=at, agent="a", parent_id=parent_id, root_id=root_id or run_id),
            j.MessageAdded(seq=1, at=at, content=[{"type": "text", "text": "hi"}]),
        ],
        writer,
    )


def _batch(start: int, count: int, writer: str, text: str = "x") -> list[j.Entry]:
    at = j.now_iso()
    return j.seal(
        [
            j.MessageAdded(seq=start + i, at=at, content=[{"type": "text", "text": text}])
            for i in range(count)
        ],
        writer,
    )


def _make(
    store: Store,
    run_id: str,
    *,
    held: bool = False,
    ttl: float | None = None,
    **info: Any,
) -> tuple[str, Lease | None]:
    writer = j.new_writer_id()
    parent, root = info.get("parent_id"), info.get("root_id")
    lease = store.create(
        run_id,
        _first(run_id, writer, parent, root),
        _info(run_id, **info),
        owner=Owner.here(writer) if held else None,
        ttl=ttl,
    )
    return writer, lease


def _append(store: Store, run_id: str, lease: Lease, entries: list[j.Entry], **info: Any) -> None:
    store.append(
        run_id,
        entries,
        expected_seq=entries[0].seq,
        writer=entries[0].w,
        lease_token=lease.token,
        info=_info(run_id, **info),
    )
