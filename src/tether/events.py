"""Events yielded by ``agent.stream``: journal entries after their append returned, and text deltas."""

from __future__ import annotations

from dataclasses import dataclass

from .journal import Entry

__all__ = ["EntryEvent", "Event", "Reset", "Retrying", "TextDelta"]


@dataclass(frozen=True, slots=True)
class EntryEvent:
    """A journal entry, yielded only after the append that holds it returned."""

    entry: Entry
    type: str = "entry"


@dataclass(frozen=True, slots=True)
class TextDelta:
    """A piece of the model's text as it streams: request index, delta index, text."""

    request: int
    index: int
    text: str
    type: str = "text"


@dataclass(frozen=True, slots=True)
class Reset:
    """Request ``request`` is asked again: discard the text deltas already shown for it."""

    request: int
    type: str = "reset"


@dataclass(frozen=True, slots=True)
class Retrying:
    """A model request failed with a retryable error (its ``model_failed`` is journaled): the model is asked
    again after ``delay`` seconds, as request ``request`` and attempt ``attempt`` of at most ``attempts``.

    ``error_type`` is the exception's class name (``RateLimitError``), ``error`` its message, and
    ``status_code`` the provider's HTTP status when it answered.
    """

    request: int
    attempt: int
    attempts: int
    delay: float
    error_type: str
    error: str
    status_code: int | None = None
    type: str = "retrying"


Event = EntryEvent | TextDelta | Reset | Retrying
