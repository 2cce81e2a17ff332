"""The journal: entry types, ids, the codec, checksums, the format versions and migrations (pure: no I/O).

An entry is a small JSON object, one line: ``{"h", "kind", "seq", "at", "w", ...fields}`` in format 3
(``codec.py``), ``{"kind", "seq", "at", "w", "h", ...fields}`` in formats 1 and 2 (``legacy.py``). ``w``
says who wrote it and ``h`` checks it (DURABILITY 3). The modules, one job each:

- ``vocabulary.py``: statuses, outcomes, effects, run ids and metadata, writer ids, call ids and times;
- ``entries.py``: the entry kinds;
- ``codec.py``: format 3, and reading any format;
- ``legacy.py``: formats 1 and 2.

``docs/journal-format.md`` describes the formats.
"""

from __future__ import annotations

from .codec import (
    DEFAULTS,
    FORMAT_VERSION,
    LineDecoder,
    checksum,
    decode_entry,
    decode_journal,
    encode_entry,
    forget_line,
    line_checksum,
    seal,
    seal_own,
    short_writer,
)
from .entries import (
    KINDS,
    AgentChanged,
    ApprovalDecided,
    ApprovalRequested,
    BudgetsChanged,
    CancelRequested,
    ChildWaiting,
    Compacted,
    Entry,
    InboxSkipped,
    MessageAdded,
    ModelFailed,
    ModelReplied,
    RunReleased,
    RunResumed,
    RunStarted,
    RunStopped,
    ToolFinished,
    ToolStarted,
)
from .legacy import LEGACY_VERSION, entry_to_dict
from .vocabulary import (
    EFFECTS,
    FINAL_STATUSES,
    MAX_METADATA_BYTES,
    MAX_METADATA_PAIRS,
    OUTCOMES,
    RETRY_EFFECTS,
    STOP_STATUSES,
    Effect,
    Outcome,
    Status,
    call_id_for,
    host_and_pid,
    idempotency_key_for,
    iso_from_micros,
    micros_from_iso,
    new_run_id,
    new_writer_id,
    now_iso,
    validate_metadata,
    validate_run_id,
)

__all__ = [
    "DEFAULTS",
    "EFFECTS",
    "FINAL_STATUSES",
    "FORMAT_VERSION",
    "KINDS",
    "LEGACY_VERSION",
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
    "LineDecoder",
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
    "forget_line",
    "host_and_pid",
    "idempotency_key_for",
    "iso_from_micros",
    "line_checksum",
    "micros_from_iso",
    "new_run_id",
    "new_writer_id",
    "now_iso",
    "seal",
    "seal_own",
    "short_writer",
    "validate_metadata",
    "validate_run_id",
]
