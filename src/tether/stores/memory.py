"""MemoryStore: runs in a dict, for tests and for runs that need an id and a history but no disk."""

from __future__ import annotations

import builtins
import threading
import time
import uuid
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from .. import journal as j
from ..errors import RunNotFoundError
from ..inbox import InboxItem, make_item
from ._listing import ListQuery
from ._planner import plan_append, stored_in
from ._records import lease_lost_error
from .base import (
    Lease,
    Owner,
    RunInfo,
    Store,
    as_cutoff,
    busy_error,
    check_batch,
    check_prune_statuses,
    plan_claim_next,
    plan_delete,
    plan_prune,
)

__all__ = ["MemoryStore"]


@dataclass(slots=True)
class _Run:
    entries: list[j.Entry]
    info: dict[str, Any]
    inbox: list[InboxItem] = field(default_factory=list)
    item_ids: dict[str, int] = field(default_factory=dict)
    token: int = 0
    owner: Owner | None = None
    expires: float | None = None  # monotonic
    expires_at: float | None = None  # wall clock, as leases and listings show it


class MemoryStore(Store):
    """Keeps runs for the life of the process. It cannot survive the crash it would recover from."""

    def __init__(self) -> None:
        super().__init__()
        self._runs: dict[str, _Run] = {}
        self._lock = threading.RLock()
        self._tokens: dict[str, int] = {}  # the last token of each id, kept across a delete
        self._name = f"memory:{uuid.uuid4().hex[:12]}"

    @property
    def identity(self) -> str:
        return self._name

    def _run(self, run_id: str) -> _Run:
        run = self._runs.get(run_id)
        if run is None:
            raise RunNotFoundError(run_id)
        return run

    def _held(self, run: _Run) -> bool:
        if run.owner is None:
            return False
        return run.expires is None or run.expires > time.monotonic()

    def create(
        self,
        run_id: str,
        entries: Sequence[j.Entry],
        info: dict[str, Any],
        *,
        owner: Owner | None = None,
        ttl: float | None = None,
    ) -> Lease | None:
        j.validate_run_id(run_id)
        check_batch(run_id, entries, 0)
        with self._lock:
            if run_id in self._runs:
                raise ValueError(
                    f"run {run_id} already exists. Fix: store.load({run_id!r}), or pick another id"
                )
            run = _Run(list(entries), dict(info), token=self._tokens.get(run_id, 0))
            self._runs[run_id] = run
            if owner is None:
                return None
            return self._take(run_id, run, owner, ttl)

    def _take(self, run_id: str, run: _Run, owner: Owner, ttl: float | None) -> Lease:
        ttl = self.ttl if ttl is None else ttl
        run.token += 1
        self._tokens[run_id] = run.token
        run.owner = owner
        run.expires = time.monotonic() + ttl if ttl else None
        run.expires_at = time.time() + ttl if ttl else None
        return Lease(run_id, run.token, owner, run.expires_at, ttl)

    def append(
        self,
        run_id: str,
        entries: Sequence[j.Entry],
        *,
        expected_seq: int,
        writer: str,
        lease_token: int | None,
        info: dict[str, Any],
    ) -> None:
        with self._lock:
            run = self._run(run_id)
            if lease_token != run.token or not self._held(run):  # the fence, under the lock that appends
                raise lease_lost_error(run_id, lease_token, run.token)
            n, stored = len(run.entries), stored_in(run.entries)
            new = plan_append(run_id, entries, expected_seq=expected_seq, stored_length=n, stored=stored)
            if new:
                run.entries.extend(new)
                run.info = dict(info)

    def read(self, run_id: str, after_seq: int = -1) -> list[j.Entry]:
        with self._lock:
            return self._run(run_id).entries[after_seq + 1 :]

    def length(self, run_id: str) -> int:
        with self._lock:
            return len(self._run(run_id).entries)

    def post(self, run_id: str, item: dict[str, Any], *, item_id: str | None = None) -> int:
        item_id = item_id or str(item.get("item_id") or uuid.uuid4().hex)
        with self._lock:
            run = self._run(run_id)
            if item_id in run.item_ids:
                return run.item_ids[item_id]
            made = make_item(item, inbox_seq=len(run.inbox), item_id=item_id)
            run.inbox.append(made)
            run.item_ids[item_id] = made.inbox_seq
            return made.inbox_seq

    def read_inbox(self, run_id: str, after_seq: int = -1) -> list[InboxItem]:
        with self._lock:
            return self._run(run_id).inbox[after_seq + 1 :]

    def inbox_length(self, run_id: str) -> int:
        with self._lock:
            return len(self._run(run_id).inbox)

    def claim(self, run_id: str, owner: Owner, ttl: float | None = None) -> Lease:
        with self._lock:
            run = self._run(run_id)
            if self._held(run):
                raise busy_error(run_id, run.owner)
            return self._take(run_id, run, owner, ttl)

    def claim_next(
        self, owner: Owner, ttl: float | None = None, agents: Collection[str] | None = None
    ) -> Lease | None:
        with self._lock:
            for run_id in plan_claim_next(self._infos(), agents):
                return self._take(run_id, self._runs[run_id], owner, ttl)
            return None

    def renew(self, lease: Lease) -> Lease:
        with self._lock:
            run = self._run(lease.run_id)
            if run.token != lease.token or not self._held(run):
                raise lease_lost_error(lease.run_id, lease.token, run.token)
            ttl = lease.ttl
            run.expires = time.monotonic() + ttl if ttl else None
            run.expires_at = time.time() + ttl if ttl else None
            return Lease(lease.run_id, lease.token, lease.owner, run.expires_at, ttl)

    def release(self, lease: Lease, *, at_seq: int, inbox_len: int) -> bool:
        with self._lock:
            run = self._runs.get(lease.run_id)
            if run is None or run.token != lease.token:
                return True  # taken over (or gone): nothing of ours to release
            if len(run.entries) != at_seq or len(run.inbox) != inbox_len:
                return False
            run.owner = None
            run.expires = None
            return True

    def abandon(self, lease: Lease) -> None:
        with self._lock:
            run = self._runs.get(lease.run_id)
            if run is not None and run.token == lease.token:
                run.owner = None
                run.expires = None

    def holder(self, run_id: str) -> Owner | None:
        with self._lock:
            run = self._run(run_id)
            return run.owner if self._held(run) else None

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
        with self._lock:
            infos = self._infos()
        return query.select(infos, limit)

    def _infos(self) -> builtins.list[RunInfo]:
        return [self._info(run_id, run) for run_id, run in self._runs.items()]

    def _info(self, run_id: str, run: _Run) -> RunInfo:
        info = run.info
        owner = run.owner if self._held(run) else None
        return RunInfo(
            id=run_id,
            agent=info.get("agent"),
            status=str(info.get("status") or "running"),
            first_message=info.get("first_message"),
            created_at=info.get("created_at"),
            updated_at=info.get("updated_at"),
            turn=int(info.get("turn") or 0),
            parent_id=info.get("parent_id"),
            root_id=info.get("root_id") or run_id,
            lease_owner=f"{owner.host}:{owner.pid}" if owner else None,
            lease_expires_at=run.expires_at if owner else None,
            length=len(run.entries),
            inbox_len=len(run.inbox),
            inbox_consumed=int(info.get("inbox_consumed", -1)),
            metadata=dict(info.get("metadata") or {}),
        )

    def delete(self, run_id: str, *, children: bool = False) -> None:
        j.validate_run_id(run_id)
        with self._lock:
            ids = plan_delete(self._infos(), run_id, children)
            for rid in ids:
                run = self._runs[rid]
                if self._held(run):
                    raise busy_error(rid, run.owner)
            for rid in ids:
                del self._runs[rid]

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
        with self._lock:
            trees = plan_prune(self._infos(), cutoff, wanted, children)
            ids = [rid for tree in trees for rid in tree]
            if not dry_run:
                for rid in ids:
                    del self._runs[rid]
        return ids
