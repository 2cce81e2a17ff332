"""The journal's vocabulary, ids and times: the one definition of each word an entry records (pure)."""

from __future__ import annotations

import os
import re
import secrets
import time
from datetime import datetime
from typing import Literal, get_args

from .._encodable import clean, clean_text

__all__ = [
    "EFFECTS",
    "FINAL_STATUSES",
    "MAX_METADATA_BYTES",
    "MAX_METADATA_PAIRS",
    "OUTCOMES",
    "RETRY_EFFECTS",
    "STOP_STATUSES",
    "Effect",
    "Outcome",
    "Status",
    "call_id_for",
    "host_and_pid",
    "idempotency_key_for",
    "iso_from_micros",
    "micros_from_iso",
    "new_run_id",
    "new_writer_id",
    "now_iso",
    "validate_metadata",
    "validate_run_id",
]


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


_MADE: dict[str, int] = {}  # the last times now_iso made, and their microseconds (see micros_from_iso)
_MADE_MAX = 256


def now_iso() -> str:
    """The current UTC time as ISO 8601 with microseconds and a ``Z``: ``2026-12-01T11:39:55.174973Z``.

    What ``datetime.now(UTC).isoformat()`` says, made from one clock read (``iso_from_micros``); the last
    few are remembered so that sealing them (``micros_from_iso``) parses nothing.
    """
    micros = time.time_ns() // 1000
    at = iso_from_micros(micros)
    if len(_MADE) >= _MADE_MAX:
        _MADE.clear()
    _MADE[at] = micros
    return at


def call_id_for(reply_seq: int, index: int) -> str:
    """tether's own call id: ``c{seq of the model_replied}_{index}``, unique within a run."""
    return f"c{reply_seq}_{index}"


def idempotency_key_for(run_id: str, call_id: str) -> str:
    """The idempotency key journaled in ``tool_started``: ``tether:{run_id}:{call_id}``."""
    return f"tether:{run_id}:{call_id}"


def host_and_pid() -> tuple[str, int]:
    """This process's host name and pid, as recorded in leases and ``run_resumed``."""
    return os.uname().nodename, os.getpid()


_EPOCH = datetime(1970, 1, 1)
_last_second: tuple[int, str] = (
    0,
    "1970-01-01T00:00:00",
)  # the last second formatted (one tuple: thread-safe)


def micros_from_iso(at: str) -> int | None:
    """``at`` as microseconds since the Unix epoch, when it is exactly what ``now_iso`` makes, else None.

    Only a time that ``iso_from_micros`` turns back into the same text is converted, so no text is lost.
    A time ``now_iso`` made lately is looked up, not parsed.
    """
    made = _MADE.get(at)
    if made is not None:
        return made
    if len(at) != 27 or at[26] != "Z" or at[19] != ".":
        return None
    try:
        delta = datetime.fromisoformat(at[:26]) - _EPOCH
    except ValueError:
        return None
    micros = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    return micros if iso_from_micros(micros) == at else None


def iso_from_micros(micros: int) -> str:
    """Microseconds since the Unix epoch as ``now_iso`` writes them: ``2026-12-01T11:39:55.174973Z``."""
    global _last_second
    second, fraction = divmod(micros, 1_000_000)
    last = _last_second
    if last[0] != second:
        last = _last_second = (second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second)))
    return f"{last[1]}.{fraction:06d}Z"
