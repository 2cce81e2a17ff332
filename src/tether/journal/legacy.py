"""Formats 1 and 2: the journal as tethers before format 3 wrote it, read and still appended to (pure).

A format 1–2 line is ``{"kind", "seq", "at", "w", "h", "b", ...fields}``: ``at`` as ISO 8601 text, ``w``
the 128-bit writer id, ``h`` BLAKE2b-64 in hex over the entry's JSON object with sorted keys, every field
but ``w`` and ``h``. The run id is not covered. Format 2 only added optional fields to format 1
(``run_started.metadata`` and ``traceparent``, ``approval_decided.args``), so a format-1 entry reads as it
is. A journal begun in format 1 or 2 is appended to in format 2 (see ``docs/journal-format.md``): what this
tether adds to a format-1 journal carries ``v`` 2, as the format-2 tether wrote it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

import orjson

from ..errors import CorruptJournalError
from .entries import FIELD_SETS, FIELDS, KINDS, VALUES, Entry

__all__ = [
    "LEGACY_VERSION",
    "decode_legacy",
    "encode_legacy",
    "entry_to_dict",
    "legacy_checksum",
    "seal_legacy",
]

LEGACY_VERSION = 2
"""The newest of the formats this module reads and writes."""

Migration = Callable[[dict[str, Any]], dict[str, Any]]
_MIGRATIONS: dict[int, Migration] = {1: lambda obj: obj}  # format 2 only added optional fields
"""Upgrades of an entry's JSON from format ``n`` to ``n + 1``, keyed by ``n``, up to ``LEGACY_VERSION``."""


def entry_to_dict(entry: Entry) -> dict[str, Any]:
    """The JSON object of ``entry``: ``kind`` first, fields whose value is None left out."""
    cls = type(entry)
    out: dict[str, Any] = {"kind": entry.kind}
    for name, value in zip(FIELDS[cls], VALUES[cls](entry), strict=True):
        if value is not None:
            out[name] = value
    return out


def legacy_checksum(obj: dict[str, Any]) -> str:
    """The format 1–2 checksum ``h`` of an entry's JSON object: BLAKE2b-64 in hex over every field but ``w`` and ``h``."""
    if "w" in obj or "h" in obj:
        obj = {k: v for k, v in obj.items() if k != "w" and k != "h"}
    return hashlib.blake2b(orjson.dumps(obj, option=orjson.OPT_SORT_KEYS), digest_size=8).hexdigest()


def seal_legacy(entries: Sequence[Entry], writer: str) -> list[Entry]:
    """Stamp one append's entries, in format 2, with the writer id, the countdown ``b`` and the checksum ``h``."""
    last = len(entries) - 1
    sealed: list[Entry] = []
    for j, entry in enumerate(entries):
        body = entry_to_dict(entry)
        body["b"] = last - j
        body.pop("w", None)
        body.pop("h", None)
        digest = legacy_checksum(body)
        del body["kind"]
        # Made from its JSON object, as a load makes it: a field left out (None) takes its default.
        sealed.append(type(entry)(**body, w=writer, h=digest))
    return sealed


def encode_legacy(entry: Entry) -> bytes:
    """The entry's format 1–2 line, without the newline."""
    return orjson.dumps(entry_to_dict(entry))


def decode_legacy(obj: dict[str, Any], run_id: str, version: int, seq: int) -> Entry:
    """Check and build a format 1–2 entry from its JSON object (the caller's copy: fields are taken out).

    Raises:
        CorruptJournalError: it fails its checksum, or has an unknown kind or field.
    """
    kind = obj.get("kind")
    h = obj.pop("h", None)
    w = obj.pop("w", "")
    if h != legacy_checksum(obj):
        raise CorruptJournalError(run_id, seq, "the entry fails its checksum")
    if kind == "run_started":
        obj.setdefault("version", version)  # a run_started written without one: its journal's format
    while version < LEGACY_VERSION:
        obj = _MIGRATIONS[version](obj)
        version += 1
    obj.pop("kind", None)
    cls = KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise CorruptJournalError(run_id, seq, f"unknown entry kind {kind!r}")
    if not obj.keys() <= FIELD_SETS[cls]:
        unknown = sorted(obj.keys() - FIELD_SETS[cls])
        raise CorruptJournalError(run_id, seq, f"unknown fields {unknown} in a {cls.kind} entry")
    try:
        return cls(w=w, h=h, **obj)
    except TypeError as exc:
        raise CorruptJournalError(run_id, seq, f"a {cls.kind} entry cannot be read ({exc})") from None
