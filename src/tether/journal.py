"""The journal: entry types, ids, the JSON codec, checksums, the format version and migrations.

Pure: no I/O. An entry is a small JSON object ``{"seq", "kind", "at", "w", "h", ...fields}``; ``w`` is the
writer id, ``h`` a checksum over every other field (``b``, the count of lines still to come in the entry's
append, included), so a damaged byte anywhere in an entry is found.
"""

from __future__ import annotations

import dataclasses
import hashlib
import operator
import os
import re
import secrets
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, ClassVar, Literal, get_args

import orjson

from ._encodable import clean, clean_text
from .errors import CorruptJournalError, NewerFormatError

__all__ = [
    "EFFECTS",
    "FINAL_STATUSES",
    "FORMAT_VERSION",
    "MAX_METADATA_BYTES",
    "MAX_METADATA_PAIRS",
    "OUTCOMES",
    "RETRY_EFFECTS",
    "STOP_STATUSES",
    "AgentChanged",
    "ApprovalDecided",
    "ApprovalRequested",
    "BudgetsChanged",
    "CancelRequested",
    "ChildWaiting",
    "Compacted",
    "Effect",
    "Entry",
    "InboxSkipped",
    "MessageAdded",
    "ModelFailed",
    "ModelReplied",
    "Outcome",
    "RunReleased",
    "RunResumed",
    "RunStarted",
    "RunStopped",
    "Status",
    "ToolFinished",
    "ToolStarted",
    "call_id_for",
    "checksum",
    "decode_entry",
    "decode_journal",
    "encode_entry",
    "entry_to_dict",
    "idempotency_key_for",
    "new_run_id",
    "new_writer_id",
    "now_iso",
    "seal",
    "validate_metadata",
    "validate_run_id",
]

FORMAT_VERSION = 2
"""The journal format this tether writes; it reads this one and every older one.

Format 2 added optional fields: ``run_started.metadata`` and ``traceparent``, ``approval_decided.args``. A
format-1 journal reads unchanged; what this tether appends to one carries ``v`` 2, so an older tether
refuses the journal as newer instead of failing on a field it does not know.
"""

# --------------------------------------------------------------------------------------------------
# Vocabulary: the one definition of each set of words the journal records

Status = Literal["running", "waiting", "completed", "failed", "cancelled", "stopped"]
"""A run's status as the fold tells it (DESIGN 7)."""

STOP_STATUSES: tuple[str, ...] = ("completed", "cancelled", "failed", "stopped")
"""The statuses a ``run_stopped`` records: a run with one of them has stopped (and only these are pruned)."""

FINAL_STATUSES: tuple[str, ...] = ("completed", "cancelled")
"""The stops a resume returns as they are (DESIGN 7): nothing runs again unless the inbox reopens the run."""

Outcome = Literal["done", "error", "input_error", "denied", "aborted", "cancelled"]
"""How a call ended, as its ``tool_finished`` records it."""

OUTCOMES: tuple[str, ...] = get_args(Outcome)

Effect = Literal["read_only", "idempotent", "unsafe", "resumable"]
"""What a call does to the world; decides how a started-but-unfinished call is recovered."""

EFFECTS: tuple[str, ...] = get_args(Effect)

RETRY_EFFECTS = frozenset({"read_only", "idempotent"})
"""The effects whose cut-off (or timed-out) call runs again with the same idempotency key."""

_RUN_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")


def validate_run_id(run_id: object) -> str:
    """Return ``run_id`` if it is a valid run id, else raise ValueError (no path tricks get through)."""
    if not isinstance(run_id, str) or not _RUN_ID.fullmatch(run_id):
        raise ValueError(
            f"run id {run_id!r} is not valid. Fix: use 1 to 128 characters from A-Z, a-z, 0-9, _ and -"
        )
    return run_id


MAX_METADATA_PAIRS = 64
"""At most this many metadata pairs per run (DESIGN 18)."""

MAX_METADATA_BYTES = 4096
"""At most this many bytes of metadata per run: the UTF-8 of every key and value, added up."""


