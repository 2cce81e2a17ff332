"""The one planner: what ``append``, ``claim_next``, ``prune`` and ``delete`` do, decided without I/O of its own.

Stores that list in Python call the ``plan_*`` functions under their own locks; SQL stores say the same in SQL.
Nothing here folds entries (DESIGN 8.1: stores never fold) or imports ``tether.state``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import NamedTuple

import orjson

from .. import journal as j
from ..errors import CorruptJournalError, RunNotFoundError
from ._listing import listing_key
from ._records import RunInfo, conflict_error, gap_error

__all__ = [
    "Stored",
    "check_batch",
    "check_prune_statuses",
    "delete_children_error",
    "delete_subagent_error",
    "listed_child_needs_work",
    "plan_append",
    "plan_claim_next",
    "plan_delete",
    "plan_prune",
    "stored_body",
    "stored_entry",
    "stored_in",
]


def check_batch(run_id: str, entries: Sequence[j.Entry], first_seq: int) -> None:
    """Refuse what is not one sealed batch numbered from ``first_seq`` (what ``JournalWriter.next_batch()`` returns).

    Raises:
        ValueError: no entries, a seq out of order, a countdown ``b`` that does not end at 0, or no ``w``/``h``.
    """
    if not entries:
        raise ValueError(f"run {run_id}: nothing to write. Fix: pass at least one entry")
    last = len(entries) - 1
    for i, entry in enumerate(entries):
        if entry.seq != first_seq + i or entry.b != last - i or not entry.h or not entry.w:
            raise ValueError(
                f"run {run_id}: entry {i} (seq {entry.seq}, b {entry.b}) is not part of one sealed batch from "
                f"seq {first_seq}. Fix: write what JournalWriter.next_batch() returns"
            )


class Stored(NamedTuple):
    """A stored entry as ``plan_append`` compares it: its ``w`` and ``h``, and how to decode it.

    ``decode`` is called only to name the entry in a ConflictError, so a store need not decode to compare.
    """

    w: str
    h: str
    decode: Callable[[], j.Entry]


StoredReader = Callable[[int, int], Sequence[Stored]]
"""``stored(first, end)``: the stored entries with ``first <= seq < end``, in seq order."""


def plan_append(
    run_id: str,
    entries: Sequence[j.Entry],
    *,
    expected_seq: int,
    stored_length: int,
    stored: StoredReader,
) -> list[j.Entry]:
    """The entries of an append the journal does not hold yet: what the store must write (DURABILITY 3).

    The caller has passed the fence and holds what makes its read of the journal current (a lock, a write
    transaction); it writes what is returned in the same step as the fence, all or nothing. With
    n = ``stored_length`` and k = min(len(entries), n - expected_seq), the first k entries are a retried
    append: each must have the ``w`` and ``h`` of the stored entry at its seq. ``stored`` is called once,
    for seqs [expected_seq, expected_seq + k), and only when k > 0; a new append reads nothing.

    Returns:
        ``entries[k:]``: empty for an empty append and for a retry stored whole.

    Raises:
        ValueError: ``entries`` is not one sealed batch numbered from ``expected_seq``.
        ConflictError: ``expected_seq > n`` (a gap), or a stored entry with another ``w`` or ``h`` (the error
            names its seq, kind and writer).
        CorruptJournalError: ``stored`` returned fewer than k entries.
    """
    if not entries:
        return []
    check_batch(run_id, entries, expected_seq)
    if expected_seq > stored_length:
        raise gap_error(run_id, expected_seq, stored_length)
    k = min(len(entries), stored_length - expected_seq)
    if k:
        _check_retry(run_id, entries[:k], expected_seq, stored(expected_seq, expected_seq + k))
    return list(entries[k:])


def _check_retry(run_id: str, head: Sequence[j.Entry], first: int, found: Sequence[Stored]) -> None:
    """Refuse a retried head whose entries are not the stored ones (same ``w`` and ``h``)."""
    if len(found) != len(head):
        raise CorruptJournalError(
            run_id, first + len(found), "the entry is missing (the run's length counts it)"
        )
    for i, (entry, old) in enumerate(zip(head, found, strict=True)):
        if old.w != entry.w or old.h != entry.h:
            raise conflict_error(run_id, first + i, old.decode())


def stored_entry(entry: j.Entry) -> Stored:
    """A decoded stored entry, for ``plan_append``."""
    return Stored(entry.w, entry.h, lambda: entry)


def stored_in(entries: Sequence[j.Entry]) -> StoredReader:
    """A ``stored`` reader over a whole journal held decoded, indexed by seq (MemoryStore)."""
    return lambda first, end: [stored_entry(entry) for entry in entries[first:end]]


def stored_body(run_id: str, body: bytes) -> Stored:
    """An encoded stored entry (``encode_entry``'s bytes, as SQL stores keep it), for ``plan_append``.

    Only ``w`` and ``h`` are read; a body that is not a JSON object compares unequal and decodes to the
    CorruptJournalError it is.
    """
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        obj = None
    if not isinstance(obj, dict):
        return Stored("", "", functools.partial(j.decode_entry, body, run_id))
    return Stored(
        str(obj.get("w") or ""), str(obj.get("h") or ""), functools.partial(j.decode_entry, body, run_id)
    )


def _tree_children(infos: Iterable[RunInfo]) -> dict[str, list[RunInfo]]:
    """The runs of each tree other than its root, keyed by root id."""
    out: dict[str, list[RunInfo]] = {}
    for info in infos:
        if info.parent_id is not None and info.root_id is not None:
            out.setdefault(info.root_id, []).append(info)
    return out


def listed_child_needs_work(root: RunInfo, child: RunInfo) -> bool:
    """Whether a free child makes its ``waiting`` root need work (see ``Store.claim_next``)."""
    if child.lease_owner is not None:
        return False
    moved_on = child.status != "waiting" and (child.updated_at or "") > (root.updated_at or "")
    return child.unconsumed or moved_on


def plan_claim_next(infos: Iterable[RunInfo], agents: Collection[str] | None) -> list[str]:
    """The roots ``claim_next`` may claim, in the order it tries them (for stores that list in Python).

    ``lease_owner`` tells whether a run is held. See ``Store.claim_next`` for the rule.
    """
    infos = list(infos)
    children = _tree_children(infos)
    found: list[RunInfo] = []
    for root in infos:
        if root.parent_id is not None or root.lease_owner is not None:
            continue
        if agents is not None and root.agent not in agents:
            continue
        if (
            root.status == "running"
            or root.unconsumed
            or (
                root.status == "waiting"
                and any(listed_child_needs_work(root, c) for c in children.get(root.id, ()))
            )
        ):
            found.append(root)
    found.sort(key=listing_key)
    return [info.id for info in found]


def plan_prune(
    infos: Iterable[RunInfo], cutoff: str, statuses: Collection[str], children: bool
) -> list[list[str]]:
    """The trees ``prune`` deletes, each ``[root, *its other runs]``, roots oldest first (see ``Store.prune``).

    ``lease_owner`` tells whether a run is held; ``cutoff`` comes from ``as_cutoff``.
    """
    infos = list(infos)
    trees = _tree_children(infos)
    out: list[list[str]] = []
    for root in sorted(infos, key=listing_key):
        if root.parent_id is not None or root.status not in statuses or root.lease_owner is not None:
            continue
        if not root.updated_at or not root.updated_at < cutoff or root.unconsumed:
            continue
        kids = sorted(trees.get(root.id, ()), key=listing_key)
        if kids and not children:
            continue
        if any(kid.lease_owner is not None or kid.status not in j.STOP_STATUSES for kid in kids):
            continue
        out.append([root.id, *(kid.id for kid in kids)])
    return out


def check_prune_statuses(statuses: Sequence[str]) -> tuple[str, ...]:
    """``prune``'s statuses as a tuple.

    Raises:
        ValueError: none given, or one that is not a stop.
    """
    if isinstance(statuses, str):
        statuses = (statuses,)
    bad = [s for s in statuses if s not in j.STOP_STATUSES]
    if bad or not statuses:
        raise ValueError(
            f"prune statuses {bad or 'none'} are not stops. Fix: use some of {', '.join(j.STOP_STATUSES)}"
        )
    return tuple(statuses)


def plan_delete(infos: Iterable[RunInfo], run_id: str, children: bool) -> list[str]:
    """The runs ``delete(run_id, children=...)`` removes: the run, then its descendants (see ``Store.delete``).

    Raises:
        RunNotFoundError: no such run.
        ValueError: a subagent run whose parent exists; subagent runs without ``children=True``.
    """
    by_id = {info.id: info for info in infos}
    info = by_id.get(run_id)
    if info is None:
        raise RunNotFoundError(run_id)
    if info.parent_id is not None and info.parent_id in by_id:
        raise delete_subagent_error(run_id, info.parent_id, info.root_id)
    kids: dict[str, list[str]] = {}
    for other in by_id.values():
        if other.parent_id is not None:
            kids.setdefault(other.parent_id, []).append(other.id)
    found: list[str] = []
    todo = [run_id]
    while todo:
        for kid in sorted(kids.get(todo.pop(), ())):
            if kid not in found and kid != run_id:
                found.append(kid)
                todo.append(kid)
    if found and not children:
        raise delete_children_error(run_id, len(found))
    return [run_id, *found]


def delete_subagent_error(run_id: str, parent_id: str, root_id: str | None) -> ValueError:
    """The error of ``delete`` on a subagent run whose parent exists."""
    root = root_id or parent_id
    return ValueError(
        f"run {run_id} is a subagent of {parent_id}. Fix: delete its root {root} with children=True "
        f"(tether rm {root} --children)"
    )


def delete_children_error(run_id: str, count: int) -> ValueError:
    """The error of ``delete(children=False)`` on a run with subagent runs."""
    return ValueError(
        f"run {run_id} has {count} subagent run{'s' if count > 1 else ''}. Fix: pass children=True to "
        f"delete them with it (tether rm {run_id} --children)"
    )
