"""Plain-text rendering of a run for people: the journal as a timeline, and what a resume would do.

Shared by ``tether show``, ``tether follow`` and ``tether demo`` (and meant for the run inspector's page).
Pure functions returning strings: no I/O, no rich, so the output reads the same in a terminal, a log file or
a test. Times are journaled in UTC; each function that prints one takes the zone to print it in (``tz``:
a ``tzinfo``, or None for the system's local zone, as ``datetime.astimezone`` reads it).
"""

from __future__ import annotations

import json
import re
import textwrap
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime, tzinfo
from typing import Any

from . import journal as j
from .state import State

__all__ = [
    "KIND_WIDTH",
    "Timeline",
    "display_status",
    "format_args",
    "format_call",
    "format_datetime",
    "format_time",
    "next_step",
    "open_state_lines",
    "parse_time",
    "retry_text",
    "summarize",
    "timeline_lines",
    "truncate",
    "without_fix",
    "zone_label",
]

TEXT_WIDTH = 72
"""How many characters of a message, answer or result a summary shows."""


def truncate(text: str, width: int = TEXT_WIDTH) -> str:
    """``text`` on one line (whitespace runs folded), cut to ``width`` characters with an ellipsis."""
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: max(width - 1, 0)] + "…"


def parse_time(at: str | None) -> datetime | None:
    """An ISO 8601 timestamp (``...Z`` or with an offset) as an aware datetime; None when it is not one."""
    if not at:
        return None
    try:
        parsed = datetime.fromisoformat(at.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def _in_zone(at: str | None, tz: tzinfo | None) -> datetime | None:
    parsed = parse_time(at)
    return parsed.astimezone(tz) if parsed is not None else None


def format_time(at: str | None, tz: tzinfo | None = UTC) -> str:
    """The time of day of an ISO 8601 timestamp in ``tz``, to the millisecond: ``12:04:59.031``."""
    moment = _in_zone(at, tz)
    if moment is None:
        return at or "-"
    return moment.strftime("%H:%M:%S.") + f"{moment.microsecond // 1000:03d}"


def zone_label(moment: datetime) -> str:
    """The zone of an aware datetime: ``UTC``, or its name and offset, ``CET (UTC+01:00)``."""
    offset = moment.utcoffset()
    if offset is None or (not offset and moment.tzname() in ("UTC", "Z", None)):
        return "UTC"
    seconds = int(offset.total_seconds())
    sign = "+" if seconds >= 0 else "-"
    hours, minutes = divmod(abs(seconds) // 60, 60)
    numeric = f"UTC{sign}{hours:02d}:{minutes:02d}"
    name = moment.tzname() or ""
    return f"{name} ({numeric})" if name and not name.startswith(("+", "-", "UTC")) else numeric


def format_datetime(at: str | None, tz: tzinfo | None = UTC) -> str:
    """Date, time of day and zone of an ISO 8601 timestamp in ``tz``: ``2025-01-31 13:04:59 CET (UTC+01:00)``."""
    moment = _in_zone(at, tz)
    if moment is None:
        return at or "-"
    return f"{moment:%Y-%m-%d %H:%M:%S} {zone_label(moment)}"


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


def _same(run_id: str) -> str:
    return run_id


def _quoted(text: str) -> str:
    return f'"{text}"' if text else '""'


def summarize(
    entry: j.Entry, calls: dict[str, str] | None = None, name: Callable[[str], str] | None = None
) -> str:
    """A one-line human summary of one journal entry.

    Args:
        entry: the entry.
        calls: call id -> tool name, for naming the tool of a ``tool_finished`` (``timeline_lines`` fills
            it from the ``model_replied`` entries it has seen).
        name: how another run's id is shown (a short form); the id itself when None.

    Returns:
        The summary, without seq, time or kind.
    """
    calls = calls if calls is not None else {}
    shown = name if name is not None else _same
    kind = entry.kind
    if isinstance(entry, j.RunStarted):
        parts = [f"agent {entry.agent or '?'}"]
        model = (entry.fingerprint or {}).get("model")
        if model:
            parts.append(f"model {model}")
        if entry.parent_id:
            parts.append(f"child of {shown(entry.parent_id)} ({entry.parent_call_id})")
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
        return f"{entry.error_type or 'error'}: {truncate(without_fix(entry.error), 56)} ({retry})"
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
        label = f" {tool}" if tool else ""
        return f"{entry.call_id}{label} {entry.outcome}: {_quoted(_blocks_text(entry.content, 56))}"
    if isinstance(entry, j.ChildWaiting):
        return f"{entry.call_id} waits on child run {shown(entry.child_id)} ({len(entry.pending)} pending)"
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
        reason = truncate(without_fix(entry.reason), 56)
        return reason if reason.startswith(entry.status) else f"{entry.status}: {reason}"
    return kind  # an entry kind this renderer does not know yet


KIND_WIDTH = max(len(kind) for kind in j.KINDS)
"""The width of the kind column when entries are shown as they come (``Timeline``)."""


class Timeline:
    """Formats a journal's entries one at a time, in aligned columns: ``seq  time  kind  summary``.

    For a whole journal use ``timeline_lines`` (columns as wide as its entries need); for entries shown as
    they are journaled (``tether follow``) the columns have fixed widths.

    Args:
        indent: put before every line.
        tz: the zone times are shown in (None: the local zone).
        dates: before the first entry, and wherever the date or the zone's offset changes, a line with the
            date and the zone (``2025-01-31 CET (UTC+01:00)``) in the time column.
        width: wrap summaries to this many columns (under their column); None: never wrap.
        name: how another run's id is shown (a short form); the id itself when None.
        seq_width, kind_width: the widths of the seq and kind columns.
    """

    def __init__(
        self,
        *,
        indent: str = "",
        tz: tzinfo | None = UTC,
        dates: bool = True,
        width: int | None = None,
        name: Callable[[str], str] | None = None,
        seq_width: int = 3,
        kind_width: int = KIND_WIDTH,
    ) -> None:
        self.indent = indent
        self.tz = tz
        self.dates = dates
        self.name = name
        self.seq_w = max(3, seq_width)
        self.time_w = len("00:00:00.000")
        self.kind_w = max(4, kind_width)
        self.calls: dict[str, str] = {}
        self._day: tuple[str, Any] | None = None
        self._lead = f"{indent}{'':>{self.seq_w}}  "
        self._hang = " " * len(f"{self._lead}{'':<{self.time_w}}  {'':<{self.kind_w}}  ")
        self._room = (width - len(self._hang)) if width is not None else None

    def header(self) -> str:
        """The column titles."""
        return (
            f"{self.indent}{'seq':>{self.seq_w}}  {'time':<{self.time_w}}  {'kind':<{self.kind_w}}  summary"
        )

    def lines(self, entry: j.Entry) -> list[str]:
        """The entry's line (its summary wrapped when a width was given), after a date line when one is due."""
        out: list[str] = []
        moment = _in_zone(entry.at, self.tz)
        if self.dates and moment is not None and (moment.date().isoformat(), moment.utcoffset()) != self._day:
            self._day = (moment.date().isoformat(), moment.utcoffset())
            out.append(f"{self._lead}{moment:%Y-%m-%d} {zone_label(moment)}")
        summary = summarize(entry, self.calls, self.name)
        room = self._room
        pieces = textwrap.wrap(summary, room) if room is not None and room >= 24 and summary else [summary]
        at = format_time(entry.at, self.tz)
        out.append(
            f"{self.indent}{entry.seq:>{self.seq_w}}  {at:<{self.time_w}}  {entry.kind:<{self.kind_w}}  {pieces[0]}"
        )
        out.extend(f"{self._hang}{piece}" for piece in pieces[1:])
        return out


def timeline_lines(
    entries: Iterable[j.Entry],
    *,
    indent: str = "",
    tz: tzinfo | None = UTC,
    dates: bool = True,
    width: int | None = None,
    name: Callable[[str], str] | None = None,
) -> list[str]:
    """The journal as aligned lines: a header, then ``seq  time  kind  summary`` per entry (see ``Timeline``).

    Args:
        entries: the entries, in seq order (a whole journal, or its tail).
        indent: put before every line.
        tz: the zone times are shown in (None: the local zone).
        dates: put a line with the date and the zone before the first entry and wherever they change.
        width: wrap summaries to this many columns (under their column); None: never wrap.
        name: how another run's id is shown (a short form); the id itself when None.
    """
    items = list(entries)
    timeline = Timeline(
        indent=indent,
        tz=tz,
        dates=dates,
        width=width,
        name=name,
        seq_width=max([3, *(len(str(e.seq)) for e in items)]),
        kind_width=max([4, *(len(e.kind) for e in items)]),
    )
    lines = [timeline.header()]
    for entry in items:
        lines.extend(timeline.lines(entry))
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
        reason = without_fix(state.reason or "no reason given")
        return f"ask the model again (the run failed: {truncate(reason, 56)})"
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


def open_state_lines(
    state: State,
    *,
    indent: str = "",
    tz: tzinfo | None = UTC,
    name: Callable[[str], str] | None = None,
    decide: Callable[[str, str], Sequence[str]] | None = None,
    width: int | None = None,
) -> list[str]:
    """The open calls with their planned action, the pending approvals, and what a resume would do.

    Each pending approval says which run holds the call when it is a subagent run's (a run's pending
    approvals include its subagent runs'), and when it was asked.

    Args:
        state: the run, as loaded.
        indent: put before every line.
        tz: the zone times are shown in (None: the local zone).
        name: how a run id is shown (a short form); the id itself when None.
        decide: ``(run id, call id) -> lines``, shown under each pending approval (how to decide it).
        width: wrap the open calls' reasons, and what a resume will do, to this many columns; None: never
            wrap.
    """
    shown = name if name is not None else _same
    lines: list[str] = []
    open_calls = state.open_calls
    if open_calls:
        lines.append(f"{indent}open calls (no result saved), and what a resume does with each:")
        rows = [("call", "tool", "action", "why")]
        rows += [
            (c.call_id, format_call(c.tool, c.args), c.action, _ids_named(c.reason, shown))
            for c in open_calls
        ]
        widths = [max(len(row[i]) for row in rows) for i in range(3)]
        hang = " " * len(f"{indent}  {'':<{widths[0]}}  {'':<{widths[1]}}  {'':<{widths[2]}}  ")
        room = width - len(hang) if width is not None else None
        for call_id, call_text, action, reason in rows:
            pieces = textwrap.wrap(reason, room) if room is not None and room >= 24 and reason else [reason]
            lines.append(
                f"{indent}  {call_id:<{widths[0]}}  {call_text:<{widths[1]}}  {action:<{widths[2]}}  {pieces[0]}"
            )
            lines.extend(f"{hang}{piece}" for piece in pieces[1:])
    elif any(entry.kind == "tool_finished" for entry in state.history):
        lines.append(f"{indent}open calls: none (every call has its result saved)")
    else:
        lines.append(f"{indent}open calls: none")
    pending = state.pending_approvals
    if pending:
        lines.append(f"{indent}pending approvals:")
        id_w = max(len(p.call_id) for p in pending)
        under = f"{indent}  {'':<{id_w}}  "
        for p in pending:
            run_id = p.run_id or state.id
            lines.append(f"{indent}  {p.call_id:<{id_w}}  {format_call(p.tool, p.args)}")
            if run_id != state.id:
                lines.append(f"{under}in subagent run {shown(run_id)}")
            lines.append(f"{under}asked {format_datetime(p.asked_at, tz)}")
            if p.question:
                lines.append(f"{under}{truncate(p.question, TEXT_WIDTH)}")
            if decide is not None:
                lines.extend(f"{under}{text}" for text in decide(run_id, p.call_id))
    plan = f"{indent}a resume will: {next_step(state)}"
    if width is not None and len(plan) > width:
        lines.extend(textwrap.wrap(plan, width, subsequent_indent=f"{indent}  "))
    else:
        lines.append(plan)
    return lines


_RUN_ID_IN_TEXT = re.compile(r"\b[0-9a-f]{32}(?:-[0-9a-f]{24})*\b|\b[A-Za-z0-9_-]+(?:-[0-9a-f]{24})+\b")


def _ids_named(text: str, name: Callable[[str], str]) -> str:
    """``text`` with the run ids in it shown by ``name``."""
    return _RUN_ID_IN_TEXT.sub(lambda found: name(found.group(0)), text)


_RETRY_REASONS = {
    "RateLimitError": "rate limited",
    "OverloadedError": "overloaded",
    "ServerError": "server error",
    "ConnectionFailed": "connection failed",
}


def without_fix(text: str) -> str:
    """A message without its ``Fix: ...`` part (for a fix that no longer applies, or is given otherwise)."""
    head, sep, _ = text.partition(" Fix:")
    return head.rstrip().rstrip(".") if sep else text


def retry_text(
    error_type: str, error: str, status_code: int | None, delay: float, attempt: int, attempts: int
) -> str:
    """A retry as people read it: ``rate limited (429), retrying in 1.0 s (2/5)``."""
    reason = _RETRY_REASONS.get(error_type) or truncate(without_fix(error) or error_type, 48)
    code = f" ({status_code})" if status_code is not None else ""
    wait = f"{delay:.1f}" if delay >= 0.1 or delay == 0 else f"{delay:.2f}"
    return f"{reason}{code}, retrying in {wait} s ({attempt}/{attempts})"
