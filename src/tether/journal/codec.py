"""The journal's codec: format 3 (what this tether writes), and the dispatch to formats 1–2 (pure).

A format-3 line is ``{"h":"<16 chars>","kind":…,"seq":…,"at":…,"w":…,["b":…,]...fields}``:

- ``h`` comes first and has a fixed width: base64 (standard alphabet, no padding) of a BLAKE2b-96 digest
  over the run id, a newline, and every byte of the line after ``h`` (from ``"kind"`` to the closing
  brace). So a reader checks an entry by hashing its raw bytes, without encoding anything again, and an
  entry (or a whole journal) copied under another run id fails its checksum.
- ``at`` is an integer: microseconds since the Unix epoch (a time ``now_iso`` did not make stays text).
- ``w`` is the first 16 hex digits (64 random bits) of the writer id.
- ``b`` is left out when 0; a field whose value is None or its format-3 default (``DEFAULTS``) is left
  out; ``tool_started.idempotency_key`` is left out when it is ``tether:{run_id}:{call_id}``. A reader
  puts each back, so a decoded entry equals the sealed one.

``docs/journal-format.md`` describes every format and why.
"""

from __future__ import annotations

import binascii
import dataclasses
import functools
import hashlib
import operator
from collections.abc import Iterable, Sequence
from typing import Any

import orjson

from ..errors import CorruptJournalError, NewerFormatError
from .entries import ENVELOPE, FIELD_SETS, FIELDS, KINDS, Entry, RunStarted, ToolStarted
from .legacy import LEGACY_VERSION, decode_legacy, encode_legacy, legacy_checksum, seal_legacy
from .vocabulary import idempotency_key_for, iso_from_micros, micros_from_iso

__all__ = [
    "DEFAULTS",
    "FORMAT_VERSION",
    "LineDecoder",
    "checksum",
    "decode_entry",
    "decode_journal",
    "encode_entry",
    "line_checksum",
    "seal",
    "seal_own",
    "short_writer",
]

FORMAT_VERSION = 3
"""The journal format this tether writes; it reads this one and every older one (``docs/journal-format.md``).

Format 3 is compact (integer times, a 64-bit writer field, defaults left out) and binds each entry to its
run id. A journal begun in format 1 or 2 is still appended to in format 2 (``legacy.py``).
"""

_PREFIX = b'{"h":"'
_H_END = 22  # len(_PREFIX) + 16
_REST = 24  # after '",'
_KEEP = object()  # a default no value equals: the field is always written
_dumps = orjson.dumps


def _defaults(cls: type[Entry]) -> tuple[tuple[str, Any], ...]:
    out: list[tuple[str, Any]] = []
    for f in dataclasses.fields(cls)[len(ENVELOPE) :]:
        if f.name == "version" or (cls is ToolStarted and f.name == "idempotency_key"):
            out.append((f.name, _KEEP))
        elif f.default_factory is not dataclasses.MISSING:
            out.append((f.name, f.default_factory()))
        else:
            out.append((f.name, f.default))
    return tuple(out)


DEFAULTS: dict[type[Entry], tuple[tuple[str, Any], ...]] = {cls: _defaults(cls) for cls in KINDS.values()}
"""Each kind's fields after the envelope, with the value a format-3 line leaves out (``_KEEP``: none).

These are part of format 3: changing a dataclass default changes what old lines decode to, so a test pins
them (``tests/test_journal_format.py``).
"""

assert all(FIELDS[cls][: len(ENVELOPE)] == ENVELOPE for cls in KINDS.values())

_REQUIRED = object()  # a field without a default: a line without it cannot be read


def _builder(cls: type[Entry]) -> Any:
    """A fast ``cls(**obj)`` for decoded objects: slots set directly, no keyword parsing (a load makes 30,000)."""
    plain, made = [], []
    for f in dataclasses.fields(cls):
        setter = getattr(cls, f.name).__set__
        if f.default_factory is not dataclasses.MISSING:
            made.append((setter, f.name, f.default_factory))
        else:
            plain.append((setter, f.name, _REQUIRED if f.default is dataclasses.MISSING else f.default))
    new = object.__new__

    def build(obj: dict[str, Any]) -> Entry:
        entry = new(cls)
        get = obj.get
        for setter, name, default in plain:
            value = get(name, default)
            if value is _REQUIRED:
                raise TypeError(f"missing field {name!r}")
            setter(entry, value)
        for setter, name, factory in made:
            value = get(name, _REQUIRED)
            setter(entry, factory() if value is _REQUIRED else value)
        return entry

    return build


