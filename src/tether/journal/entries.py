"""The journal's entry kinds: one frozen dataclass a kind (DESIGN 4), and the tables codecs read them by.

Every entry has ``seq``, ``at`` (ISO 8601 UTC text), ``w`` (who wrote it), ``h`` (its checksum), ``b``
(entries of its append still to come) and ``v`` (its format, only when newer than its journal's); each kind
adds its fields. How an entry becomes bytes is the codec's job (``codec.py``, ``legacy.py``).
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

__all__ = [
    "ENVELOPE",
    "FIELDS",
    "FIELD_SETS",
    "KINDS",
    "VALUES",
    "AgentChanged",
    "ApprovalDecided",
    "ApprovalRequested",
    "BudgetsChanged",
    "CancelRequested",
    "ChildWaiting",
    "Compacted",
    "Entry",
    "InboxSkipped",
    "MessageAdded",
    "ModelFailed",
    "ModelReplied",
    "RunReleased",
    "RunResumed",
    "RunStarted",
    "RunStopped",
    "ToolFinished",
    "ToolStarted",
]

FORMAT_3 = 3  # run_started.version's default: the format this tether writes (``FORMAT_VERSION``)


class _Line:
    """Holds, outside the entry's fields, the line a codec sealed it into (so it is encoded once)."""

    __slots__ = ("_line",)


@dataclass(frozen=True, slots=True, kw_only=True)
class Entry(_Line):
    """One journal entry. Subclasses add the fields of their kind.

    Attributes:
        seq: position in the journal, from 0.
        at: when it was written (ISO 8601, UTC).
        w: who wrote it: in format 3 the first 16 hex digits (64 bits) of the writer id, in formats 1 and 2
            the whole 128-bit writer id.
        h: its checksum: in format 3 over the run id and every byte of its line but ``h``'s own; in
            formats 1 and 2 over every field but ``w`` and ``h``.
        b: how many entries of the same append come after this one.
        v: the entry's format version, only when higher than the journal's.
    """

    kind: ClassVar[str] = ""
    seq: int
    at: str
    w: str = ""
    h: str = ""
    b: int = 0
    v: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RunStarted(Entry):
    """A run began: the journal's format version and what the run was started with."""

    kind: ClassVar[str] = "run_started"
    version: int = FORMAT_3
    agent: str = ""
    fingerprint: dict[str, Any] | None = None
    parent_id: str | None = None
    root_id: str | None = None
    parent_call_id: str | None = None
    budgets: dict[str, Any] | None = None
    output_type: str | None = None
    forked_from: dict[str, Any] | None = None
    submitted: bool = False
    traceparent: str | None = None  # the run's W3C trace context (DESIGN 15); None when it was not traced
    metadata: dict[str, str] | None = None  # the run's metadata (DESIGN 18); None in older journals


@dataclass(frozen=True, slots=True, kw_only=True)
class RunResumed(Entry):
    """A driver began acting on the run."""

    kind: ClassVar[str] = "run_resumed"
    writer: str = ""
    token: int | None = None
    host: str = ""
    pid: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class RunReleased(Entry):
    """A driver stopped cleanly with work left (an interrupt, a lost lease, a waiting run)."""

    kind: ClassVar[str] = "run_released"
    reason: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class MessageAdded(Entry):
    """A message added by the user or the program; ``inbox_seq`` when it came from the inbox."""

    kind: ClassVar[str] = "message"
    role: str = "user"
    content: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    inbox_seq: int | None = None
    item_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelReplied(Entry):
    """The model's reply: content blocks (text, tool calls with tether's ids, provider blocks)."""

    kind: ClassVar[str] = "model_replied"
    content: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    stop_reason: str | None = None
    usage: dict[str, int] | None = None
    model: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelFailed(Entry):
    """One failed model request."""

    kind: ClassVar[str] = "model_failed"
    error_type: str = ""
    error: str = ""
    retryable: bool = False
    purpose: str | None = None  # "compaction" for a failed summary request


