"""How a taker journals inbox items: each unconsumed item exactly once, in inbox order (DURABILITY 2.4).

A decision for an open approval round becomes ``approval_decided`` (with ``tool_finished(denied)`` when
denied); a message is journaled as it is; a cancel closes every open call and stops the run. An item that
can have no effect becomes ``inbox_skipped`` with the reason.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import journal as j
from .inbox import InboxItem
from .messages import text_block as _text
from .writing import JournalWriter

__all__ = ["ArgsCheck", "close_denied", "close_invalid_edit", "close_open_calls", "consume", "skip_all"]

ArgsCheck = Callable[[str, Any], "str | None"]
"""Checks a person's edited arguments for a tool (``(tool name, args)``): None when valid, else the
validation message the model sees. Only a taker that has the agent can check (DESIGN 18)."""


def skip_all(writer: JournalWriter, items: list[InboxItem], reason: str) -> list[j.Entry]:
    """Journal every item not consumed yet as ``inbox_skipped`` with ``reason`` (items that can have no
    effect, such as those posted to a subagent run whose call has closed)."""
    return [_skip(writer, item, reason) for item in items if item.inbox_seq > writer.state.inbox_consumed]


def consume(
    writer: JournalWriter, items: list[InboxItem], check_args: ArgsCheck | None = None
) -> list[j.Entry]:
    """Journal (add through ``writer``) every item not consumed yet, in inbox order, and return the entries.

    A decision is journaled as ``approval_decided`` alone when approved (the driver starts the call, or
    recovery does later), with ``tool_finished(denied)`` when denied. An approval with edited arguments
    records them; with ``check_args`` (a driver, which knows the tool) they are validated at once and
    invalid ones close the call ``input_error`` with the validation message (without it, the driver that
    starts the call validates them). A message is journaled as it is. A cancel closes every open call and
    stops the run ``cancelled``. Items with no effect become ``inbox_skipped`` with the reason.
    """
    state = writer.state
    queued: list[j.Entry] = []
    run_h = state.history[0].h if state.history else None
    for item in items:
        if item.inbox_seq <= state.inbox_consumed:
            continue
        if item.run_h is not None and run_h is not None and item.run_h != run_h:
            queued.append(_skip(writer, item, "posted to an earlier run with this id"))
        elif item.type == "decision":
            queued.extend(_decision(writer, item, check_args))
        elif item.type == "message":
            queued.append(_message(writer, item))
        else:
            queued.extend(_cancel(writer, item))
    return queued


def _skip(writer: JournalWriter, item: InboxItem, reason: str) -> j.Entry:
    return writer.add(j.InboxSkipped, inbox_seq=item.inbox_seq, item_id=item.item_id, reason=reason)


def _decision(writer: JournalWriter, item: InboxItem, check_args: ArgsCheck | None) -> list[j.Entry]:
    state, body = writer.state, item.body
    call_id = str(body.get("call_id", ""))
    call = state.call(call_id)
    if state.status in j.STOP_STATUSES:
        return [_skip(writer, item, f"run {state.status}")]
    if call is None:
        return [_skip(writer, item, f"no call {call_id}")]
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
        return [_skip(writer, item, why)]
    approved = bool(body.get("approved"))
    by, reason = body.get("by"), body.get("reason")
    args = body.get("args") if approved and round_ == 0 else None  # edits apply to a rule's round only
    out = [
        writer.add(
            j.ApprovalDecided,
            call_id=call_id,
            round=round_,
            approved=approved,
            by=by,
            reason=reason,
            inbox_seq=item.inbox_seq,
            args=args,
        )
    ]
    if not approved:
        out.append(close_denied(writer, call_id, round_, by, reason))
    elif args is not None and check_args is not None:
        out.extend(close_invalid_edit(writer, call_id, call.tool, args, check_args))
    return out


def close_invalid_edit(
    writer: JournalWriter, call_id: str, tool: str, args: Any, check_args: ArgsCheck
) -> list[j.Entry]:
    """Close a call approved with edited arguments that do not validate: ``input_error`` with the message."""
    problem = check_args(tool, args)
    if problem is None:
        return []
    return [writer.add(j.ToolFinished, call_id=call_id, outcome="input_error", content=[_text(problem)])]


def close_denied(
    writer: JournalWriter, call_id: str, round_: int, by: str | None, reason: str | None
) -> j.Entry:
    """Close a denied call: ``denied`` for a rule's round 0, ``aborted`` for an ``on_unknown`` round."""
    if round_ > 0:
        text = "aborted: the tool may or may not have run; a person chose not to run it again"
        return writer.add(j.ToolFinished, call_id=call_id, outcome="aborted", content=[_text(text)])
    who = f" by {by}" if by else ""
    text = f"denied{who}: {reason}" if reason else f"denied{who}"
    return writer.add(j.ToolFinished, call_id=call_id, outcome="denied", content=[_text(text)])


def _message(writer: JournalWriter, item: InboxItem) -> j.Entry:
    state = writer.state
    if state.status == "cancelled" and state.stopped_seq >= item.seen_seq:
        return _skip(writer, item, f"run cancelled at seq {state.stopped_seq}")
    return writer.add(
        j.MessageAdded,
        role=str(item.body.get("role", "user")),
        content=list(item.body.get("content") or []),
        inbox_seq=item.inbox_seq,
        item_id=item.item_id,
    )


def _cancel(writer: JournalWriter, item: InboxItem) -> list[j.Entry]:
    state = writer.state
    if state.status in j.STOP_STATUSES:
        return [_skip(writer, item, f"run already {state.status}")]
    by = item.body.get("by")
    out = [writer.add(j.CancelRequested, by=by, inbox_seq=item.inbox_seq)]
    out.extend(close_open_calls(writer, "cancelled"))
    who = f" by {by}" if by else ""
    out.append(
        writer.add(j.RunStopped, status="cancelled", reason=f"cancelled{who}", usage=dict(state.usage))
    )
    return out


def close_open_calls(writer: JournalWriter, why: str) -> list[j.Entry]:
    """Close every open call: ``cancelled`` if never started, ``aborted`` if started without a result."""
    out = []
    for call in list(writer.state.open_calls):
        if call.attempt == 0:
            out.append(
                writer.add(j.ToolFinished, call_id=call.call_id, outcome="cancelled", content=[_text(why)])
            )
        else:
            if call.effect == "resumable":
                text = "subagent cancelled"
            else:
                text = f"aborted: the run was {why} while this call ran; it may or may not have taken effect"
            out.append(
                writer.add(j.ToolFinished, call_id=call.call_id, outcome="aborted", content=[_text(text)])
            )
    return out
