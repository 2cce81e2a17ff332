"""The inbox: items posted to a run by anyone, and how a taker journals them (DURABILITY 2).

An item is a decision (call id and round, approved, by, reason), a message, or a cancel request. The taker
journals each unconsumed item exactly once, in inbox order, before anything else it writes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from . import journal as j
from .messages import text_block as _text
from .state import State

__all__ = ["InboxItem", "ItemType", "consume", "make_item", "skip_all"]

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

    Raises:
        ValueError: the item has no known type.
    """
    kind = item.get("type")
    if kind not in ("decision", "message", "cancel"):
        raise ValueError(
            f"inbox item type {kind!r} is not known. Fix: post a 'decision', 'message' or 'cancel' item"
        )
    reserved = {"type", "item_id", "seen_seq", "run_h", "at", "inbox_seq"}
    body = {k: v for k, v in item.items() if k not in reserved}
    return InboxItem(
        inbox_seq=inbox_seq,
        item_id=item_id or str(item.get("item_id") or ""),
        type=kind,
        body=body,
        seen_seq=int(item.get("seen_seq", 0)),
        run_h=item.get("run_h"),
        at=str(item.get("at") or j.now_iso()),
    )


def skip_all(state: State, items: list[InboxItem], reason: str) -> list[j.Entry]:
    """Journal every item not consumed yet as ``inbox_skipped`` with ``reason`` (items that can have no
    effect, such as those posted to a subagent run whose call has closed)."""
    return [_skip(state, item, reason) for item in items if item.inbox_seq > state.inbox_consumed]


def consume(state: State, items: list[InboxItem]) -> list[j.Entry]:
    """Journal (queue on ``state``) every item not consumed yet, in inbox order, and return the entries.

    A decision is journaled as ``approval_decided`` alone when approved (the driver starts the call, or
    recovery does later), with ``tool_finished(denied)`` when denied. A message is journaled as it is. A
    cancel closes every open call and stops the run ``cancelled``. Items with no effect become
    ``inbox_skipped`` with the reason.
    """
    queued: list[j.Entry] = []
    run_h = state.history[0].h if state.history else None
    for item in items:
        if item.inbox_seq <= state.inbox_consumed:
            continue
        if item.run_h is not None and run_h is not None and item.run_h != run_h:
            queued.append(_skip(state, item, "posted to an earlier run with this id"))
        elif item.type == "decision":
            queued.extend(_decision(state, item))
        elif item.type == "message":
            queued.append(_message(state, item))
        else:
            queued.extend(_cancel(state, item))
    return queued


def _skip(state: State, item: InboxItem, reason: str) -> j.Entry:
    return state.queue(j.InboxSkipped, inbox_seq=item.inbox_seq, item_id=item.item_id, reason=reason)


def _decision(state: State, item: InboxItem) -> list[j.Entry]:
    body = item.body
    call_id = str(body.get("call_id", ""))
    call = state.call(call_id)
    if state.status in j.STOP_STATUSES:
        return [_skip(state, item, f"run {state.status}")]
    if call is None:
        return [_skip(state, item, f"no call {call_id}")]
    round_ = body.get("round", call.open_round if call.open_round is not None else 0)
    if call.open_round is None or call.open_round != round_:
        if call.decision is not None and call.decision.round == round_:
            verb = "approved" if call.decision.approved else "denied"
            why = (
                f"call {call_id} was already {verb} by {call.decision.by or 'someone'} at {call.decision.at}"
            )
        elif call.outcome is not None:
            why = f"call {call_id} is closed ({call.outcome})"
        else:
            why = f"call {call_id} has no open approval round {round_}"
        return [_skip(state, item, why)]
    approved = bool(body.get("approved"))
    by, reason = body.get("by"), body.get("reason")
    out = [
        state.queue(
            j.ApprovalDecided,
            call_id=call_id,
            round=round_,
            approved=approved,
            by=by,
            reason=reason,
            inbox_seq=item.inbox_seq,
        )
    ]
    if not approved:
        out.append(close_denied(state, call_id, round_, by, reason))
    return out


def close_denied(state: State, call_id: str, round_: int, by: str | None, reason: str | None) -> j.Entry:
    """Close a denied call: ``denied`` for a rule's round 0, ``aborted`` for an ``on_unknown`` round."""
    if round_ > 0:
        text = "aborted: the tool may or may not have run; a person chose not to run it again"
        return state.queue(j.ToolFinished, call_id=call_id, outcome="aborted", content=[_text(text)])
    who = f" by {by}" if by else ""
    text = f"denied{who}: {reason}" if reason else f"denied{who}"
    return state.queue(j.ToolFinished, call_id=call_id, outcome="denied", content=[_text(text)])


def _message(state: State, item: InboxItem) -> j.Entry:
    if state.status == "cancelled" and state.stopped_seq >= item.seen_seq:
        return _skip(state, item, f"run cancelled at seq {state.stopped_seq}")
    return state.queue(
        j.MessageAdded,
        role=str(item.body.get("role", "user")),
        content=list(item.body.get("content") or []),
        inbox_seq=item.inbox_seq,
        item_id=item.item_id,
    )


def _cancel(state: State, item: InboxItem) -> list[j.Entry]:
    if state.status in j.STOP_STATUSES:
        return [_skip(state, item, f"run already {state.status}")]
    by = item.body.get("by")
    out = [state.queue(j.CancelRequested, by=by, inbox_seq=item.inbox_seq)]
    out.extend(close_open_calls(state, "cancelled"))
    who = f" by {by}" if by else ""
    out.append(
        state.queue(j.RunStopped, status="cancelled", reason=f"cancelled{who}", usage=dict(state.usage))
    )
    return out


def close_open_calls(state: State, why: str) -> list[j.Entry]:
    """Close every open call: ``cancelled`` if never started, ``aborted`` if started without a result."""
    out = []
    for call in list(state.open_calls):
        if call.attempt == 0:
            out.append(
                state.queue(j.ToolFinished, call_id=call.call_id, outcome="cancelled", content=[_text(why)])
            )
        else:
            if call.effect == "resumable":
                text = "subagent cancelled"
            else:
                text = f"aborted: the run was {why} while this call ran; it may or may not have taken effect"
            out.append(
                state.queue(j.ToolFinished, call_id=call.call_id, outcome="aborted", content=[_text(text)])
            )
    return out
