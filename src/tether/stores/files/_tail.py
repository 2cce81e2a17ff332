"""FileStore's reading of a file's tail: parsing journal and inbox lines, and the cached tail state.

Nothing here knows about a store: these functions see one file (or its bytes) at a time, through the byte
I/O of ``_lock``. The journal format they parse is described in ``store.py``.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from ... import journal as j
from ...errors import CorruptJournalError
from .._planner import Stored, stored_entry
from ._info import FULL_PREFIX, SHORT_PREFIX, is_listing, record
from ._lock import BLOCK, pread_all

__all__ = [
    "INFO_PREFIX",
    "ITail",
    "JTail",
    "Parsed",
    "anchored",
    "lines_named",
    "named",
    "parse_forward",
    "parse_inbox",
    "refresh_inbox",
    "refresh_journal",
    "same",
    "scan_tail",
    "stored_range",
    "tail_record",
]

INFO_PREFIX = FULL_PREFIX
"""How a journal's full listing line begins (``_info.py``; an entry line begins with ``{"h"`` or ``{"kind"``)."""

LISTING = (FULL_PREFIX, SHORT_PREFIX)
"""How a listing line begins (either kind), for ``bytes.startswith``."""

RESCAN_OVER = 1 << 16
"""Past this many new bytes, a cached tail is rebuilt from the last block rather than every new line."""


# --------------------------------------------------------------------------------------------------
# Journal lines


@dataclass(slots=True)
class Parsed:
    """What a pass over journal bytes found.

    Attributes:
        entries: the entries of complete appends (only when asked to keep them).
        end: the file offset just after the last complete append.
        length: the number of entries up to ``end``.
        version: the journal's format version when its ``run_started`` was seen (or given), else None.
        info_line: the listing line of the last complete append (``b""`` when none was seen).
        last: the last complete append's entries (its end only, when it began before the bytes read).
        full_line: the last full listing line seen (``b""`` when none), and ``full_end`` the offset after it.
    """

    entries: list[j.Entry]
    end: int
    length: int
    version: int | None
    info_line: bytes = b""
    last: list[j.Entry] = field(default_factory=list)
    full_line: bytes = b""
    full_end: int = 0


def _corrupt(run_id: str, seq: int | None, problem: str) -> CorruptJournalError:
    return CorruptJournalError(run_id, seq, problem)


class _LineError(CorruptJournalError):
    """A damaged line at file offset ``offset``; ``named`` says which line of which file."""

    def __init__(self, run_id: str, seq: int | None, offset: int | None, what: str, stray: bool) -> None:
        super().__init__(run_id, seq, f"its line {what}")
        self.offset, self.what, self.stray = offset, what, stray


_STRAY = (
    "is not a tether journal entry (a JSON object without the fields every entry line begins with): a line "
    "something else wrote, or a damaged one"
)


def _line_error(run_id: str, seq: int, offset: int, line: bytes, exc: CorruptJournalError) -> _LineError:
    """``exc`` (the decoder's) about the line at ``offset``; a JSON object no tether wrote is called stray."""
    if not line.startswith((b'{"h"', b'{"kind"')):
        try:
            stray = isinstance(orjson.loads(line), dict)
        except orjson.JSONDecodeError:
            stray = False
        if stray:
            return _LineError(run_id, seq, offset, _STRAY, True)
    return _LineError(
        run_id, seq, offset, exc.problem.removeprefix("its line ").removeprefix("the entry "), False
    )


def named(exc: CorruptJournalError, path: str) -> CorruptJournalError:
    """``exc`` naming its line (``line 7 of /runs/r.jsonl``) when it is about one line, with the fix for it.

    The line's number is counted from the file's start (an error path: the cost is no concern).
    """
    if not isinstance(exc, _LineError) or exc.offset is None:
        return exc
    try:
        with open(path, "rb") as file:
            number = file.read(exc.offset).count(b"\n") + 1
    except OSError:
        return exc
    fix = None
    if exc.stray:
        fix = (
            f"if something other than tether wrote line {number}, remove that line (the journal is whole "
            f"without it); otherwise restore the run from a backup, or fork it before the damaged entry "
            f"(tether fork {exc.run_id} --at SEQ)"
        )
    return CorruptJournalError(exc.run_id, exc.seq, f"line {number} of {path} {exc.what}", fix=fix)


