"""FileStore's listing lines: the record each journal append ends with, written short, read back whole.

Every append ends with one listing line, so ``list()`` reads a run's record from one small tail block
(DURABILITY 5). There are two kinds:

- a **full** line, ``{"info": {...the writer's whole info..., "length": N, "token": T}}``: every line of a
  format 1–2 journal, the first line of every journal, and in a format-3 journal whenever a field that
  seldom changes (``STATIC``) changed or the last full line ends more than ``FULL_EVERY`` bytes back;
- a **short** line, ``{"i": {...}}``: in a format-3 journal, the fields that change with each append
  (status, turn, updated_at, inbox_consumed, token), each left out when it has its usual value
  (``running``, the append's last entry's time, -1, none). The record is the last full line's ``STATIC``
  fields and the short line's own (``record``).
"""

from __future__ import annotations

from typing import Any

import orjson

from ... import journal as j

__all__ = [
    "FULL_EVERY",
    "FULL_PREFIX",
    "SHORT_PREFIX",
    "STATIC",
    "is_listing",
    "listing_line",
    "record",
    "static_of",
]

FULL_PREFIX = b'{"info"'
"""How a full listing line begins (an entry line begins with ``{"h"`` or ``{"kind"``)."""

SHORT_PREFIX = b'{"i":'
"""How a short listing line begins."""

STATIC = ("agent", "created_at", "first_message", "parent_id", "root_id", "metadata")
"""The listing fields a short line leaves to the last full one."""

FULL_EVERY = 8192
"""A full line is written again once the last one ends this many bytes before the append begins, so a
tail read of about twice this finds it."""

_USUAL = {"status": "running", "inbox_consumed": -1, "token": None}
_INFO_FIELDS = frozenset((*STATIC, "status", "turn", "updated_at", "inbox_consumed"))  # State.info()'s


def is_listing(line: bytes) -> bool:
    """Whether a journal line is a listing line (full or short)."""
    return line.startswith(FULL_PREFIX) or line.startswith(SHORT_PREFIX)


def listing_line(
    entries: list[j.Entry],
    lines: list[bytes],
    info: dict[str, Any],
    length: int,
    token: int | None,
    last_static: tuple[Any, ...] | None,
    since_full: int,
) -> bytes:
    """The listing line ending an append of ``entries`` (encoded as ``lines``).

    Args:
        last_static: the ``STATIC`` fields of the journal's last full line (``static_of`` its record;
            None: write a full one).
        since_full: bytes from the end of that line to where this append begins.

    Raises:
        TypeError: ``info`` cannot be written as JSON.
    """
    if (
        last_static is None
        or since_full >= FULL_EVERY
        or not lines[0].startswith(b'{"h":"')  # a format 1-2 journal: full lines, as its tether wrote them
        or static_of(info) != last_static
    ):
        return orjson.dumps({"info": {**info, "length": length, "token": token}})
    if not info.keys() <= _INFO_FIELDS:  # fields a State's info does not have: each is written
        return orjson.dumps({"i": _short(info, token, entries[-1].at)})
    short: dict[str, Any] = {} if token is None else {"token": token}
    get = info.get
    status = get("status", "running")
    if status != "running":
        short["status"] = status
    if "turn" in info:
        short["turn"] = info["turn"]
    if "updated_at" in info and info["updated_at"] != entries[-1].at:
        short["updated_at"] = info["updated_at"]
    consumed = get("inbox_consumed", -1)
    if consumed != -1:
        short["inbox_consumed"] = consumed
    return orjson.dumps({"i": short})


def _short(info: dict[str, Any], token: int | None, last_at: str) -> dict[str, Any]:
    """A short line's fields for any ``info``: each but ``STATIC`` and ``length``, less their usual values."""
    short = {"token": token}
    for name, value in info.items():
        if name not in STATIC and name != "length":
            short[name] = value
    for name, usual in _USUAL.items():
        if short.get(name, usual) == usual:
            short.pop(name, None)
    if short.get("updated_at") == last_at:
        del short["updated_at"]
    return short


def static_of(record: dict[str, Any]) -> tuple[Any, ...]:
    """The ``STATIC`` fields of a listing record (or of a writer's info), in ``STATIC`` order."""
    return tuple(map(record.get, STATIC))


def full_record(line: bytes) -> dict[str, Any]:
    """The record of a full listing line.

    Raises:
        ValueError, KeyError, TypeError: the line is not one.
    """
    found = orjson.loads(line)["info"]
    if not isinstance(found, dict):
        raise TypeError("the listing record is not an object")
    return found


def record(line: bytes, full: bytes, last: list[j.Entry], length: int) -> dict[str, Any]:
    """The whole listing record of the last listing line ``line``.

    Args:
        full: the last full listing line at or before it.
        last: the entries of the append ``line`` ends.
        length: the journal's length at ``line``.

    Raises:
        ValueError, KeyError, TypeError: a line is damaged, or a short line has no full line before it.
    """
    if line.startswith(FULL_PREFIX):
        return full_record(line)
    short = orjson.loads(line)["i"]
    if not isinstance(short, dict):
        raise TypeError("the listing record is not an object")
    base = full_record(full)
    out: dict[str, Any] = {name: base.get(name) for name in STATIC if name in base}
    out.update(_USUAL)
    out["updated_at"] = last[-1].at if last else None
    out["length"] = length
    out.update(short)
    return out
