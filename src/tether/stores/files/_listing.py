"""Listing and removing the runs of a FileStore folder (see ``tether.stores.files``).

``FileCatalog`` reads each run's listing record from its journal's tail block, and deletes runs (a tree's
root first) under their locks; a ``FileStore`` makes one and delegates ``list``, ``delete`` and ``prune`` to it.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import fcntl
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Protocol

from ... import journal as j
from ...errors import NewerFormatError, RunBusyError, RunNotFoundError
from .._listing import ListQuery
from ..base import (
    Owner,
    RunInfo,
    as_cutoff,
    busy_error,
    check_prune_statuses,
    plan_delete,
    plan_prune,
)
from . import _lock as fl
from . import _tail as ft

if TYPE_CHECKING:
    from ._tails import TailCache

__all__ = ["STRIPES", "FileCatalog", "Held", "owner_in"]

STRIPES = 64  # per-run thread locks, striped by run id


@dataclass(slots=True)
class Held:
    """A run this store object holds: its lock file's fd, the token, the owner, and the lock file's
    ``(st_dev, st_ino)`` (``_lock.inode_of(fd)``, checked against ``<id>.lock`` before each append)."""

    fd: int
    token: int
    owner: Owner
    inode: tuple[int, int]


def _metadata(raw: object) -> dict[str, str]:
    """A listing line's metadata (a damaged one lists as none)."""
    if not isinstance(raw, dict):
        return {}
    return {str(k): v for k, v in raw.items() if isinstance(v, str)}


def owner_in(lpath: str) -> Owner | None:
    content = fl.read_lock(lpath)
    return Owner.from_dict(content) if content.get("pid") else None


class _StoreFiles(Protocol):
    """The members of a ``FileStore`` its catalog reads (``store.py`` imports this module, not the reverse)."""

    path: str
    _held: dict[str, Held]
    _jlocks: builtins.list[threading.RLock]
    _ilocks: builtins.list[threading.RLock]
    _tails: TailCache

    def _paths(self, run_id: str) -> tuple[str, str, str]: ...
    def _hidden_holder(self, run_id: str, fd: int, jpath: str, lpath: str) -> RunBusyError | None: ...
    def holder(self, run_id: str) -> Owner | None: ...