_BUILD = {cls: _builder(cls) for cls in KINDS.values()}


def short_writer(writer: str) -> str:
    """The ``w`` of a format-3 entry: the writer id's first 16 hex digits (a shorter id is hashed to 16)."""
    if len(writer) >= 16:
        return writer[:16]
    return hashlib.blake2b(writer.encode(), digest_size=8).hexdigest()


@functools.lru_cache(maxsize=256)
def _hasher(run_id: str) -> Any:
    return hashlib.blake2b(run_id.encode() + b"\n", digest_size=12, person=b"tether-journal-3")


def line_checksum(run_id: str, rest: bytes | memoryview) -> bytes:
    """Format 3's ``h``: base64 of BLAKE2b-96 over the run id, a newline and ``rest`` (the line after ``h``)."""
    hasher = _hasher(run_id).copy()
    hasher.update(rest)
    return binascii.b2a_base64(hasher.digest(), newline=False)


def checksum(obj: dict[str, Any], run_id: str | None = None) -> str:
    """The checksum ``h`` of an entry's JSON object (the one checksum: every entry is checked by it).

    With ``run_id``, format 3's: over the run id and the line ``orjson.dumps(obj)`` makes after ``h``
    (``obj`` begins with ``h``, or has none). Without, formats 1–2's: BLAKE2b-64 in hex over every field
    but ``w`` and ``h``, keys sorted.
    """
    if run_id is None:
        return legacy_checksum(obj)
    body = orjson.dumps({k: v for k, v in obj.items() if k != "h"})
    return line_checksum(run_id, memoryview(body)[1:]).decode()


# --------------------------------------------------------------------------------------------------
# Writing


def _body(entry: Entry, run_id: str, w: str, b: int, nones: list[str] | None = None) -> dict[str, Any]:
    """The format-3 JSON object of ``entry`` without ``h``: what its line holds after ``h``.

    ``nones``, when given, gets the name of each field left out as None whose default is not None.
    """
    cls = type(entry)
    at = entry.at
    micros = micros_from_iso(at)
    out: dict[str, Any] = {"kind": cls.kind, "seq": entry.seq, "at": at if micros is None else micros, "w": w}
    if b:
        out["b"] = b
    for (name, default, default_class), value in zip(_LEFT_OUT[cls], _FIELD_VALUES[cls](entry), strict=True):
        if value is None:
            if nones is not None and default is not None:
                nones.append(name)
        elif value.__class__ is not default_class or value != default:  # builtins: != is not ==
            out[name] = value
    if cls is ToolStarted and out["idempotency_key"] == idempotency_key_for(run_id, out.get("call_id", "")):
        del out["idempotency_key"]
    return out


def _values_after_envelope(cls: type[Entry]) -> Any:
    """A function giving an entry's values of the fields after the envelope, in ``DEFAULTS`` order."""
    names = [name for name, _ in DEFAULTS[cls]]
    if len(names) > 1:
        return operator.attrgetter(*names)
    get = operator.attrgetter(*names) if names else None
    return lambda entry: (get(entry),) if get is not None else ()


_FIELD_VALUES = {cls: _values_after_envelope(cls) for cls in KINDS.values()}
_LEFT_OUT = {
    cls: tuple((name, default, default.__class__) for name, default in DEFAULTS[cls])
    for cls in KINDS.values()
}  # DEFAULTS with each default's class: a value of that class equal to it is left out


def _line(body: dict[str, Any], hasher: Any) -> tuple[bytes, str]:
    """The format-3 line of ``body`` and its ``h``; ``hasher`` is the run's (``_hasher``), left unchanged."""
    rest = memoryview(_dumps(body))[1:]
    digest = hasher.copy()
    digest.update(rest)
    h = binascii.b2a_base64(digest.digest(), newline=False)
    return b"".join((_PREFIX, h, b'",', rest)), h.decode()


