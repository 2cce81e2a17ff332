"""FileStore's low-level helpers: private files, flock leases, byte I/O and parsing journal lines.

Nothing here knows about a store: these functions see one file (or its bytes) at a time. The journal
format they parse is described in ``files.py``.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from .. import _failpoints as fp
from .. import journal as j
from ..errors import CorruptJournalError

__all__ = [
    "INFO_PREFIX",
    "ITail",
    "JTail",
    "Parsed",
    "UndoFailed",
    "anchored",
    "as_int",
    "check_batch",
    "cut_torn",
    "encode_append",
    "failpoints_before",
    "fsync_dir",
    "inbox_count",
    "last_line",
    "link_new",
    "open_private",
    "parse_forward",
    "pread_all",
    "probe",
    "pwrite_all",
    "read_lock",
    "refresh_inbox",
    "refresh_journal",
    "safe_name",
    "same",
    "same_file",
    "scan_tail",
    "take_lock",
    "write_at",
    "write_lock",
]

INFO_PREFIX = b'{"info"'
"""How a journal's listing line begins (an entry line begins with ``{"kind"``)."""

LOCK_WAIT = 0.05
"""How long a take retries a busy ``<id>.lock`` (DURABILITY 1.2)."""

BLOCK = 4096
"""The first tail block read from the end of a file."""

RESCAN_OVER = 1 << 16
"""Past this many new bytes, a cached tail is rebuilt from the last block rather than every new line."""


# --------------------------------------------------------------------------------------------------
# Files and bytes


def open_private(path: str, flags: int) -> int:
    """Open ``path`` with ``O_CLOEXEC``; a file it creates is 0600 whatever the umask.

    Raises:
        OSError: as ``os.open`` does.
    """
    fd = os.open(path, flags | os.O_CLOEXEC, 0o600)
    if flags & os.O_CREAT:
        try:
            os.fchmod(fd, 0o600)
        except OSError:  # another user's file: leave its mode alone
            pass
    return fd


def fsync_dir(path: str) -> None:
    """Make the folder's entries (created, linked, unlinked files) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def pread_all(fd: int, size: int, offset: int) -> bytes:
    """Read ``size`` bytes at ``offset`` (fewer only at the end of the file)."""
    chunks: list[bytes] = []
    while size > 0:
        chunk = os.pread(fd, size, offset)
        if not chunk:
            break
        chunks.append(chunk)
        size -= len(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def pwrite_all(fd: int, data: bytes, offset: int) -> None:
    """Write all of ``data`` at ``offset``.

    Raises:
        OSError: the write failed (possibly after part of it was written).
    """
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        if n <= 0:
            raise OSError(5, "short write")
        view = view[n:]
        offset += n


def last_line(fd: int, size: int) -> bytes | None:
    """The last newline-terminated line of the file's first ``size`` bytes, reading only its tail."""
    block = BLOCK
    while True:
        start = max(0, size - block)
        data = pread_all(fd, size - start, start)
        end = data.rfind(b"\n")
        if end >= 0:
            begin = data.rfind(b"\n", 0, end)
            if begin >= 0 or start == 0:
                return data[begin + 1 : end]
        elif start == 0:
            return None
        block *= 4


# --------------------------------------------------------------------------------------------------
# Locks


