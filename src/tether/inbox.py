"""The inbox item: what anyone may post to a run (DURABILITY 2.1).

An item is a decision (call id and round, approved, by, reason), a message, or a cancel request. This module
is the item's data type only, which stores keep; how a taker journals items is ``tether._consume``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from . import journal as j
from ._encodable import clean

__all__ = ["InboxItem", "ItemType", "make_item"]

ItemType = Literal["decision", "message", "cancel"]


@dataclass(frozen=True, slots=True)
class InboxItem:
    """One posted item.

    Attributes:
        inbox_seq: its place in the run's inbox (dense, from 0).
        item_id: unique per run; a retried post with the same id returns the stored ``inbox_seq``.
        type: ``decision``, ``message`` or ``cancel``.
        body: the item's fields (``call_id``, ``round``, ``approved``, ``by``, ``reason``; ``role``,
            ``content``; ``by``).
        seen_seq: the journal length its poster had read.
        run_h: the checksum of the ``run_started`` its poster saw (None when unknown).
        at: when it was posted.
    """

    inbox_seq: int
    item_id: str
    type: str
    body: dict[str, Any]
    seen_seq: int
    run_h: str | None
    at: str

    def to_dict(self) -> dict[str, Any]:
        """The JSON form stored by stores."""
        return {
            "inbox_seq": self.inbox_seq,
            "item_id": self.item_id,
            "type": self.type,
            "body": self.body,
            "seen_seq": self.seen_seq,
            "run_h": self.run_h,
            "at": self.at,
        }

    @classmethod
    def from_dict(cls, obj: dict[str, Any]) -> InboxItem:
        """Read the stored JSON form."""
        return cls(
            int(obj["inbox_seq"]),
            str(obj["item_id"]),
            str(obj["type"]),
            dict(obj.get("body") or {}),
            int(obj.get("seen_seq", 0)),
            obj.get("run_h"),
            str(obj.get("at", "")),
        )


def make_item(item: dict[str, Any], *, inbox_seq: int, item_id: str | None) -> InboxItem:
    """Normalise a posted dict (``{"type": ..., ...fields}``) into an InboxItem numbered ``inbox_seq``.

    Lone surrogates in its strings (a reason typed in a terminal that is not UTF-8) become U+FFFD, as in
    journal entries (``tether._encodable``), so every store can encode the item.

    Raises:
        ValueError: the item has no known type.
    """
    kind = item.get("type")
    if kind not in ("decision", "message", "cancel"):
        raise ValueError(
            f"inbox item type {kind!r} is not known. Fix: post a 'decision', 'message' or 'cancel' item"
        )
    reserved = {"type", "item_id", "seen_seq", "run_h", "at", "inbox_seq"}
    body = clean({k: v for k, v in item.items() if k not in reserved})
    return InboxItem(
        inbox_seq=inbox_seq,
        item_id=item_id or str(item.get("item_id") or ""),
        type=kind,
        body=body,
        seen_seq=int(item.get("seen_seq", 0)),
        run_h=item.get("run_h"),
        at=str(item.get("at") or j.now_iso()),
    )