def seal(entries: Sequence[Entry], writer: str, *, run_id: str, version: int = FORMAT_VERSION) -> list[Entry]:
    """Stamp one append's entries with the writer, the countdown ``b`` and the checksum ``h`` (DURABILITY 3).

    ``version`` is the journal's format (its ``run_started.version``): a journal begun in format 1 or 2 is
    sealed in format 2. Each sealed entry equals what a load of its line returns, and holds that line.
    """
    if version < FORMAT_VERSION:
        return seal_legacy(entries, writer)
    w = short_writer(writer)
    hasher = _hasher(run_id)  # made once for the batch
    last = len(entries) - 1
    sealed: list[Entry] = []
    for j, entry in enumerate(entries):
        body = _body(entry, run_id, w, last - j)
        line, h = _line(body, hasher)
        del body["kind"]
        body["at"] = entry.at
        if isinstance(entry, ToolStarted):
            body["idempotency_key"] = entry.idempotency_key
        made = type(entry)(**body, h=h)
        object.__setattr__(made, "_line", line)
        sealed.append(made)
    return sealed


def seal_own(entries: list[Entry], writer: str, *, run_id: str) -> list[Entry]:
    """``seal`` in format 3 for entries only their writer holds yet: each is stamped where it is.

    For a ``JournalWriter``'s new entries (already folded into its State): each gets ``w``, ``b``, ``h`` and
    its line, and becomes what ``seal`` would have returned for it (a field that is None where its
    default is not takes that default, as a load makes it), without a copy. Returns ``entries``.
    """
    w = short_writer(writer)
    hasher = _hasher(run_id)  # made once for the batch
    b = len(entries)
    stamp = object.__setattr__
    for entry in entries:
        b -= 1
        nones: list[str] = []
        line, h = _line(_body(entry, run_id, w, b, nones), hasher)
        stamp(entry, "w", w)
        stamp(entry, "h", h)
        stamp(entry, "b", b)
        if entry.v is not None:
            stamp(entry, "v", None)
        for name in nones:
            if name != "idempotency_key" or not isinstance(entry, ToolStarted):  # seal keeps the entry's key
                stamp(entry, name, _default_of(type(entry), name))
        stamp(entry, "_line", line)
    return entries


def _default_of(cls: type[Entry], name: str) -> Any:
    """A new copy of the dataclass default of field ``name`` of ``cls``."""
    field = cls.__dataclass_fields__[name]
    return field.default_factory() if field.default_factory is not dataclasses.MISSING else field.default


def encode_entry(entry: Entry, run_id: str | None = None) -> bytes:
    """The entry's line, without the newline: the one ``seal`` made, else encoded again in its format.

    A format-3 entry (its ``w`` is 16 characters) that ``seal`` did not make needs ``run_id``.

    Raises:
        ValueError: a format-3 entry without its line and no ``run_id``.
    """
    line = getattr(entry, "_line", None)
    if line is not None:
        return line
    if len(entry.w) != 16 or not entry.h:
        return encode_legacy(entry)
    if run_id is None:
        raise ValueError(
            f"entry seq {entry.seq} is in format 3 and its run is not known. Fix: pass run_id to encode_entry"
        )
    body = orjson.dumps(_body(entry, run_id, entry.w, entry.b))
    return b"".join((_PREFIX, entry.h.encode(), b'",', memoryview(body)[1:]))


def forget_line(entry: Entry) -> None:
    """Drop the line ``seal`` kept in ``entry`` (once it is durable, so a State does not hold it twice)."""
    if getattr(entry, "_line", None) is not None:
        object.__setattr__(entry, "_line", None)


# --------------------------------------------------------------------------------------------------
# Reading


def _newer(run_id: str, seq: int, obj: dict[str, Any], version: int) -> None:
    v = obj.get("v")
    if isinstance(v, int):
        version = max(version, v)
    if obj.get("kind") == "run_started" and isinstance(obj.get("version"), int):
        version = max(version, obj["version"])
    if version > FORMAT_VERSION:
        raise NewerFormatError(run_id, seq, version, FORMAT_VERSION)


def _load(raw: bytes, run_id: str, expected_seq: int | None) -> tuple[dict[str, Any], int]:
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise CorruptJournalError(run_id, expected_seq, f"the entry is not valid JSON ({exc})") from None
    if obj.__class__ is not dict:
        raise CorruptJournalError(run_id, expected_seq, "the entry is not a JSON object")
    seq = obj.get("seq")
    if seq.__class__ is not int:
        raise CorruptJournalError(run_id, expected_seq, "the entry has no integer seq")
    return obj, seq


