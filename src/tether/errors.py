"""tether's exceptions.

Every message has the form ``what went wrong. Fix: what to do``; the message is part of the API.
"""

from __future__ import annotations

import errno as _errno
import os as _os

__all__ = [
    "ConflictError",
    "CorruptJournalError",
    "LeaseLostError",
    "ModelError",
    "NewerFormatError",
    "RunBusyError",
    "RunNotFoundError",
    "StoreBrokenError",
    "StoreFullError",
    "StoreLockedError",
    "TetherError",
    "UnencodableError",
]


class TetherError(Exception):
    """Base class of tether's own exceptions."""


class RunNotFoundError(TetherError, KeyError):
    """The store has no run with this id."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(
            f"run {run_id} is not in this store. Fix: check the id and the store URL (tether ls lists runs)"
        )

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class RunBusyError(TetherError):
    """The run is held by another live process (or another holder in this process)."""

    def __init__(self, message: str, *, run_id: str = "", owner: dict[str, object] | None = None) -> None:
        super().__init__(message)
        self.run_id = run_id
        self.owner = owner or {}


class ConflictError(TetherError):
    """The journal holds entries the writer did not expect: another writer appended, or a gap."""

    def __init__(self, message: str, *, run_id: str = "", seq: int | None = None) -> None:
        super().__init__(message)
        self.run_id = run_id
        self.seq = seq


class LeaseLostError(ConflictError):
    """The writer's lease was taken over: its append is refused."""


class CorruptJournalError(TetherError, ValueError):
    """A journal entry cannot be decoded, fails its checksum, or cannot follow the entries before it."""

    def __init__(self, run_id: str, seq: int | None, problem: str, *, fix: str | None = None) -> None:
        self.run_id = run_id
        self.seq = seq
        self.problem = problem
        where = f"run {run_id} seq {seq}" if seq is not None else f"run {run_id}"
        fix = fix or (
            f"restore the run from a backup, or fork it before the damaged entry (tether fork {run_id} --at "
            "SEQ)"
        )
        super().__init__(f"{where} is damaged: {problem}. Fix: {fix}; nothing was changed")


class NewerFormatError(TetherError, ValueError):
    """The journal was written by a newer tether."""

    def __init__(self, run_id: str, seq: int, version: int, supported: int) -> None:
        self.run_id = run_id
        self.seq = seq
        self.version = version
        super().__init__(
            f"run {run_id} seq {seq} was written by format {version}; this tether reads up to "
            f"{supported}. Fix: upgrade tether"
        )


class StoreBrokenError(TetherError, OSError):
    """A failed write could not be undone; this process refuses further appends to the run."""


class StoreFullError(TetherError, OSError):
    """A write found no room: a full disk or quota, or a SQLite file at its size limit.

    The write was refused whole: what was saved before it is kept, and the State still holds what it did
    not save (``store.save(state)`` writes it once there is room). ``errno`` is ``ENOSPC`` (or ``EDQUOT``),
    so ``except OSError`` still catches it; ``filename`` is the file that was being written.
    """

    def __init__(
        self, message: str, *, run_id: str = "", code: int = _errno.ENOSPC, filename: str | None = None
    ) -> None:
        super().__init__(message)
        self.run_id = run_id
        self.errno = code
        self.strerror = _os.strerror(code)
        self.filename = filename

    def __str__(self) -> str:  # OSError would prefix "[Errno 28]"
        return str(self.args[0])


class StoreLockedError(TetherError, TimeoutError):
    """Another process kept the store locked (a SQLite write transaction) for longer than the store waits."""

    def __init__(self, message: str, *, filename: str | None = None) -> None:
        super().__init__(message)
        self.filename = filename

    def __str__(self) -> str:
        return str(self.args[0])


class ModelError(TetherError):
    """A model request failed.

    Attributes:
        retryable: whether the driver retries it (rate limit, overload, 5xx, a cut stream).
        retry_after: seconds the provider asked to wait, when it said.
    """

    def __init__(self, message: str, *, retryable: bool = False, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.retry_after = retry_after


class UnencodableError(TetherError, TypeError):
    """A new entry holds a value no journal can hold (lone surrogates are replaced, never refused).

    Attributes:
        problem: what the JSON encoder said (``Integer exceeds 64-bit range``, ``Dict key must be str``).
    """

    def __init__(self, what: str, problem: str) -> None:
        self.problem = problem
        super().__init__(
            f"{what} cannot be journaled: {problem}. Fix: give it JSON values only (strings, integers within "
            "64 bits, floats, booleans, None, lists, and dicts with string keys); nothing was journaled"
        )