class FileCatalog:
    """A FileStore's listing and removal: ``list``, ``delete``, ``prune`` and the reads they make.

    It owns no state: it reads and locks runs through the ``FileStore`` it was made for (its folder, its
    per-run thread locks, tail caches and held leases), which delegates those three methods to it.
    """

    def __init__(self, store: _StoreFiles) -> None:
        self._store = store

    def list(
        self,
        *,
        status: str | None = None,
        agent: str | None = None,
        parent_id: str | None = None,
        root_id: str | None = None,
        updated_before: datetime | str | None = None,
        updated_after: datetime | str | None = None,
        limit: int = 100,
        cursor: str | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> builtins.list[RunInfo]:
        query = ListQuery.of(
            status=status,
            agent=agent,
            parent_id=parent_id,
            root_id=root_id,
            updated_before=updated_before,
            updated_after=updated_after,
            cursor=cursor,
            metadata=metadata,
        )
        return query.select(self.scan(), limit)

    def scan(self) -> builtins.list[RunInfo]:
        """Every run's listing record (one tail block per journal), in no order."""
        if not os.path.isdir(self._store.path):
            if os.path.exists(self._store.path):
                raise ValueError(
                    f"store folder {self._store.path} is a file. Fix: point the store at a folder"
                )
            return []  # looking at a store never creates it
        with os.scandir(self._store.path) as it:
            names = [e.name for e in it]
        infos: builtins.list[RunInfo] = []
        for name in names:
            if name.startswith(".") or not name.endswith(".jsonl") or name.endswith(".inbox.jsonl"):
                continue
            run_id = name[: -len(".jsonl")]
            try:
                j.validate_run_id(run_id)
            except ValueError:
                continue
            info = self._list_one(run_id)
            if info is not None:
                infos.append(info)
        return infos

    def _list_one(self, run_id: str) -> RunInfo | None:
        jpath, ipath, _ = self._store._paths(run_id)
        try:
            tail = self._store._tails.journal(run_id, jpath)
            record = ft.tail_record(tail)  # no complete append at all: damaged
        except RunNotFoundError:
            return None  # deleted meanwhile
        except NewerFormatError:
            return RunInfo(run_id, None, "newer format", None, None, None, 0, None, None, None, None)
        except (OSError, ValueError, KeyError, TypeError):
            return RunInfo(run_id, None, "damaged", None, None, None, 0, None, None, None, None)
        try:
            owner = self._store.holder(run_id)
        except (OSError, RunNotFoundError):
            owner = None
        return RunInfo(
            id=run_id,
            agent=record.get("agent"),
            status=str(record.get("status") or "running"),
            first_message=record.get("first_message"),
            created_at=record.get("created_at"),
            updated_at=record.get("updated_at"),
            turn=fl.as_int(record.get("turn")),
            parent_id=record.get("parent_id"),
            root_id=record.get("root_id"),
            lease_owner=f"{owner.host}:{owner.pid}" if owner else None,
            lease_expires_at=None,
            length=tail.length,
            inbox_len=fl.inbox_count(ipath),
            inbox_consumed=fl.as_int(record.get("inbox_consumed"), -1),
            metadata=_metadata(record.get("metadata")),
        )

    def delete(self, run_id: str, *, children: bool = False) -> None:
        jpath, _, _ = self._store._paths(run_id)
        if not os.path.lexists(jpath):
            raise RunNotFoundError(run_id)
        ids = plan_delete(self.scan(), run_id, children)
        self._remove(ids, None)

    def prune(
        self,
        older_than: datetime | timedelta | str,
        *,
        statuses: Sequence[str] = j.STOP_STATUSES,
        children: bool = False,
        dry_run: bool = False,
    ) -> builtins.list[str]:
        wanted = check_prune_statuses(statuses)
        cutoff = as_cutoff(older_than)
        trees = plan_prune(self.scan(), cutoff, wanted, children)
        if dry_run:
            return [run_id for tree in trees for run_id in tree]
        out: builtins.list[str] = []
        for tree in trees:

            def still(fresh: builtins.list[RunInfo], tree: builtins.list[str] = tree) -> bool:
                return plan_prune(fresh, cutoff, wanted, children) == [tree]

            if self._remove(tree, still):
                out.extend(tree)
        return out

    @contextlib.contextmanager
    def _stripes(self, run_ids: Iterable[str]) -> Iterator[None]:
        """Hold the thread locks of several runs: every journal stripe, then every inbox stripe, in order."""
        indexes = sorted({hash(run_id) % STRIPES for run_id in run_ids})
        with contextlib.ExitStack() as stack:
            for index in indexes:
                stack.enter_context(self._store._jlocks[index])
            for index in indexes:
                stack.enter_context(self._store._ilocks[index])
            yield

    def _remove(
        self, run_ids: builtins.list[str], still: Callable[[builtins.list[RunInfo]], bool] | None
    ) -> bool:
        """Delete runs (a root first, then its subagent runs) under their locks; whether they were deleted.

        Every ``<id>.lock`` is taken first, then every inbox's ``LOCK_EX`` (no post lands meanwhile). With
        ``still`` (prune), a run that is busy, gone or no longer passes ``still`` keeps the whole group and
        False is returned; without it (delete), a busy run raises RunBusyError and a missing one
        RunNotFoundError. Journals go before inboxes, and each lock file goes only under its own lock.
        """
        paths = {run_id: self._store._paths(run_id) for run_id in run_ids}
        locks: dict[str, int] = {}
        inboxes: builtins.list[int] = []
        with self._stripes(run_ids):
            try:
                for run_id in run_ids:
                    jpath, _, lpath = paths[run_id]
                    held = self._store._held.get(run_id)
                    fd = None if held is not None or not os.path.lexists(jpath) else fl.take_lock(lpath)
                    if fd is not None and not os.path.lexists(jpath):  # deleted meanwhile
                        os.unlink(lpath)
                        os.close(fd)
                        fd = None
                    hidden = self._store._hidden_holder(run_id, fd, jpath, lpath) if fd is not None else None
                    if fd is not None and hidden is not None:  # its lock file was replaced under a holder
                        os.close(fd)
                        if still is not None:
                            return False
                        raise hidden
                    if fd is not None:
                        locks[run_id] = fd
                    else:
                        if still is not None:
                            return False
                        if not os.path.lexists(jpath):
                            raise RunNotFoundError(run_id)
                        raise busy_error(run_id, held.owner if held is not None else owner_in(lpath))
                for run_id in run_ids:
                    try:
                        ifd = fl.open_run_file(run_id, paths[run_id][1], os.O_RDWR)
                    except RunNotFoundError:
                        continue  # no inbox (removed by hand): the journal goes anyway
                    inboxes.append(ifd)
                    fcntl.flock(ifd, fcntl.LOCK_EX)
                if still is not None and not still(self.fresh(run_ids)):
                    return False
                for run_id in run_ids:  # the root first: a crash part-way leaves orphans, never a bare root
                    jpath, ipath, lpath = paths[run_id]
                    os.unlink(jpath)
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(ipath)
                    os.unlink(lpath)  # only ever under its own lock (DURABILITY 4)
                fl.fsync_dir(self._store.path)
                return True
            finally:
                for fd in [*inboxes, *locks.values()]:
                    os.close(fd)
                for run_id in run_ids:
                    self._store._tails.journals.pop(run_id, None)
                    self._store._tails.inboxes.pop(run_id, None)

    def fresh(self, run_ids: Iterable[str]) -> builtins.list[RunInfo]:
        """The runs' listing records read now, as if no one held them (the caller holds them)."""
        out = []
        for run_id in run_ids:
            info = self._list_one(run_id)
            if info is not None:
                out.append(dataclasses.replace(info, lease_owner=None, lease_expires_at=None))
        return out