def same_file(fd: int, path: str) -> bool:
    """Whether ``path`` still names the file open on ``fd`` (it was not deleted or replaced)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    fst = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (fst.st_dev, fst.st_ino)


def take_lock(path: str, wait: float = LOCK_WAIT) -> int | None:
    """Open ``path`` (created 0600) and take an exclusive ``flock`` on it; None if still busy after ``wait``.

    After locking, the inode is checked against the path: a lock file deleted or replaced meanwhile is
    dropped and the new one taken.
    """
    deadline = time.monotonic() + wait
    while True:
        fd = open_private(path, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.002)
            continue
        except BaseException:
            os.close(fd)
            raise
        if same_file(fd, path):
            return fd
        os.close(fd)


def probe(path: str) -> bool:
    """Whether someone holds the lock file, asked with ``LOCK_SH|LOCK_NB`` (a take retries past it)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def read_lock(fd_or_path: int | str) -> dict[str, Any]:
    """The JSON a holder wrote into a lock file (its first line), or ``{}``."""
    try:
        if isinstance(fd_or_path, int):
            data = pread_all(fd_or_path, BLOCK, 0)
        else:
            fd = os.open(fd_or_path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                data = pread_all(fd, BLOCK, 0)
            finally:
                os.close(fd)
        obj = orjson.loads(data.split(b"\n", 1)[0])
    except (OSError, orjson.JSONDecodeError):
        return {}
    return obj if isinstance(obj, dict) else {}


def write_lock(fd: int, content: dict[str, Any]) -> None:
    """Replace a held lock file's content and fsync it (written first, then cut: a crash leaves line 1)."""
    data = orjson.dumps(content) + b"\n"
    pwrite_all(fd, data, 0)
    os.ftruncate(fd, len(data))
    os.fsync(fd)


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
    """

    entries: list[j.Entry]
    end: int
    length: int
    version: int | None
    info_line: bytes = b""
    last: list[j.Entry] = field(default_factory=list)


def _corrupt(run_id: str, seq: int | None, problem: str) -> CorruptJournalError:
    return CorruptJournalError(run_id, seq, problem)


def _load_line(run_id: str, line: bytes, seq: int | None) -> dict[str, Any]:
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError:
        raise _corrupt(run_id, seq, "its line is not valid JSON") from None
    if not isinstance(obj, dict):
        raise _corrupt(run_id, seq, "its line is not a JSON object")
    return obj


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
    expect: int | None = None  # None: an append begins; -1: its listing line is due; k: the next b
    pos = 0
    for line in data.split(b"\n")[:-1]:
        pos += len(line) + 1
        if line.startswith(INFO_PREFIX):
            if expect != -1:
                raise _corrupt(run_id, seq, "a listing line is out of place before this entry")
            if keep:
                entries.extend(pending)
            out.last, pending = pending, []
            out.end, out.length, out.info_line = base + pos, seq, line
            expect = None
            continue
        if expect == -1:
            raise _corrupt(run_id, seq, "the append before this entry has no listing line")
        obj = _load_line(run_id, line, seq)
        b = obj.get("b")
        if not isinstance(b, int) or b < 0 or (expect is not None and b != expect):
            raise _corrupt(
                run_id, seq, f"its line breaks the append's countdown (b={b!r}, expected {expect})"
            )
        entry = j.decode_entry(obj, run_id, journal_version=version or j.FORMAT_VERSION)
        if entry.seq != seq:
            raise _corrupt(run_id, entry.seq, f"expected seq {seq} here")
        if isinstance(entry, j.RunStarted):
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
            idx = next((i for i in range(len(lines) - 1, -1, -1) if lines[i].startswith(INFO_PREFIX)), -1)
            if idx >= 1 and not lines[idx - 1].startswith(INFO_PREFIX):
                return _tail_from(run_id, data[cut + 1 :], lines, idx, base)
        block *= 4


def _tail_from(run_id: str, body: bytes, lines: list[bytes], idx: int, base: int) -> Parsed:
    last: list[j.Entry] = []
    for distance, line in enumerate(reversed(lines[:idx])):
        if line.startswith(INFO_PREFIX):
            break
        obj = _load_line(run_id, line, None)
        if obj.get("b") != distance:
            raise _corrupt(run_id, obj.get("seq"), "its line breaks the append's countdown")
        last.append(j.decode_entry(obj, run_id))
    last.reverse()
    for before, after in itertools.pairwise(last):
        if after.seq != before.seq + 1:
            raise _corrupt(run_id, after.seq, f"expected seq {before.seq + 1} here")
    offset = sum(len(line) + 1 for line in lines[: idx + 1])
    length = last[-1].seq + 1
    rest = parse_forward(run_id, body[offset:], base=base + offset, seq=length, version=None, keep=False)
    return Parsed([], base + offset, length, rest.version, lines[idx], last)


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

    @classmethod
    def of(cls, st: os.stat_result, p: Parsed) -> JTail:
        """The tail state of a file whose fstat is ``st`` and whose bytes gave ``p``."""
        return cls(
            st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, p.end, p.length, p.version, p.info_line, p.last
        )


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


# --------------------------------------------------------------------------------------------------
# Writing


def as_int(value: object, default: int = 0) -> int:
    """``value`` if it is an int (not a bool), else ``default``."""
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def check_batch(run_id: str, entries: Sequence[j.Entry], first_seq: int) -> None:
    """Refuse what is not one sealed batch numbered from ``first_seq`` (readers would call it corrupt).

    Raises:
        ValueError: no entries, a seq out of order, a countdown ``b`` that does not end at 0, or no ``w``/``h``.
    """
    if not entries:
        raise ValueError(f"run {run_id}: nothing to write. Fix: pass at least one entry")
    last = len(entries) - 1
    for i, entry in enumerate(entries):
        if entry.seq != first_seq + i or entry.b != last - i or not entry.h or not entry.w:
            raise ValueError(
                f"run {run_id}: entry {i} (seq {entry.seq}, b {entry.b}) is not part of one sealed batch from "
                f"seq {first_seq}. Fix: write what State.next_batch() returns"
            )


def encode_append(
    entries: Sequence[j.Entry], info: dict[str, Any], length: int, token: int | None
) -> tuple[bytes, bytes]:
    """One append's bytes (its entry lines, then its listing line) and the listing line alone.

    Raises:
        TypeError: ``info`` cannot be written as JSON.
    """
    info_line = orjson.dumps({"info": {**info, "length": length, "token": token}})
    return b"".join([j.encode_entry(e) + b"\n" for e in entries]) + info_line + b"\n", info_line


class UndoFailed(OSError):
    """A failed write could not be undone: the file may hold part of it."""


def write_at(fd: int, data: bytes, end: int) -> None:
    """Write ``data`` at ``end`` and ``fdatasync``; on failure cut the file back to ``end``, fsync, re-raise.

    Raises:
        OSError: the write failed and the file is as it was.
        UndoFailed: the write failed and cutting it back failed too (``__cause__`` is the first error).
    """
    try:
        pwrite_all(fd, data, end)
        os.fdatasync(fd)
    except OSError as exc:
        try:
            os.ftruncate(fd, end)
            os.fsync(fd)
        except OSError:
            raise UndoFailed(exc.errno, f"a failed write ({exc}) could not be undone") from exc
        raise


def cut_torn(fd: int, end: int, size: int) -> None:
    """Cut a torn tail (bytes past ``end``, the end of the last complete write) and sync, if there is one."""
    if size != end:
        os.ftruncate(fd, end)
        os.fsync(fd)


def link_new(tmp: str, path: str, data: bytes, folder: str) -> os.stat_result:
    """Create ``path`` holding ``data`` all or nothing: write ``tmp`` (``O_EXCL``), sync, link, sync the folder.

    Returns:
        The new file's fstat.

    Raises:
        FileExistsError: ``path`` exists (nothing was changed but a removed ``tmp``).
    """
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)  # a leftover of a crashed create by the same writer (the caller holds the lock)
    try:
        fd = open_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        try:
            pwrite_all(fd, data, 0)
            os.fsync(fd)
            st = os.fstat(fd)
        finally:
            os.close(fd)
        os.link(tmp, path)
        fsync_dir(folder)
        return st
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def inbox_count(path: str) -> int:
    """An inbox's length from its last line alone (one tail block), for listings; 0 if unreadable."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            line = last_line(fd, os.fstat(fd).st_size)
        finally:
            os.close(fd)
        return as_int(orjson.loads(line).get("inbox_seq"), -1) + 1 if line else 0
    except (OSError, ValueError, AttributeError):
        return 0


def safe_name(text: str) -> bool:
    """Whether ``text`` can go into a file name as it is."""
    return 0 < len(text) <= 64 and all(c.isascii() and (c.isalnum() or c in "_-") for c in text)


def failpoints_before(fd: int, data: bytes, end: int, new: list[j.Entry]) -> None:
    """``before_append`` dies before writing; ``torn_append`` writes about half the append (cut mid-line)."""
    if fp.hits("before_append", new):
        fp.die()
    if fp.hits("torn_append", new):
        cut = max(1, len(data) // 2)
        while cut > 1 and data[cut - 1] == 0x0A:  # end inside a line, never just after one
            cut -= 1
        pwrite_all(fd, data[:cut], end)
        os.fdatasync(fd)
        fp.die()
