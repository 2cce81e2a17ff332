"""FileStore: runs as files in one folder (DESIGN 8.2, DURABILITY 4 and 5).

Each run has three files, all 0600 in a 0700 folder:

- ``<id>.jsonl``, the journal. Each append is its entry lines (``encode_entry(entry)`` + ``\\n``, each
  carrying ``b``, the count of entry lines still to come in its append, so the last has ``b == 0``) followed
  by one listing line ``{"info": {...the writer's info..., "length": N, "token": T}}``. An append is complete
  when its last entry line has ``b == 0`` and its listing line follows; bytes after the last complete append
  are torn: readers ignore them and the next appender cuts them off (never below a complete append). A
  newline-terminated line that fails to decode or its checksum, or that breaks the countdown, is corruption.
- ``<id>.inbox.jsonl``, the inbox: one JSON line per item (``InboxItem.to_dict()``), numbered by line.
- ``<id>.lock``, the lease: an exclusive ``flock`` held by the driving store object, with the holder's pid,
  host, since, writer and token written in it (the token also goes into every listing line), and the file's
  own inode. A take of a lock file that does not name its own inode (deleted and re-created, or replaced
  from outside) first looks for a live holder of the old one, and the holder locks a new file when it finds
  its own gone (``_holders``, DURABILITY 4). A holder keeps the journal open from its take to its release.

Appends and posts hold ``flock(LOCK_EX)`` on their file for check, write and sync; readers hold
``LOCK_SH`` only while copying bytes. Tail state (size, length, last append) is cached per run and checked
with ``fstat``, so an append, ``length`` or ``inbox_length`` never re-reads history. ``list()`` reads one
tail block per journal; a run whose journal is damaged is listed with status ``damaged`` (``newer format``
for a journal from a newer tether) rather than breaking the listing. ``claim_next`` and ``prune`` decide from
that listing, read without locks, then check each run again once its ``<id>.lock`` is held (and, for
``prune``, its inbox's ``LOCK_EX``); ``delete`` and ``prune`` remove a tree's runs root first.

Failpoints (``TETHER_FAILPOINT``, crash tests only): ``before_append`` kills the process before an append
writes; ``torn_append`` writes about half of the append's bytes (cut inside a line), syncs and kills;
``after_append`` kills right after the append is durable.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import fcntl
import functools
import os
import threading
import uuid
import weakref
from collections.abc import Collection, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import orjson

from ... import journal as j
from ...errors import (
    CorruptJournalError,
    RunBusyError,
    RunNotFoundError,
    StoreBrokenError,
    StoreFullError,
    TetherError,
)
from ...inbox import InboxItem, make_item
from .. import _failpoints as fp
from .._planner import plan_append
from .._records import full_error, lease_lost_error, no_room
from ..base import (
    Lease,
    Owner,
    RunInfo,
    Store,
    busy_error,
    plan_claim_next,
)
from . import _holders as fh
from . import _lock as fl
from . import _tail as ft
from ._info import listing_line
from ._listing import STRIPES, FileCatalog, Held, owner_in
from ._tails import TailCache

__all__ = ["FileStore"]

_STORES: weakref.WeakValueDictionary[int, FileStore] = weakref.WeakValueDictionary()
_BROKEN: set[tuple[int, int]] = set()  # (dev, ino) of journals where a failed write could not be undone


@functools.lru_cache(maxsize=1024)
def _paths_in(folder: str, run_id: str) -> tuple[str, str, str]:
    """The journal, inbox and lock paths of a valid run id in ``folder`` (a run's steps ask for them often)."""
    j.validate_run_id(run_id)
    stem = os.path.join(folder, run_id)
    return stem + ".jsonl", stem + ".inbox.jsonl", stem + ".lock"


def _after_fork_in_child() -> None:
    for store in list(_STORES.values()):
        store._forget_after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)