def validate_metadata(metadata: object) -> dict[str, str]:
    """A copy of ``metadata`` if it is valid run metadata (string keys and values, 64 pairs, 4 KB), else raise.

    Lone surrogates in keys and values become U+FFFD, as everywhere in a journal (``tether._encodable``).

    Raises:
        TypeError: not a dict of strings to strings.
        ValueError: an empty key, too many pairs, or too many bytes.
    """
    if metadata is None:
        return {}
    if not isinstance(metadata, dict):
        raise TypeError(
            f"metadata must be a dict of strings to strings, got {type(metadata).__name__}. "
            'Fix: pass metadata={"user": "u42"}'
        )
    for key, value in metadata.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(
                f"metadata {key!r}: {value!r} is not a string to a string. Fix: convert keys and values with "
                "str(), e.g. {'order': str(order_id)}"
            )
        if not key:
            raise ValueError("metadata has an empty key. Fix: give every value a non-empty key")
    if len(metadata) > MAX_METADATA_PAIRS:
        raise ValueError(
            f"metadata has {len(metadata)} pairs; at most {MAX_METADATA_PAIRS} are allowed. Fix: keep the "
            "keys you filter or group runs by, and put the rest in the prompt or your own database"
        )
    size = sum(
        len(clean_text(key).encode()) + len(clean_text(value).encode()) for key, value in metadata.items()
    )
    if size > MAX_METADATA_BYTES:
        raise ValueError(
            f"metadata holds {size} bytes; at most {MAX_METADATA_BYTES} are allowed. Fix: keep ids and short "
            "labels in metadata, and larger data in your own database"
        )
    return clean(dict(metadata))


def new_run_id() -> str:
    """A new time-ordered run id: 32 hex digits, 48 bits of milliseconds then 80 random bits."""
    return f"{time.time_ns() // 1_000_000:012x}{secrets.token_hex(10)}"


def new_writer_id() -> str:
    """A random 128-bit writer id, made when a State is loaded or created for writing."""
    return secrets.token_hex(16)


def now_iso() -> str:
    """The current UTC time as ISO 8601 with microseconds and a ``Z``."""
    return datetime.now(UTC).isoformat(timespec="microseconds")[:-6] + "Z"  # "+00:00" -> "Z"


def call_id_for(reply_seq: int, index: int) -> str:
    """tether's own call id: ``c{seq of the model_replied}_{index}``, unique within a run."""
    return f"c{reply_seq}_{index}"


def idempotency_key_for(run_id: str, call_id: str) -> str:
    """The idempotency key journaled in ``tool_started``: ``tether:{run_id}:{call_id}``."""
    return f"tether:{run_id}:{call_id}"


# --------------------------------------------------------------------------------------------------
# Entry kinds


@dataclass(frozen=True, slots=True, kw_only=True)
class Entry:
    """One journal entry. Subclasses add the fields of their kind.

    Attributes:
        seq: position in the journal, from 0.
        at: when it was written (ISO 8601, UTC).
        w: the writer id.
        h: the checksum of every field but ``w`` and ``h``.
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
    version: int = FORMAT_VERSION
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


KINDS: dict[str, type[Entry]] = {
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

_FIELDS: dict[type[Entry], tuple[str, ...]] = {
    cls: tuple(f.name for f in dataclasses.fields(cls)) for cls in KINDS.values()
}
_FIELD_SETS: dict[type[Entry], frozenset[str]] = {cls: frozenset(names) for cls, names in _FIELDS.items()}

# --------------------------------------------------------------------------------------------------
# Codec


_VALUES: dict[type[Entry], Callable[[Entry], tuple[Any, ...]]] = {
    cls: operator.attrgetter(*names) for cls, names in _FIELDS.items()
}


def entry_to_dict(entry: Entry) -> dict[str, Any]:
    """The JSON object of ``entry``: ``kind`` first, fields whose value is None left out."""
    cls = type(entry)
    out: dict[str, Any] = {"kind": entry.kind}
    for name, value in zip(_FIELDS[cls], _VALUES[cls](entry), strict=True):
        if value is not None:
            out[name] = value
    return out


def checksum(obj: dict[str, Any]) -> str:
    """The checksum ``h`` of an entry's JSON object: BLAKE2b-64 in hex over every field but ``w`` and ``h``."""
    if "w" in obj or "h" in obj:
        obj = {k: v for k, v in obj.items() if k != "w" and k != "h"}
    return hashlib.blake2b(orjson.dumps(obj, option=orjson.OPT_SORT_KEYS), digest_size=8).hexdigest()


