"""Plain-text rendering of a run for people: the journal as a timeline, and what a resume would do.

Shared by ``tether show`` and ``tether demo``. Pure functions returning strings: no I/O, no rich, so the
output reads the same in a terminal, a log file or a test.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from . import journal as j
from .state import State

__all__ = [
    "display_status",
    "format_args",
    "format_call",
    "format_time",
    "next_step",
    "open_state_lines",
    "summarize",
    "timeline_lines",
    "truncate",
]

TEXT_WIDTH = 72
"""How many characters of a message, answer or result a summary shows."""


def truncate(text: str, width: int = TEXT_WIDTH) -> str:
    """``text`` on one line (whitespace runs folded), cut to ``width`` characters with an ellipsis."""
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: max(width - 1, 0)] + "…"


def format_time(at: str | None) -> str:
    """The time of day of an ISO 8601 timestamp, to the millisecond: ``12:04:59.031``."""
    if not at:
        return "-"
    _, sep, clock = at.partition("T")
    if not sep:
        return at
    clock = clock.rstrip("Z")
    whole, _, fraction = clock.partition(".")
    return f"{whole}.{(fraction + '000')[:3]}"


def format_args(args: Any, width: int = 48) -> str:
    """Call arguments as ``city="London", days=3`` (values in JSON), cut to ``width`` characters."""
    if isinstance(args, dict):
        text = ", ".join(f"{key}={_json(value)}" for key, value in args.items())
    elif args is None:
        text = ""
    else:
        text = _json(args)
    return truncate(text, width)


def format_call(tool: str, args: Any) -> str:
    """A call as ``get_weather(city="London")``."""
    return f"{tool}({format_args(args)})"


def _json(value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return repr(value)


def _blocks_text(blocks: Sequence[dict[str, Any]], width: int = TEXT_WIDTH) -> str:
    """The text of content blocks, with other blocks named: ``[image]``, ``[thinking]``."""
    parts: list[str] = []
    for block in blocks:
        kind = block.get("type")
        if kind == "text":
            if block.get("text"):
                parts.append(str(block["text"]))
        elif kind not in ("tool_call", "tool_result"):
            parts.append(f"[{kind}]")
    return truncate(" ".join(parts), width)


def _quoted(text: str) -> str:
    return f'"{text}"' if text else '""'


def summarize(entry: j.Entry, calls: dict[str, str] | None = None) -> str:
    """A one-line human summary of one journal entry.

    Args:
        entry: the entry.
        calls: call id -> tool name, for naming the tool of a ``tool_finished`` (``timeline_lines`` fills
            it from the ``model_replied`` entries it has seen).

    Returns:
        The summary, without seq, time or kind.
    """
    calls = calls if calls is not None else {}
    kind = entry.kind
    if isinstance(entry, j.RunStarted):
        parts = [f"agent {entry.agent or '?'}"]
        model = (entry.fingerprint or {}).get("model")
        if model:
            parts.append(f"model {model}")
        if entry.parent_id:
            parts.append(f"child of {entry.parent_id} ({entry.parent_call_id})")
        if entry.forked_from:
            parts.append(f"forked from {entry.forked_from.get('id')} at seq {entry.forked_from.get('seq')}")
        if entry.budgets:
            parts.append("budgets " + format_args(entry.budgets))
        if entry.submitted:
            parts.append("submitted")
        return ", ".join(parts)
    if isinstance(entry, j.RunResumed):
        return f"taken by pid {entry.pid} on {entry.host or '?'}"
    if isinstance(entry, j.RunReleased):
        return f"released: {entry.reason}" if entry.reason else "released"
    if isinstance(entry, j.MessageAdded):
        source = f" (inbox #{entry.inbox_seq})" if entry.inbox_seq is not None else ""
        return f"{entry.role}: {_quoted(_blocks_text(entry.content))}{source}"
    if isinstance(entry, j.ModelReplied):
        pieces: list[str] = []
        text = _blocks_text(entry.content)
        if text:
            pieces.append(_quoted(text))
        for block in entry.content:
            if block.get("type") == "tool_call":
                calls[str(block.get("id"))] = str(block.get("name"))
                pieces.append(f"{block.get('id')} {format_call(str(block.get('name')), block.get('args'))}")
        return "; ".join(pieces) if pieces else "(empty reply)"
    if isinstance(entry, j.ModelFailed):
        retry = "retryable" if entry.retryable else "not retryable"
        return f"{entry.error_type or 'error'}: {truncate(entry.error, 56)} ({retry})"
    if isinstance(entry, j.ApprovalRequested):
        calls.setdefault(entry.call_id, entry.tool)
        round_ = f", round {entry.round}" if entry.round else ""
        return f"{entry.call_id} {format_call(entry.tool, entry.args)} waits for a decision{round_}"
    if isinstance(entry, j.ApprovalDecided):
        verdict = "approved" if entry.approved else "denied"
        who = f" by {entry.by}" if entry.by else ""
        why = f": {truncate(entry.reason, 48)}" if entry.reason else ""
        return f"{entry.call_id} {verdict}{who}{why}"
    if isinstance(entry, j.ToolStarted):
        calls.setdefault(entry.call_id, entry.tool)
        return f"{entry.call_id} {entry.tool} ({entry.effect}, attempt {entry.attempt})"
    if isinstance(entry, j.ToolFinished):
        tool = calls.get(entry.call_id)
        name = f" {tool}" if tool else ""
        return f"{entry.call_id}{name} {entry.outcome}: {_quoted(_blocks_text(entry.content, 56))}"
    if isinstance(entry, j.ChildWaiting):
        return f"{entry.call_id} waits on child run {entry.child_id} ({len(entry.pending)} pending)"
    if isinstance(entry, j.Compacted):
        return f"turns before seq {entry.upto_seq} summarized: {_quoted(truncate(entry.summary, 56))}"
    if isinstance(entry, j.AgentChanged):
        old, new = entry.old or {}, entry.new or {}
        changed = sorted(key for key in set(old) | set(new) if old.get(key) != new.get(key))
        return "changed: " + (", ".join(changed) if changed else "nothing")
    if isinstance(entry, j.BudgetsChanged):
        return f"{format_args(entry.old or {})} -> {format_args(entry.new or {})}"
    if isinstance(entry, j.CancelRequested):
        return f"by {entry.by or 'someone'}"
    if isinstance(entry, j.InboxSkipped):
        return f"inbox #{entry.inbox_seq}: {truncate(entry.reason, 56)}"
    if isinstance(entry, j.RunStopped):
        if entry.answer is not None and entry.status == "completed":
            return f"{entry.status}: {_quoted(truncate(entry.answer, 56))}"
        if not entry.reason:
            return entry.status
        reason = truncate(entry.reason, 56)
        return reason if reason.startswith(entry.status) else f"{entry.status}: {reason}"
    return kind  # an entry kind this renderer does not know yet


def timeline_lines(entries: Iterable[j.Entry], *, indent: str = "") -> list[str]:
    """The journal as aligned lines: a header, then ``seq  time  kind  summary`` per entry.

    Args:
        entries: the entries, in seq order (a whole journal, or its tail).
        indent: put before every line.
    """
    items = list(entries)
    calls: dict[str, str] = {}
    rows = [(str(e.seq), format_time(e.at), e.kind, summarize(e, calls)) for e in items]
    seq_w = max([3, *(len(r[0]) for r in rows)])
    time_w = max([4, *(len(r[1]) for r in rows)])
    kind_w = max([4, *(len(r[2]) for r in rows)])
    lines = [f"{indent}{'seq':>{seq_w}}  {'time':<{time_w}}  {'kind':<{kind_w}}  summary"]
    for seq, at, kind, summary in rows:
        lines.append(f"{indent}{seq:>{seq_w}}  {at:<{time_w}}  {kind:<{kind_w}}  {summary}")
    return lines


def display_status(status: str, held: bool) -> str:
    """The status as ``tether ls`` shows it: ``running (no owner)`` for a running run no one holds."""
    return "running (no owner)" if status == "running" and not held else status


_PLANS = {
    "run": "run {ids}",
    "retry": "run {ids} again",
    "abort": "close {ids} aborted",
    "deny": "close {ids} denied",
    "wait": "wait for a decision on {ids}",
    "resume_child": "resume the subagent run of {ids}",
}


def next_step(state: State) -> str:
    """What ``resume`` would do with the run now, in one sentence (DESIGN 7)."""
    status = state.status
    if status in j.FINAL_STATUSES:
        return f"return it as it is ({status}): no model call, no tool, nothing written"
    if status == "failed":
        return f"ask the model again (the run failed: {truncate(state.reason or 'no reason given', 56)})"
    if status == "stopped":
        return f"continue only if the resuming agent's budgets allow ({state.reason or 'a budget'})"
    if status == "waiting":
        return "nothing until the pending approvals are decided (or a child run stops waiting)"
    if state.resumes_since_progress >= 3:
        return "stop the run failed: a crash loop (3 resumes without progress)"
    ask = f"ask the model for its next reply (request {state.requests + 1})"
    by_action: dict[str, list[str]] = {}
    for c in state.open_calls:
        by_action.setdefault(c.action, []).append(c.call_id)
    if not by_action:
        return ask
    steps = [
        _PLANS.get(action, action + " {ids}").format(ids=", ".join(ids)) for action, ids in by_action.items()
    ]
    if "wait" not in by_action:
        steps.append(f"then {ask}")
    return ", ".join(steps)


def open_state_lines(state: State, *, indent: str = "") -> list[str]:
    """The open calls with their planned action, the pending approvals, and what a resume would do.

    Args:
        state: the run, as loaded.
        indent: put before every line.
    """
    lines: list[str] = []
    open_calls = state.open_calls
    if open_calls:
        lines.append(f"{indent}open calls (no result saved), and what a resume does with each:")
        rows = [("call", "tool", "action", "why")]
        rows += [(c.call_id, format_call(c.tool, c.args), c.action, c.reason) for c in open_calls]
        widths = [max(len(row[i]) for row in rows) for i in range(3)]
        for call_id, call_text, action, reason in rows:
            lines.append(
                f"{indent}  {call_id:<{widths[0]}}  {call_text:<{widths[1]}}  {action:<{widths[2]}}  {reason}"
            )
    elif any(entry.kind == "tool_finished" for entry in state.history):
        lines.append(f"{indent}open calls: none (every call has its result saved)")
    else:
        lines.append(f"{indent}open calls: none")
    pending = state.pending_approvals
    if pending:
        lines.append(f"{indent}pending approvals:")
        texts = [format_call(p.tool, p.args) for p in pending]
        id_w = max(len(p.call_id) for p in pending)
        call_w = max(len(text) for text in texts)
        for p, call_text in zip(pending, texts, strict=True):
            question = f"  {truncate(p.question, 48)}" if p.question else ""
            when = f"asked {format_time(p.asked_at)}"
            lines.append(f"{indent}  {p.call_id:<{id_w}}  {call_text:<{call_w}}  {when}{question}")
    lines.append(f"{indent}a resume will: {next_step(state)}")
    return lines
