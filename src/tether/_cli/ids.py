"""Short run ids, as git abbreviates commits: shown where unambiguous, accepted by every command.

A run id has parts separated by ``-``: a root's generated id is one part of 32 hex digits, a subagent
run's id adds a part of 24 hex digits for each level (``ROOT-7c3e…``). A short form keeps each part's
beginning: ``0195f3a2b1-7c3e`` abbreviates ``0195f3a2b1c4…-7c3e9a1b…`` (``Store.ids_matching``). A text
names the run whose id it is; otherwise, among the runs it abbreviates, the one with the fewest parts (a
root rather than its subagent runs), when only one has that few. Anything else is ambiguous, and the
command says so instead of guessing.

``Names`` makes the short forms shown: each hex part of 12 digits or more is cut to the shortest beginning
that no other run's part in the same place shares (7 digits at least for a root's part, 4 for a subagent
run's), among the runs it knows. Run ids are time-ordered (their first 12 digits are the creation
millisecond), so when the store holds more runs than it lists at once, a root's part keeps those 12 digits.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from .. import journal as j
from ..stores import RunInfo, Store

__all__ = ["ALL_KNOWN", "Names", "known_runs", "pick", "resolve"]

ALL_KNOWN = 2000
"""A store holding at most this many runs is listed whole, so short forms are unambiguous in all of it."""

_HEX = re.compile(r"[0-9a-f]{12,}")
_MIN_ROOT_ALL = 7  # git's default abbreviation
_MIN_ROOT_SOME = 12  # the creation millisecond: runs not listed were made in another one
_MIN_CHILD = 4


def pick(text: str, candidates: Sequence[str]) -> list[str]:
    """The runs that ``text`` names among the ids it abbreviates: one, none, or several (ambiguous)."""
    if text in candidates:
        return [text]
    if not candidates:
        return []
    fewest = min(run_id.count("-") for run_id in candidates)
    return sorted(run_id for run_id in candidates if run_id.count("-") == fewest)


def _abbreviates(text: str, run_id: str) -> bool:
    parts, theirs = text.split("-"), run_id.split("-")
    return len(theirs) >= len(parts) and all(t.startswith(p) for p, t in zip(parts, theirs, strict=False))


class Names:
    """The short forms of run ids, unambiguous among the ``known`` ids.

    Args:
        known: every id to tell apart (the whole store when ``complete``).
        complete: ``known`` is every run of the store.
    """

    def __init__(self, known: Iterable[str], *, complete: bool) -> None:
        self.known = set(known)
        self.complete = complete
        self._values: dict[tuple[str, ...], set[str]] = {}
        for run_id in self.known:
            parts = tuple(run_id.split("-"))
            for depth in range(len(parts)):
                self._values.setdefault(parts[:depth], set()).add(parts[depth])
        self._cache: dict[str, str] = {}

    def add(self, run_ids: Iterable[str]) -> None:
        """Know these ids too."""
        for run_id in run_ids:
            if run_id not in self.known:
                self.known.add(run_id)
                parts = tuple(run_id.split("-"))
                for depth in range(len(parts)):
                    self._values.setdefault(parts[:depth], set()).add(parts[depth])
        self._cache.clear()

    def short(self, run_id: str) -> str:
        """The shortest form of ``run_id`` that names it among the known ids (the id itself if none does)."""
        found = self._cache.get(run_id)
        if found is None:
            found = self._cache[run_id] = self._shorten(run_id)
        return found

    def _shorten(self, run_id: str) -> str:
        parts = run_id.split("-")
        out: list[str] = []
        for depth, part in enumerate(parts):
            if not _HEX.fullmatch(part):
                out.append(part)
                continue
            others = self._values.get(tuple(parts[:depth]), set()) - {part}
            least = _MIN_CHILD if depth else (_MIN_ROOT_ALL if self.complete else _MIN_ROOT_SOME)
            size = least
            while size < len(part) and any(other.startswith(part[:size]) for other in others):
                size += 1
            out.append(part[:size])
        text = "-".join(out)
        matches = [other for other in self.known if _abbreviates(text, other)]
        return text if pick(text, matches) == [run_id] else run_id


def known_runs(store: Store) -> tuple[list[RunInfo], bool]:
    """The store's runs when it holds at most ``ALL_KNOWN`` (and True), else the newest that many (False)."""
    runs = store.list(limit=ALL_KNOWN + 1)
    return runs[:ALL_KNOWN], len(runs) <= ALL_KNOWN


def resolve(store: Store, text: str, where: str) -> str:
    """The id of the run ``text`` names (its id, or a short form of it; see the module's docstring).

    Args:
        store: the store.
        text: what the user typed.
        where: the store as the user named it, for the messages.

    Raises:
        ValueError: ``text`` is not a valid id, names no run, or could name several.
    """
    j.validate_run_id(text)
    if store.exists(text):
        return text
    named = pick(text, store.ids_matching(text))
    if len(named) == 1:
        return named[0]
    if not named:
        raise ValueError(f"no run in {where} has the id {text}, or one beginning with it")
    shown = ", ".join(named[:5]) + (f" and {len(named) - 5} more" if len(named) > 5 else "")
    raise ValueError(f"{text} could be any of {len(named)} runs: {shown}. Fix: type more of the id")
