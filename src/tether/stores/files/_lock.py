"""FileStore's low-level helpers: private files, flock leases, byte I/O and writing appends.

Nothing here knows about a store: these functions see one file (or its bytes) at a time. Reading a
file's tail is ``_tail``'s job.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import orjson

from ... import journal as j
from ...errors import RunNotFoundError
from .. import _failpoints as fp
from .._planner import check_batch

if TYPE_CHECKING:
    from .._records import Owner

__all__ = [
    "UndoFailed",
    "append_bytes",
    "as_int",
    "check_batch",
    "cut_torn",
    "failpoints_before",
    "fsync_dir",
    "inbox_count",
    "inode_of",
    "last_line",
    "link_new",
    "lock_content",
    "locked",
    "names",
    "open_private",
    "open_run_file",
    "pread_all",
    "probe",
    "pwrite_all",
    "read_lock",
    "safe_name",
    "same_file",
    "take_lock",
    "write_at",
    "write_lock",
]

LOCK_WAIT = 0.05
"""How long a take retries a busy ``<id>.lock`` (DURABILITY 1.2)."""

BLOCK = 4096
"""The first tail block read from the end of a file."""


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
    n = os.pwrite(fd, data, offset)
    if n == len(data):
        return  # the usual case: all of it at once
    if n <= 0:
        raise OSError(5, "short write")
    view = memoryview(data)[n:]
    offset += n
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
    return names(path, inode_of(fd))


def inode_of(fd: int) -> tuple[int, int]:
    """The ``(st_dev, st_ino)`` of the file open on ``fd`` (it never changes while the fd is open)."""
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def names(path: str, inode: tuple[int, int]) -> bool:
    """Whether ``path`` names the file ``inode`` (``inode_of`` its fd): one ``stat``."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    return (st.st_dev, st.st_ino) == inode


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
    """Replace a held lock file's content and fsync it (written first, then cut: a crash leaves line 1).

    The content also names the file's own inode (``inode``: device and number), so a taker can tell a
    file a holder wrote from one that replaced it (``_holders``).
    """
    st = os.fstat(fd)
    data = orjson.dumps({**content, "inode": [st.st_dev, st.st_ino]}) + b"\n"
    pwrite_all(fd, data, 0)
    os.ftruncate(fd, len(data))
    os.fsync(fd)


# --------------------------------------------------------------------------------------------------
# Writing


def as_int(value: object, default: int = 0) -> int:
    """``value`` if it is an int (not a bool), else ``default``."""
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def append_bytes(lines: Sequence[bytes], info_line: bytes) -> bytes:
    """One append's bytes: its entry lines, then its listing line, each ending with a newline."""
    return b"\n".join([*lines, info_line]) + b"\n"


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


def lock_content(owner: Owner, token: int) -> dict[str, Any]:
    """What ``<id>.lock`` says of its holder: pid, host, since, writer and the lease token."""
    host = owner.host or socket.gethostname()
    return {"pid": owner.pid, "host": host, "since": owner.since, "writer": owner.writer, "token": token}


def open_run_file(run_id: str, path: str, flags: int) -> int:
    """Open one of a run's files (never created here: a missing file is no such run).

    Raises:
        RunNotFoundError: the file does not exist.
    """
    try:
        return os.open(path, flags | os.O_CLOEXEC)
    except FileNotFoundError:
        raise RunNotFoundError(run_id) from None


@contextlib.contextmanager
def locked(run_id: str, path: str, flags: int, how: int) -> Iterator[int]:
    """Open a run's file (RunNotFoundError if missing) and hold ``flock(how)`` on it; closed after."""
    fd = open_run_file(run_id, path, flags)
    try:
        fcntl.flock(fd, how)
        yield fd
    finally:
        os.close(fd)