def _decode3(raw: bytes, run_id: str, journal_version: int | None, expected_seq: int | None) -> Entry:
    obj, seq = _load(raw, run_id, expected_seq)
    if "v" in obj or obj.get("kind") == "run_started":
        _newer(run_id, seq, obj, FORMAT_VERSION)
    if journal_version is not None and journal_version < FORMAT_VERSION:
        raise CorruptJournalError(run_id, seq, f"a format-3 entry in a format-{journal_version} journal")
    if raw[_H_END:_REST] != b'",' or line_checksum(run_id, memoryview(raw)[_REST:]) != raw[6:_H_END]:
        raise CorruptJournalError(
            run_id, seq, "the entry fails its checksum (it is damaged, or of another run)"
        )
    h = obj.pop("h")
    kind = obj.pop("kind", None)
    cls = KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise CorruptJournalError(run_id, seq, f"unknown entry kind {kind!r}")
    at = obj.get("at")
    if at.__class__ is int:
        try:
            obj["at"] = iso_from_micros(at)
        except (OverflowError, OSError, ValueError):
            raise CorruptJournalError(run_id, seq, f"its time {at} is out of range") from None
    if cls is ToolStarted and "idempotency_key" not in obj:
        obj["idempotency_key"] = idempotency_key_for(run_id, obj.get("call_id", ""))
    if not obj.keys() <= FIELD_SETS[cls]:
        unknown = sorted(obj.keys() - FIELD_SETS[cls])
        raise CorruptJournalError(run_id, seq, f"unknown fields {unknown} in a {cls.kind} entry")
    obj["h"] = h
    try:
        return _BUILD[cls](obj)
    except TypeError as exc:
        raise CorruptJournalError(run_id, seq, f"a {cls.kind} entry cannot be read ({exc})") from None


def decode_entry(
    raw: bytes | str | dict[str, Any],
    run_id: str,
    *,
    journal_version: int | None = None,
    expected_seq: int | None = None,
) -> Entry:
    """Decode and check one entry, of any format this tether reads.

    ``journal_version`` is the format of the journal the entry is in (its ``run_started.version``), None
    when the caller has not read it: then the entry's own layout says (a format-3 line begins ``{"h":"``).
    A format 1–2 entry in a format-3 journal, or the other way round, is corruption.

    Raises:
        NewerFormatError: the entry (or its journal) was written by a newer tether.
        CorruptJournalError: it is not JSON, fails its checksum, or has an unknown kind or field.
    """
    if isinstance(raw, dict):
        if next(iter(raw), None) == "h":
            raw = orjson.dumps(raw)  # a format-3 line as read: orjson writes back the bytes it read
        else:
            return _decode_legacy_obj(dict(raw), run_id, journal_version, expected_seq)
    elif isinstance(raw, str):
        raw = raw.encode()
    if raw.startswith(_PREFIX):
        return _decode3(raw, run_id, journal_version, expected_seq)
    obj, _ = _load(raw, run_id, expected_seq)
    return _decode_legacy_obj(obj, run_id, journal_version, expected_seq)


def _decode_legacy_obj(
    obj: dict[str, Any], run_id: str, journal_version: int | None, expected_seq: int | None
) -> Entry:
    if not isinstance(obj, dict):
        raise CorruptJournalError(run_id, expected_seq, "the entry is not a JSON object")
    seq = obj.get("seq")
    if not isinstance(seq, int):
        raise CorruptJournalError(run_id, expected_seq, "the entry has no integer seq")
    version = obj.get("v") or (LEGACY_VERSION if journal_version is None else journal_version)
    if not isinstance(version, int):
        raise CorruptJournalError(run_id, seq, "the entry's format version is not a number")
    _newer(run_id, seq, obj, version)
    if obj.get("kind") == "run_started" and isinstance(obj.get("version"), int):
        version = obj["version"]
    if (journal_version is not None and journal_version >= FORMAT_VERSION) or version >= FORMAT_VERSION:
        raise CorruptJournalError(
            run_id, seq, f"a format-{LEGACY_VERSION} entry in a format-{FORMAT_VERSION} journal"
        )
    return decode_legacy(obj, run_id, version, seq)


