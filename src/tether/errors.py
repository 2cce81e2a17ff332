"""tether's exceptions.

Every message has the form ``what went wrong. Fix: what to do``; the message is part of the API.
"""

from __future__ import annotations

__all__ = [
    "ConflictError",
    "CorruptJournalError",
    "LeaseLostError",
    "ModelError",
    "NewerFormatError",
    "RunBusyError",
    "RunNotFoundError",
    "StoreBrokenError",
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

    def __init__(self, run_id: str, seq: int | None, problem: str) -> None:
        self.run_id = run_id
        self.seq = seq
        where = f"run {run_id} seq {seq}" if seq is not None else f"run {run_id}"
        super().__init__(
            f"{where} is damaged: {problem}. Fix: restore the run from a backup, or fork it before "
            f"the damaged entry (tether fork {run_id} --at SEQ); nothing was changed"
        )


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