def parse_forward(
    run_id: str, data: bytes, *, base: int, seq: int, version: int | None, keep: bool
) -> Parsed:
    """Parse journal bytes that begin at an append boundary (file offset ``base``, entry ``seq``).

    Every newline-terminated line is checked (JSON, checksum, seq, the ``b`` countdown); bytes after the
    last complete append (a torn append) are checked as far as they go and left out of the result.

    Raises:
        CorruptJournalError: a complete line is damaged or out of place.
        NewerFormatError: an entry was written by a newer tether.
    """
    entries: list[j.Entry] = []
    pending: list[j.Entry] = []
    out = Parsed(entries, base, seq, version)
    decode = j.LineDecoder(run_id)
    run_started = j.RunStarted
    expect: int | None = None  # None: an append begins; -1: its listing line is due; k: the next b
    pos = base  # the file offset of the next line
    for line in data.split(b"\n")[:-1]:
        at = pos  # the line's file offset
        pos += len(line) + 1
        if line.startswith(LISTING):
            if expect != -1:
                raise _corrupt(run_id, seq, "a listing line is out of place before this entry")
            if keep:
                entries += pending
            out.last, pending = pending, []
            out.end, out.length, out.info_line = pos, seq, line
            if line.startswith(FULL_PREFIX):
                out.full_line, out.full_end = line, pos
            expect = None
            continue
        if expect == -1:
            raise _corrupt(run_id, seq, "the append before this entry has no listing line")
        try:
            entry = decode(line, version, seq)
        except CorruptJournalError as exc:
            raise _line_error(run_id, seq, at, line, exc) from None
        b = entry.b
        if b.__class__ is not int or b < 0 or (expect is not None and b != expect):
            due = "any" if expect is None else str(expect)
            raise _LineError(
                run_id, seq, at, f"breaks the append's countdown (b is {b!r}, {due} was due)", False
            )
        if entry.seq != seq:
            raise _corrupt(run_id, entry.seq, f"expected seq {seq} here")
        if entry.__class__ is run_started:
            version = entry.version
            out.version = version
        pending.append(entry)
        seq += 1
        expect = b - 1 if b else -1
    return out


def scan_tail(run_id: str, fd: int, size: int) -> Parsed:
    """The journal's tail state from its last block(s): the last complete append and what follows it.

    Reads 4 KiB from the end (more while the last listing line and the entry before it are not both in
    the block), so the cost does not grow with history.

    Raises:
        CorruptJournalError: a line in the tail is damaged.
    """
    block = BLOCK
    while True:
        start = max(0, size - block)
        data = pread_all(fd, size - start, start)
        if start == 0:
            return parse_forward(run_id, data, base=0, seq=0, version=None, keep=False)
        cut = data.find(b"\n")
        if cut >= 0:
            base = start + cut + 1
            lines = data[cut + 1 :].split(b"\n")[:-1]
            idx = next((i for i in range(len(lines) - 1, -1, -1) if is_listing(lines[i])), -1)
            if idx >= 1 and not is_listing(lines[idx - 1]):
                full = next((i for i in range(idx, -1, -1) if lines[i].startswith(FULL_PREFIX)), -1)
                if full >= 0:
                    return _tail_from(run_id, data[cut + 1 :], lines, idx, base, full)
        block *= 4


def _tail_from(run_id: str, body: bytes, lines: list[bytes], idx: int, base: int, full: int) -> Parsed:
    last: list[j.Entry] = []
    for distance, line in enumerate(reversed(lines[:idx])):
        if is_listing(line):
            break
        entry = j.decode_entry(line, run_id)
        if entry.b != distance:
            raise _corrupt(run_id, entry.seq, "its line breaks the append's countdown")
        last.append(entry)
    last.reverse()
    for before, after in itertools.pairwise(last):
        if after.seq != before.seq + 1:
            raise _corrupt(run_id, after.seq, f"expected seq {before.seq + 1} here")
    offset = sum(len(line) + 1 for line in lines[: idx + 1])
    length = last[-1].seq + 1
    rest = parse_forward(run_id, body[offset:], base=base + offset, seq=length, version=None, keep=False)
    full_end = base + sum(len(line) + 1 for line in lines[: full + 1])
    return Parsed([], base + offset, length, rest.version, lines[idx], last, lines[full], full_end)


# --------------------------------------------------------------------------------------------------
# Inbox lines


def parse_inbox(
    run_id: str, data: bytes, base: int, count: int, *, strict: bool
) -> tuple[list[int], dict[str, int], int] | None:
    """The start offsets and item ids of the complete inbox lines in ``data`` (file offset ``base``).

    Items must be numbered ``count``, ``count + 1``, ...; when they are not, returns None (``strict``
    False: the caller re-reads from the start) or raises.

    Returns:
        (offsets, item ids → inbox_seq, the offset after the last complete line).

    Raises:
        CorruptJournalError: a complete line is not an item, or (``strict``) items are misnumbered.
    """
    offsets: list[int] = []
    ids: dict[str, int] = {}
    pos = 0
    for line in data.split(b"\n")[:-1]:
        try:
            obj = orjson.loads(line)
            seq, item_id = obj["inbox_seq"], obj["item_id"]
        except (orjson.JSONDecodeError, TypeError, KeyError):
            raise _corrupt(run_id, None, f"inbox item {count} is not valid") from None
        if seq != count:
            if not strict:
                return None
            raise _corrupt(run_id, None, f"inbox item {count} is numbered {seq}")
        offsets.append(base + pos)
        ids[str(item_id)] = count
        count += 1
        pos += len(line) + 1
    return offsets, ids, base + pos


# --------------------------------------------------------------------------------------------------
# Cached tail state