@dataclass(frozen=True, slots=True, kw_only=True)
class ApprovalRequested(Entry):
    """A call waits for a person's decision (``round`` 0 for a rule, 1, 2, ... for ``on_unknown``)."""

    kind: ClassVar[str] = "approval_requested"
    call_id: str = ""
    round: int = 0
    tool: str = ""
    args: Any = None
    question: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ApprovalDecided(Entry):
    """A person's decision on one approval round."""

    kind: ClassVar[str] = "approval_decided"
    call_id: str = ""
    round: int = 0
    approved: bool = False
    by: str | None = None
    reason: str | None = None
    inbox_seq: int | None = None
    args: dict[str, Any] | None = None  # the arguments a person approved the call with, when edited


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolStarted(Entry):
    """Durable just before a tool is invoked; its effect and key decide recovery."""

    kind: ClassVar[str] = "tool_started"
    call_id: str = ""
    tool: str = ""
    effect: str = "unsafe"
    idempotency_key: str = ""
    attempt: int = 1
    max_attempts: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolFinished(Entry):
    """A call's result: ``done``, ``error``, ``input_error``, ``denied``, ``aborted`` or ``cancelled``."""

    kind: ClassVar[str] = "tool_finished"
    call_id: str = ""
    outcome: str = "done"
    content: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    usage: dict[str, int] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ChildWaiting(Entry):
    """A subagent call whose child run waits."""

    kind: ClassVar[str] = "child_waiting"
    call_id: str = ""
    child_id: str = ""
    pending: list[dict[str, Any]] = dataclasses.field(default_factory=list)


@dataclass(frozen=True, slots=True, kw_only=True)
class Compacted(Entry):
    """A summary that replaces the turns before ``upto_seq`` in the context."""

    kind: ClassVar[str] = "compacted"
    summary: str = ""
    upto_seq: int = 0
    usage: dict[str, int] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentChanged(Entry):
    """The resuming agent's model, instructions or tools differ from the journal's."""

    kind: ClassVar[str] = "agent_changed"
    old: dict[str, Any] | None = None
    new: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class BudgetsChanged(Entry):
    """The resuming agent's limits differ from the journal's."""

    kind: ClassVar[str] = "budgets_changed"
    old: dict[str, Any] | None = None
    new: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class CancelRequested(Entry):
    """Someone asked to cancel the run."""

    kind: ClassVar[str] = "cancel_requested"
    by: str | None = None
    inbox_seq: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class InboxSkipped(Entry):
    """An inbox item that had no effect, and why."""

    kind: ClassVar[str] = "inbox_skipped"
    inbox_seq: int = 0
    item_id: str | None = None
    reason: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunStopped(Entry):
    """The run stopped: ``completed``, ``failed``, ``cancelled`` or ``stopped`` (a budget)."""

    kind: ClassVar[str] = "run_stopped"
    status: str = "completed"
    answer: str | None = None
    output: Any = None
    output_type: str | None = None
    reason: str | None = None
    usage: dict[str, Any] | None = None


KINDS: dict[str, type[Entry]] = {  # each kind by its name
    cls.kind: cls
    for cls in (
        RunStarted,
        RunResumed,
        RunReleased,
        MessageAdded,
        ModelReplied,
        ModelFailed,
        ApprovalRequested,
        ApprovalDecided,
        ToolStarted,
        ToolFinished,
        ChildWaiting,
        Compacted,
        AgentChanged,
        BudgetsChanged,
        CancelRequested,
        InboxSkipped,
        RunStopped,
    )
}


FIELDS: dict[type[Entry], tuple[str, ...]] = {
    cls: tuple(f.name for f in dataclasses.fields(cls)) for cls in KINDS.values()
}
"""Each kind's fields in declaration order: the envelope (``seq``, ``at``, ``w``, ``h``, ``b``, ``v``) first."""

FIELD_SETS: dict[type[Entry], frozenset[str]] = {cls: frozenset(names) for cls, names in FIELDS.items()}

VALUES: dict[type[Entry], Callable[[Entry], tuple[Any, ...]]] = {
    cls: operator.attrgetter(*names) for cls, names in FIELDS.items()
}
"""Each kind's field values, in ``FIELDS`` order, in one call."""

ENVELOPE = ("seq", "at", "w", "h", "b", "v")
"""The fields every entry has."""
