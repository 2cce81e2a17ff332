"""Events yielded by ``agent.stream``: journal entries after their append returned, and text deltas."""

from __future__ import annotations

from dataclasses import dataclass

from .journal import Entry

__all__ = ["EntryEvent", "Event", "Reset", "TextDelta"]


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


Event = EntryEvent | TextDelta | Reset