@dataclass(slots=True)
class JTail:
    """A journal's cached tail state, valid while (dev, ino, size, mtime) match ``fstat``.

    Attributes:
        end: the offset after the last complete append; ``size > end`` means a torn append follows.
        length: the entries up to ``end``.
        version: the journal's format version, when its ``run_started`` was read.
        info_line: the last complete append's listing line.
        last: the last complete append's entries (for retried appends).
        full_line: the last full listing line, and ``full_end`` the offset after it (``_info.py``).
    """

    dev: int
    ino: int
    size: int
    mtime: int
    end: int
    length: int
    version: int | None
    info_line: bytes
    last: list[j.Entry]
    full_line: bytes = b""
    full_end: int = 0

    @classmethod
    def of(cls, st: os.stat_result, p: Parsed) -> JTail:
        """The tail state of a file whose fstat is ``st`` and whose bytes gave ``p``."""
        return cls(
            st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, p.end, p.length, p.version, p.info_line, p.last,
            p.full_line, p.full_end,
        )  # fmt: skip


def tail_record(tail: JTail) -> dict[str, Any]:
    """The whole listing record of the journal's last complete append.

    Raises:
        ValueError, KeyError, TypeError: no complete append, or a damaged listing line.
    """
    return record(tail.info_line, tail.full_line, tail.last, tail.length)


@dataclass(slots=True)
class ITail:
    """An inbox's cached state: each complete line's offset and the item ids."""

    dev: int
    ino: int
    size: int
    mtime: int
    end: int
    offsets: list[int]
    ids: dict[str, int]


def same(cached: JTail | ITail | None, st: os.stat_result) -> bool:
    """Whether the file is unchanged since ``cached`` was taken."""
    return cached is not None and (cached.dev, cached.ino, cached.size, cached.mtime) == (
        st.st_dev,
        st.st_ino,
        st.st_size,
        st.st_mtime_ns,
    )


def anchored(fd: int, cached: JTail, st: os.stat_result) -> bool:
    """Whether the file only grew since ``cached``: same inode, and the cached listing line still ends at ``end``."""
    if (cached.dev, cached.ino) != (st.st_dev, st.st_ino) or st.st_size < cached.end or not cached.info_line:
        return False
    anchor = cached.info_line + b"\n"
    return pread_all(fd, len(anchor), cached.end - len(anchor)) == anchor


def refresh_journal(run_id: str, fd: int, st: os.stat_result, cached: JTail | None) -> JTail:
    """The journal's tail state; the caller holds a flock on ``fd`` and ``st`` is its fstat.

    Unchanged: the cache. Grown a little: the new lines are parsed. Otherwise: one tail block is read.
    """
    if cached is not None and same(cached, st):
        return cached
    if cached is not None and anchored(fd, cached, st) and st.st_size - cached.end <= RESCAN_OVER:
        data = pread_all(fd, st.st_size - cached.end, cached.end)
        p = parse_forward(
            run_id, data, base=cached.end, seq=cached.length, version=cached.version, keep=False
        )
        if not p.info_line:
            p.info_line, p.last = cached.info_line, cached.last
        if not p.full_line:
            p.full_line, p.full_end = cached.full_line, cached.full_end
    else:
        p = scan_tail(run_id, fd, st.st_size)
    return JTail.of(st, p)


def refresh_inbox(run_id: str, fd: int, st: os.stat_result, cached: ITail | None) -> ITail:
    """The inbox's state (``cached`` updated in place when the file only grew); the caller holds a flock."""
    if cached is not None and same(cached, st):
        return cached
    if cached is not None and (cached.dev, cached.ino) == (st.st_dev, st.st_ino) and st.st_size >= cached.end:
        data = pread_all(fd, st.st_size - cached.end, cached.end)
        found = parse_inbox(run_id, data, cached.end, len(cached.offsets), strict=False)
        if found is not None:
            cached.offsets.extend(found[0])
            cached.ids.update(found[1])
            cached.end, cached.size, cached.mtime = found[2], st.st_size, st.st_mtime_ns
            return cached
    found = parse_inbox(run_id, pread_all(fd, st.st_size, 0), 0, 0, strict=True)
    assert found is not None
    return ITail(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, found[2], found[0], found[1])


def stored_range(run_id: str, fd: int, tail: JTail, first: int, end: int) -> list[Stored]:
    """The stored entries ``first <= seq < end`` of a retried append; the caller holds the journal's flock.

    From the cached last append when it holds them all, else from one parse of the journal up to
    ``tail.end`` (a retry of an older append: rare, and never on the path of a new append).
    """
    last = tail.last
    if last and last[0].seq <= first and end <= last[-1].seq + 1:
        found = last[first - last[0].seq : end - last[0].seq]
    else:
        data = pread_all(fd, tail.end, 0)
        found = parse_forward(run_id, data, base=0, seq=0, version=None, keep=True).entries[first:end]
    return [stored_entry(entry) for entry in found]


@contextlib.contextmanager
def lines_named(jpath: str) -> Iterator[None]:
    """A CorruptJournalError about one line names that line of ``jpath`` (``named``)."""
    try:
        yield
    except CorruptJournalError as exc:
        raise named(exc, jpath) from None