_ENVELOPE_SOURCE = """\
def build(obj, run_id, {args}):
    e = new(cls)
    pop = obj.pop
    seq = pop("seq")
    if seq.__class__ is not int:
        return None
    s_seq(e, seq)
    at = pop("at")
    s_at(e, iso(at) if at.__class__ is int else at)
    s_v(e, None)
{fields}
    return None if obj else e
"""


def _fast_builder(cls: type[Entry]) -> Any:
    """The usual format-3 line's ``cls`` from its decoded object (``kind`` and the checksum already checked).

    Straight-line code made for the kind from its dataclass fields: each field popped from the object and
    set in its slot, the time made text again, the default key put back. It returns None for anything
    unusual (a ``v``, which stays in the object, a field it does not know, a seq that is not an integer),
    and may raise on a missing field: the caller then decodes the line with ``decode_entry``, which names
    the exact problem.
    """
    names: dict[str, Any] = {
        "new": object.__new__,
        "cls": cls,
        "iso": iso_from_micros,
        "key": idempotency_key_for,
    }
    lines = []
    for f in dataclasses.fields(cls):
        name = f.name
        names[f"s_{name}"] = getattr(cls, name).__set__
        if name in ("seq", "at", "v"):
            continue  # set by _ENVELOPE_SOURCE
        if cls is ToolStarted and name == "idempotency_key":
            value = f"pop('{name}') if '{name}' in obj else key(run_id, e.call_id)"
        elif f.default_factory is not dataclasses.MISSING:
            names[f"d_{name}"] = f.default_factory
            value = f"pop('{name}') if '{name}' in obj else d_{name}()"
        elif f.default is dataclasses.MISSING:
            value = f"pop('{name}')"
        else:
            names[f"d_{name}"] = f.default
            value = f"pop('{name}', d_{name})"
        lines.append(f"    s_{name}(e, {value})")
    args = ", ".join(f"{name}={name}" for name in names)
    scope: dict[str, Any] = {}
    exec(_ENVELOPE_SOURCE.format(args=args, fields="\n".join(lines)), dict(names), scope)  # nothing read
    return scope["build"]


_FAST: dict[str, Any] = {cls.kind: _fast_builder(cls) for cls in KINDS.values() if cls is not RunStarted}
"""The usual line's builder of each kind but ``run_started`` (whose version decides how a journal reads)."""


class LineDecoder:
    """``decode_entry`` for the lines of one run, fast for the usual format-3 line (a load decodes 30,000).

    Its hasher is made once; a line that is not the usual case (another format, a ``run_started``, a
    ``v``, anything that fails a check) goes through ``decode_entry``, which raises the exact error.
    """

    __slots__ = ("_hasher", "run_id")

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self._hasher = _hasher(run_id)

    def __call__(self, raw: bytes, journal_version: int | None, expected_seq: int | None) -> Entry:
        """Decode and check one line (see ``decode_entry``)."""
        if journal_version is not None and journal_version >= FORMAT_VERSION and raw[:6] == _PREFIX:
            try:
                obj = _loads(raw)
                build = _FAST.get(obj.pop("kind", None))
                hasher = self._hasher.copy()
                hasher.update(memoryview(raw)[_REST:])
                if (
                    build is not None
                    and raw[_H_END:_REST] == b'",'
                    and _b64(hasher.digest(), newline=False) == raw[6:_H_END]
                ):
                    entry = build(obj, self.run_id)
                    if entry is not None:
                        return entry
            except Exception:  # anything unusual: decode_entry raises the exact error
                pass
        return decode_entry(raw, self.run_id, journal_version=journal_version, expected_seq=expected_seq)


_loads = orjson.loads
_b64 = binascii.b2a_base64


def decode_journal(run_id: str, raws: Iterable[bytes | str | dict[str, Any]]) -> list[Entry]:
    """Decode a whole journal, checking that seqs count from 0 without gaps.

    The journal's version comes from its ``run_started``; a newer version anywhere is refused.
    """
    entries: list[Entry] = []
    version: int | None = None
    decode = LineDecoder(run_id)
    for expected, raw in enumerate(raws):
        if raw.__class__ is bytes:
            entry = decode(raw, version, expected)
        else:
            entry = decode_entry(raw, run_id, journal_version=version, expected_seq=expected)
        if entry.seq != expected:
            raise CorruptJournalError(run_id, entry.seq, f"expected seq {expected} here")
        if entry.__class__ is RunStarted:
            version = entry.version
        entries.append(entry)
    return entries
