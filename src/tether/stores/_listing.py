"""The listing order and cursor of ``Store.list`` and ``Store.list_page`` (DESIGN 8)."""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import orjson

from .._encodable import clean
from ._records import RunInfo

__all__ = ["ListCursor", "ListQuery", "as_cutoff", "check_metadata_filter", "listing_key"]


def check_metadata_filter(metadata: Mapping[str, str] | None) -> dict[str, str]:
    """``list(metadata=...)``'s pairs (every one must match exactly), checked.

    Raises:
        ValueError: not a mapping of strings to strings.
    """
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise ValueError(
            f"metadata filter {metadata!r} is not a dict of strings to strings. Fix: pass e.g. "
            'metadata={"user": "u42"}'
        )
    return clean(dict(metadata))  # lone surrogates as journaled: U+FFFD (tether._encodable)


def as_cutoff(value: datetime | timedelta | str) -> str:
    """A time bound in the form ``updated_at`` is stored in (UTC, microseconds, ``Z``), so strings compare.

    Args:
        value: a datetime (naive means UTC), an ISO 8601 string, or a timedelta meaning that long before now.

    Raises:
        ValueError: a string that is not ISO 8601.
    """
    if isinstance(value, timedelta):
        value = datetime.now(UTC) - value
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.replace("Z", "+00:00") if value.endswith("Z") else value)
        except ValueError:
            raise ValueError(
                f"time {value!r} is not ISO 8601. Fix: pass e.g. '2025-01-31T12:00:00Z', a datetime or a timedelta"
            ) from None
    value = value if value.tzinfo else value.replace(tzinfo=UTC)
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def listing_key(info: RunInfo) -> tuple[str, str]:
    """The listing order's key: ``(updated_at, id)``; ``list()`` returns runs by this key, highest first."""
    return (info.updated_at or "", info.id)


@dataclass(frozen=True, slots=True)
class ListCursor:
    """Where a listing resumes (``list(cursor=...)``, ``list_page``); opaque to callers, a short string.

    A listing is made of passes, each newest first. A pass keeps runs with ``updated_at > since`` (every run
    in the first pass) that sort before the position ``(at, id)`` (every run when ``id`` is None). When a
    pass is done, the next one keeps runs updated after ``top``, the newest ``updated_at`` the previous pass
    saw, so a run updated while paging is listed again rather than skipped.

    A store implements the cursor in ``list`` with ``admits`` (or the same test in SQL:
    ``updated_at > since AND (updated_at < at OR (updated_at = at AND id < id))``).
    """

    since: str | None = None
    top: str | None = None
    at: str = ""
    id: str | None = None

    def encode(self) -> str:
        """The cursor as an opaque URL-safe string."""
        raw = orjson.dumps({"s": self.since, "t": self.top, "a": self.at, "i": self.id})
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    @classmethod
    def decode(cls, cursor: str | None) -> ListCursor:
        """Read a cursor made by ``encode`` (None: the start of the first pass).

        Raises:
            ValueError: not a cursor of this store's listing.
        """
        if cursor is None:
            return cls()
        try:
            obj = orjson.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
            made = cls(obj["s"], obj["t"], str(obj["a"]), obj["i"])
        except (ValueError, TypeError, KeyError):
            raise ValueError(
                f"listing cursor {cursor!r} is not valid. Fix: pass the cursor list_page returned, or None"
            ) from None
        for value in (made.since, made.top, made.id):
            if value is not None and not isinstance(value, str):
                raise ValueError(
                    f"listing cursor {cursor!r} is not valid. Fix: pass the cursor list_page returned"
                )
        return made

    def admits(self, info: RunInfo) -> bool:
        """Whether the run belongs to the rest of this pass."""
        updated = info.updated_at or ""
        if self.since is not None and not updated > self.since:
            return False
        return self.id is None or (updated, info.id) < (self.at, self.id)


@dataclass(frozen=True, slots=True)
class ListQuery:
    """The filters of one ``Store.list`` call in stored form: the one way every store reads its arguments.

    ``equal`` holds the exact-match filters given (``status``, ``agent``, ``parent_id``, ``root_id``, by
    column name), ``before`` and ``after`` the strict ``updated_at`` bounds (``as_cutoff``), ``cursor`` the
    decoded listing cursor, ``metadata`` the pairs a run's metadata must all hold. Stores that list in
    Python call ``select``; SQL stores say the same in SQL.
    """

    equal: dict[str, str]
    before: str | None
    after: str | None
    cursor: ListCursor
    metadata: dict[str, str]

    @classmethod
    def of(
        cls,
        *,
        status: str | None,
        agent: str | None,
        parent_id: str | None,
        root_id: str | None,
        updated_before: datetime | str | None,
        updated_after: datetime | str | None,
        cursor: str | None,
        metadata: Mapping[str, str] | None = None,
    ) -> ListQuery:
        """Read ``list``'s arguments (the cursor first, then the bounds, then the metadata pairs).

        Raises:
            ValueError: a bad cursor, time bound or metadata filter.
        """
        here = ListCursor.decode(cursor)
        before = as_cutoff(updated_before) if updated_before is not None else None
        after = as_cutoff(updated_after) if updated_after is not None else None
        given = {"status": status, "agent": agent, "parent_id": parent_id, "root_id": root_id}
        equal = {k: v for k, v in given.items() if v is not None}
        return cls(equal, before, after, here, check_metadata_filter(metadata))

    def admits(self, info: RunInfo) -> bool:
        """Whether the run passes every filter and belongs to the rest of the cursor's pass."""
        updated = info.updated_at or ""
        return (
            all(getattr(info, column) == value for column, value in self.equal.items())
            and all(info.metadata.get(key) == value for key, value in self.metadata.items())
            and (self.before is None or updated < self.before)
            and (self.after is None or updated > self.after)
            and self.cursor.admits(info)
        )

    def select(self, infos: Iterable[RunInfo], limit: int) -> list[RunInfo]:
        """The admitted runs, in listing order (highest ``listing_key`` first), at most ``limit`` of them."""
        found = [info for info in infos if self.admits(info)]
        found.sort(key=listing_key, reverse=True)
        return found[: max(limit, 0)]