class FileStore(Store):
    """Runs in a folder: one journal, one inbox and one lock file per run (see the module docstring).

    Args:
        path: the folder; created (0700) on first use.

    Leases are ``flock`` locks the kernel drops when the holder dies, so there is no ttl. Two FileStore
    objects on one folder exclude each other, in one process or several. A folder shared between
    machines (NFS) is not supported.
    """

    ttl: float | None = None
    append_reads_inbox = True  # read under the run's thread lock, after the fence (no trip of its own)

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__()
        self.path = str(Path(os.fspath(path)).expanduser().resolve())
        self._ready = False
        self._reset()
        self._catalog = FileCatalog(self)
        _STORES[id(self)] = self

    def _reset(self) -> None:
        self._jlocks = [threading.RLock() for _ in range(STRIPES)]
        self._ilocks = [threading.RLock() for _ in range(STRIPES)]
        self._held: dict[str, Held] = {}
        self._jfds: dict[str, int] = {}
        self._tails = TailCache(self._jlock)

    def __repr__(self) -> str:
        return f"FileStore({self.path!r})"

    @property
    def identity(self) -> str:
        return "file:" + self.path

    # --------------------------------------------------------------------------------------------
    # Paths, locks, fds

    def _ensure(self) -> None:
        """Make the folder (0700, and chmod 0700 an existing one we own) on first use."""
        if not self._ready:
            if os.path.exists(self.path) and not os.path.isdir(self.path):
                raise ValueError(f"store folder {self.path} is a file. Fix: point the store at a folder")
            try:
                os.makedirs(self.path, mode=0o700, exist_ok=True)
            except OSError as exc:
                raise TetherError(
                    f"cannot create the store folder {self.path} ({exc.strerror or exc}). Fix: pick a folder "
                    "you can write, e.g. file:./runs or file:/abs/path/runs"
                ) from exc
            st = os.stat(self.path)
            if st.st_uid == os.getuid() and st.st_mode & 0o777 != 0o700:
                os.chmod(self.path, 0o700)
            self._ready = True

    def _paths(self, run_id: str) -> tuple[str, str, str]:
        """The journal, inbox and lock paths of a valid run id."""
        if not isinstance(run_id, str):
            j.validate_run_id(run_id)  # its clear error, not the cache's TypeError for a list
        return _paths_in(self.path, run_id)

    def _jlock(self, run_id: str) -> threading.RLock:
        return self._jlocks[hash(run_id) % STRIPES]

    def _ilock(self, run_id: str) -> threading.RLock:
        return self._ilocks[hash(run_id) % STRIPES]

    def _forget_after_fork(self) -> None:
        """In a forked child: close (never unlock) every lease and journal fd, so the child holds nothing."""
        for fd in [h.fd for h in self._held.values()] + list(self._jfds.values()):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._reset()

    def _drop(self, run_id: str) -> None:
        """Stop holding the run: close its journal fd and its lock fd (the kernel drops the flock)."""
        held = self._held.pop(run_id, None)
        self._tails.fulls.pop(run_id, None)
        for fd in (self._jfds.pop(run_id, None), held.fd if held else None):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)

    def _take(self, run_id: str, lpath: str, jpath: str) -> int:
        """Take ``<id>.lock`` (retrying 50 ms) or raise RunBusyError naming its holder.

        A lock file no holder of its inode wrote (deleted and re-created, or replaced) may hide a live
        holder of the old one: the take then fails too when there is one (DURABILITY 4).
        """
        fd = fl.take_lock(lpath)
        if fd is None:
            raise busy_error(run_id, owner_in(lpath))
        error = self._hidden_holder(run_id, fd, jpath, lpath)
        if error is not None:
            os.close(fd)
            raise error
        return fd

    def _hidden_holder(self, run_id: str, fd: int, jpath: str, lpath: str) -> RunBusyError | None:
        """The RunBusyError for a holder the lock file locked on ``fd`` hides (see ``_holders``), or None."""
        if fh.trusted(fd) or not os.path.lexists(jpath):
            return None
        for other in list(_STORES.values()):  # another store object of this process on this folder
            held = other._held.get(run_id) if other is not self and other.path == self.path else None
            if held is not None:
                return busy_error(run_id, held.owner)
        return fh.hidden_holder(run_id, fd, jpath, lambda: self.read(run_id), lpath)

    def _keep_lock(self, run_id: str, lpath: str) -> None:
        """If this object holds the run and its ``<id>.lock`` was deleted or replaced, lock a new one.

        One ``stat`` of ``lpath`` when it is still the file held (the held fd's inode is known).
        """
        held = self._held.get(run_id)
        if held is None or fl.names(lpath, held.inode):
            return
        with self._jlock(run_id):
            held = self._held.get(run_id)
            if held is None:
                return
            new = fh.relock(
                run_id, held.inode, lpath, functools.partial(fl.lock_content, held.owner, held.token)
            )
            if new is not None:
                os.close(held.fd)  # the old inode's flock: no one else can reach that file any more
                held.fd, held.inode = new, fl.inode_of(new)

    # --------------------------------------------------------------------------------------------
    # Create, append, read

    def create(
        self,
        run_id: str,
        entries: Sequence[j.Entry],
        info: dict[str, Any],
        *,
        owner: Owner | None = None,
        ttl: float | None = None,
    ) -> Lease | None:
        jpath, ipath, lpath = self._paths(run_id)
        self._ensure()
        if os.path.lexists(jpath):
            raise _exists(run_id)
        entries = list(entries)
        fl.check_batch(run_id, entries, 0)
        writer = entries[0].w if fl.safe_name(entries[0].w) else uuid.uuid4().hex
        tmp = os.path.join(self.path, f".{run_id}.{writer}.tmp")
        with self._jlock(run_id), self._ilock(run_id):
            fd = fl.take_lock(lpath)
            if fd is None:
                raise _exists(run_id) if os.path.lexists(jpath) else busy_error(run_id, owner_in(lpath))
            kept = linked = False
            try:
                if os.path.lexists(jpath):
                    raise _exists(run_id)
                token = fl.as_int(fl.read_lock(fd).get("token")) + 1 if owner is not None else None
                lines = [j.encode_entry(e, run_id) for e in entries]
                info_line = listing_line(entries, lines, info, len(entries), token, None, 0)
                data = fl.append_bytes(lines, info_line)
                self._tails.journals.pop(run_id, None)
                self._tails.inboxes.pop(run_id, None)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(ipath)  # a leftover of a crashed create or delete
                os.close(fl.open_private(ipath, os.O_WRONLY | os.O_CREAT | os.O_EXCL))
                try:
                    st = fl.link_new(tmp, jpath, data, self.path)
                except FileExistsError:
                    raise _exists(run_id) from None
                linked = True
                version = entries[0].version if isinstance(entries[0], j.RunStarted) else None
                parsed = ft.Parsed(
                    [], len(data), len(entries), version, info_line, entries, info_line, len(data)
                )
                self._tails.journals[run_id] = ft.JTail.of(st, parsed)
                if owner is None or token is None:  # written so that a claim trusts the file (DURABILITY 4)
                    fl.write_lock(fd, {"token": fl.as_int(fl.read_lock(fd).get("token"))})
                    return None
                fl.write_lock(fd, fl.lock_content(owner, token))
                self._jfds[run_id] = fl.open_run_file(run_id, jpath, os.O_RDWR)  # open while held
                self._held[run_id] = Held(fd, token, owner, fl.inode_of(fd))
                kept = True
                return Lease(run_id, token, owner, None)
            except BaseException as exc:
                if not linked:
                    with contextlib.suppress(OSError):
                        os.unlink(ipath)
                if no_room(exc):
                    raise _full(run_id, jpath, exc) from exc
                raise
            finally:
                if not kept:
                    os.close(fd)

    def append(
        self,
        run_id: str,
        entries: Sequence[j.Entry],
        *,
        expected_seq: int,
        writer: str,
        lease_token: int | None,
        info: dict[str, Any],
    ) -> int:
        """See ``Store.append``; returns the inbox's length, read after the fence and before the write."""
        jpath, ipath, lpath = self._paths(run_id)
        with self._jlock(run_id):
            self._keep_lock(run_id, lpath)
            held = self._held.get(run_id)
            if held is None or held.token != lease_token:  # the fence: this store object holds the flock
                if not os.path.lexists(jpath):
                    raise RunNotFoundError(run_id)
                raise lease_lost_error(run_id, lease_token, held.token if held else None)
            inbox_len = self._inbox_length(run_id, ipath)  # DURABILITY 2.3: read before the append
            if not entries:
                return inbox_len  # nothing to write (as plan_append says), and no lock to take for it
            fd = self._jfds.get(run_id)
            if fd is None:
                fd = self._jfds[run_id] = fl.open_run_file(run_id, jpath, os.O_RDWR)
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                self._append_locked(run_id, jpath, fd, list(entries), expected_seq, held.token, info)
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
            return inbox_len

    def _append_locked(
        self,
        run_id: str,
        jpath: str,
        fd: int,
        entries: list[j.Entry],
        expected_seq: int,
        token: int,
        info: dict[str, Any],
    ) -> None:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) in _BROKEN:
            raise StoreBrokenError(
                f"run {run_id}: an earlier write to its journal failed and could not be undone. Fix: stop this "
                "process and resume the run from a new one (its first append repairs the file)"
            )
        try:
            tail = self._tails.journals[run_id] = ft.refresh_journal(
                run_id, fd, st, self._tails.journals.get(run_id)
            )
        except CorruptJournalError as exc:
            raise ft.named(exc, jpath) from None
        n = tail.length
        stored = functools.partial(ft.stored_range, run_id, fd, tail)
        new = plan_append(run_id, entries, expected_seq=expected_seq, stored_length=n, stored=stored)
        if not new:
            return  # a retried append that was stored whole
        end = tail.end
        lines = [j.encode_entry(e, run_id) for e in new]
        last_static = self._tails.last_static(run_id, tail)
        info_line = listing_line(new, lines, info, n + len(new), token, last_static, end - tail.full_end)
        data = fl.append_bytes(lines, info_line)
        try:
            fl.cut_torn(fd, end, st.st_size)  # a torn append goes (never below a complete one) before writing
            if fp.ACTIVE:
                fl.failpoints_before(fd, data, end, new)
            fl.write_at(fd, data, end)  # a failure is settled before the flock goes
        except fl.UndoFailed as exc:
            self._tails.journals.pop(run_id, None)
            _BROKEN.add((st.st_dev, st.st_ino))
            raise StoreBrokenError(
                f"run {run_id}: {exc.strerror}. Fix: stop this process and resume the run from a new one (its "
                "first append repairs the file)"
            ) from exc.__cause__
        except BaseException as exc:
            self._tails.journals.pop(run_id, None)
            if no_room(exc):
                raise _full(run_id, jpath, exc) from exc
            raise
        if fp.ACTIVE and fp.hits("after_append", new):
            fp.die()
        version = new[0].version if isinstance(new[0], j.RunStarted) else tail.version
        after = end + len(data)
        full_line, full_end = tail.full_line, tail.full_end
        if info_line.startswith(ft.INFO_PREFIX):
            full_line, full_end = info_line, after
        st = os.fstat(fd)
        self._tails.journals[run_id] = ft.JTail(
            st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, after, n + len(new), version, info_line, new,
            full_line, full_end,
        )  # fmt: skip

    def read(self, run_id: str, after_seq: int = -1) -> list[j.Entry]:
        jpath, _, _ = self._paths(run_id)
        since = max(after_seq + 1, 0)
        with self._jlock(run_id), fl.locked(run_id, jpath, os.O_RDONLY, fcntl.LOCK_SH) as fd:
            st = os.fstat(fd)  # copy the bytes under LOCK_SH; decode after, holding neither lock
            seen = cached = self._tails.journals.get(run_id)
            if cached is None or cached.version is None or since < cached.length:
                cached = None  # read it all: only a whole pass checks the whole journal
            elif ft.same(cached, st):
                return []
            elif not ft.anchored(fd, cached, st):
                cached = None
            base = cached.end if cached is not None else 0
            data = fl.pread_all(fd, st.st_size - base, base)
        first = cached.length if cached is not None else 0
        version = cached.version if cached is not None else None
        with ft.lines_named(jpath):
            p = ft.parse_forward(run_id, data, base=base, seq=first, version=version, keep=True)
        if cached is not None and not p.info_line:
            p.info_line, p.last = cached.info_line, cached.last
        with self._jlock(run_id):
            if self._tails.journals.get(run_id) is seen:  # not changed by an append meanwhile
                self._tails.journals[run_id] = ft.JTail.of(st, p)
        return p.entries[since - first :]

    def length(self, run_id: str) -> int:
        jpath, _, _ = self._paths(run_id)
        return self._tails.journal(run_id, jpath).length

    # --------------------------------------------------------------------------------------------
    # Inbox

    def post(self, run_id: str, item: dict[str, Any], *, item_id: str | None = None) -> int:
        jpath, ipath, _ = self._paths(run_id)
        item_id = item_id or str(item.get("item_id") or uuid.uuid4().hex)
        with self._ilock(run_id), fl.locked(run_id, ipath, os.O_RDWR, fcntl.LOCK_EX) as fd:
            if os.fstat(fd).st_nlink == 0 or not os.path.lexists(jpath):
                raise RunNotFoundError(run_id)
            tail = self._tails.inbox(run_id, fd)
            if item_id in tail.ids:
                return tail.ids[item_id]
            n = len(tail.offsets)
            line = orjson.dumps(make_item(item, inbox_seq=n, item_id=item_id).to_dict()) + b"\n"
            try:
                fl.cut_torn(fd, tail.end, tail.size)  # a torn line goes first
                fl.write_at(fd, line, tail.end)
            except OSError as exc:
                self._tails.inboxes.pop(run_id, None)
                if no_room(exc):
                    raise _full(run_id, ipath, exc) from exc
                raise
            after = os.fstat(fd)
            tail.offsets.append(tail.end)
            tail.ids[item_id] = n
            tail.end += len(line)
            tail.size, tail.mtime = after.st_size, after.st_mtime_ns
            return n

    def read_inbox(self, run_id: str, after_seq: int = -1) -> list[InboxItem]:
        _, ipath, lpath = self._paths(run_id)
        start = max(after_seq + 1, 0)
        self._keep_lock(run_id, lpath)  # the holder polls: a good time to see its lock file is still there
        with self._ilock(run_id), fl.locked(run_id, ipath, os.O_RDONLY, fcntl.LOCK_SH) as fd:
            tail = self._tails.inbox(run_id, fd)
            if start >= len(tail.offsets):
                return []
            data = fl.pread_all(fd, tail.end - tail.offsets[start], tail.offsets[start])
            fcntl.flock(fd, fcntl.LOCK_UN)  # copied: decode without the lock
            items = [InboxItem.from_dict(orjson.loads(line)) for line in data.split(b"\n")[:-1]]
            os.fsync(fd)  # DURABILITY 2.3: durable before the holder journals what it read
            return items

    def inbox_length(self, run_id: str) -> int:
        _, ipath, lpath = self._paths(run_id)
        self._keep_lock(run_id, lpath)  # the holder polls (before the inbox's lock: the run's comes first)
        return self._inbox_length(run_id, ipath)

    def _inbox_length(self, run_id: str, ipath: str) -> int:
        """The inbox's length: one ``stat`` when it is unchanged since last read."""
        with self._ilock(run_id):
            try:
                st = os.stat(ipath)
            except FileNotFoundError:
                raise RunNotFoundError(run_id) from None
            cached = self._tails.inboxes.get(run_id)
            if cached is not None and ft.same(cached, st):
                return len(cached.offsets)
            with fl.locked(run_id, ipath, os.O_RDONLY, fcntl.LOCK_SH) as fd:
                return len(self._tails.inbox(run_id, fd).offsets)

    # --------------------------------------------------------------------------------------------
    # Leases

    def claim(self, run_id: str, owner: Owner, ttl: float | None = None) -> Lease:
        jpath, _, lpath = self._paths(run_id)
        with self._jlock(run_id):
            if not os.path.lexists(jpath):
                raise RunNotFoundError(run_id)
            held = self._held.get(run_id)
            if held is not None:
                raise busy_error(run_id, held.owner)
            fd = self._take(run_id, lpath, jpath)
            try:
                if not os.path.lexists(jpath):  # deleted meanwhile: leave no lock file behind
                    os.unlink(lpath)
                    raise RunNotFoundError(run_id)
                token = max(fl.as_int(fl.read_lock(fd).get("token")), self._journal_token(run_id, jpath)) + 1
                fl.write_lock(fd, fl.lock_content(owner, token))
                if run_id not in self._jfds:  # open while held: a taker asks /proc who has it open
                    self._jfds[run_id] = fl.open_run_file(run_id, jpath, os.O_RDWR)
            except BaseException:
                os.close(fd)
                raise
            self._held[run_id] = Held(fd, token, owner, fl.inode_of(fd))
            return Lease(run_id, token, owner, None)

    def _journal_token(self, run_id: str, jpath: str) -> int:
        """The token in the journal's last listing line (0 when it cannot be read)."""
        try:
            tail = self._tails.journal(run_id, jpath)
            return fl.as_int(ft.tail_record(tail).get("token")) if tail.info_line else 0
        except (ValueError, KeyError, TypeError, AttributeError):
            return 0

    def claim_next(
        self, owner: Owner, ttl: float | None = None, agents: Collection[str] | None = None
    ) -> Lease | None:
        """Claim the root of a tree that needs work (see ``Store.claim_next``); None when there is none.

        The listing is read without locks, so each claimed root is checked again while held; one that no
        longer needs work is released and the next one tried.
        """
        infos = self._catalog.scan()
        for run_id in plan_claim_next(infos, agents):
            try:
                lease = self.claim(run_id, owner)
            except (RunBusyError, RunNotFoundError):
                continue
            fresh = self._catalog.fresh(
                [run_id, *(i.id for i in infos if i.root_id == run_id and i.id != run_id)]
            )
            if fresh and plan_claim_next(fresh, agents) == [run_id]:
                return lease
            root = fresh[0] if fresh and fresh[0].id == run_id else None
            if root is None or not self.release(lease, at_seq=root.length, inbox_len=root.inbox_len):
                return lease  # it grew meanwhile: it needs work after all
        return None

    def renew(self, lease: Lease) -> Lease:
        held = self._held.get(lease.run_id)
        if held is None or held.token != lease.token:
            raise lease_lost_error(lease.run_id, lease.token, held.token if held else None)
        return lease

    def release(self, lease: Lease, *, at_seq: int, inbox_len: int) -> bool:
        run_id = lease.run_id
        jpath, ipath, _ = self._paths(run_id)
        with self._jlock(run_id), self._ilock(run_id):
            held = self._held.get(run_id)
            if held is None or held.token != lease.token:
                return True  # nothing of ours to release
            with fl.locked(run_id, ipath, os.O_RDWR, fcntl.LOCK_EX) as ifd:
                count = len(self._tails.inbox(run_id, ifd).offsets)
                if self._tails.journal(run_id, jpath).length != at_seq or count != inbox_len:
                    return False
                self._drop(run_id)  # unlock <id>.lock while holding the inbox's LOCK_EX (DURABILITY 2.2)
                return True

    def abandon(self, lease: Lease) -> None:
        try:
            with self._jlock(lease.run_id):
                held = self._held.get(lease.run_id)
                if held is not None and held.token == lease.token:
                    self._drop(lease.run_id)
        except Exception:
            pass

    def holder(self, run_id: str) -> Owner | None:
        jpath, _, lpath = self._paths(run_id)
        held = self._held.get(run_id)
        if held is not None:
            return held.owner
        if not os.path.lexists(jpath):
            raise RunNotFoundError(run_id)
        if not fl.probe(lpath):
            return None
        return Owner.from_dict(fl.read_lock(lpath))

    # --------------------------------------------------------------------------------------------
    # Listing and removal (``_listing.FileCatalog``)

    def list(self, **filters: Any) -> builtins.list[RunInfo]:  # Store.list's keywords
        return self._catalog.list(**filters)

    def delete(self, run_id: str, *, children: bool = False) -> None:
        self._catalog.delete(run_id, children=children)

    def prune(self, older_than: datetime | timedelta | str, **options: Any) -> builtins.list[str]:
        return self._catalog.prune(older_than, **options)  # Store.prune's statuses, children, dry_run

    def close(self) -> None:
        """Give up every run this object holds (closing their locks) and stop its idle I/O threads."""
        for run_id in list(self._held):
            with self._jlock(run_id):
                self._drop(run_id)
        super().close()


# --------------------------------------------------------------------------------------------------
# Helpers


def _full(run_id: str, path: str, exc: BaseException) -> StoreFullError:
    """The StoreFullError of a write to ``path`` that failed with ``ENOSPC`` or ``EDQUOT`` (``exc``)."""
    assert isinstance(exc, OSError)
    return full_error(run_id, path, exc.strerror or str(exc), exc.errno or errno.ENOSPC)


def _exists(run_id: str) -> ValueError:
    return ValueError(f"run {run_id} already exists. Fix: store.load({run_id!r}), or pick another id")