def seal(entries: Sequence[Entry], writer: str) -> list[Entry]:
    """Stamp one append's entries with the writer id, the countdown ``b`` and the checksum ``h``."""
    last = len(entries) - 1
    sealed: list[Entry] = []
    for j, entry in enumerate(entries):
        body = entry_to_dict(entry)
        body["b"] = last - j
        body.pop("w", None)
        body.pop("h", None)
        digest = checksum(body)
        del body["kind"]
        # Made from its JSON object, as a load makes it: a field left out (None) takes its default.
        sealed.append(type(entry)(**body, w=writer, h=digest))
    return sealed


def encode_entry(entry: Entry) -> bytes:
    """The entry's JSON bytes, one line without the newline."""
    return orjson.dumps(entry_to_dict(entry))


Migration = Callable[[dict[str, Any]], dict[str, Any]]
_MIGRATIONS: dict[int, Migration] = {1: lambda obj: obj}  # format 2 only added optional fields
"""Upgrades of an entry's JSON from format ``n`` to ``n + 1``, keyed by ``n``."""


def decode_entry(
    raw: bytes | str | dict[str, Any],
    run_id: str,
    *,
    journal_version: int = FORMAT_VERSION,
    expected_seq: int | None = None,
) -> Entry:
    """Decode and check one entry.

    Raises:
        NewerFormatError: the entry (or its journal) was written by a newer tether.
        CorruptJournalError: it is not JSON, fails its checksum, or has an unknown kind or field.
    """
    if isinstance(raw, dict):
        obj = dict(raw)  # decoding takes fields out of it: never touch the caller's dict
    else:
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise CorruptJournalError(run_id, expected_seq, f"the entry is not valid JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise CorruptJournalError(run_id, expected_seq, "the entry is not a JSON object")
    seq = obj.get("seq")
    if not isinstance(seq, int):
        raise CorruptJournalError(run_id, expected_seq, "the entry has no integer seq")
    version = obj.get("v") or journal_version
    kind = obj.get("kind")
    if kind == "run_started" and isinstance(obj.get("version"), int):
        version = max(version, obj["version"])
    if not isinstance(version, int):
        raise CorruptJournalError(run_id, seq, "the entry's format version is not a number")
    if version > FORMAT_VERSION:
        raise NewerFormatError(run_id, seq, version, FORMAT_VERSION)
    h = obj.pop("h", None)
    w = obj.pop("w", "")
    if h != checksum(obj):
        raise CorruptJournalError(run_id, seq, "the entry fails its checksum")
    while version < FORMAT_VERSION:
        obj = _MIGRATIONS[version](obj)
        version += 1
    obj.pop("kind", None)
    cls = KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise CorruptJournalError(run_id, seq, f"unknown entry kind {kind!r}")
    if not obj.keys() <= _FIELD_SETS[cls]:
        unknown = sorted(obj.keys() - _FIELD_SETS[cls])
        raise CorruptJournalError(run_id, seq, f"unknown fields {unknown} in a {cls.kind} entry")
    try:
        return cls(w=w, h=h, **obj)
    except TypeError as exc:
        raise CorruptJournalError(run_id, seq, f"a {cls.kind} entry cannot be read ({exc})") from None


def decode_journal(run_id: str, raws: Iterable[bytes | str | dict[str, Any]]) -> list[Entry]:
    """Decode a whole journal, checking that seqs count from 0 without gaps.

    The journal's version comes from its ``run_started``; a newer version anywhere is refused.
    """
    entries: list[Entry] = []
    version = FORMAT_VERSION
    for expected, raw in enumerate(raws):
        entry = decode_entry(raw, run_id, journal_version=version, expected_seq=expected)
        if entry.seq != expected:
            raise CorruptJournalError(run_id, entry.seq, f"expected seq {expected} here")
        if isinstance(entry, RunStarted):
            version = entry.version
        entries.append(entry)
    return entries


def host_and_pid() -> tuple[str, int]:
    """This process's host name and pid, as recorded in leases and ``run_resumed``."""
    return os.uname().nodename, os.getpid()
