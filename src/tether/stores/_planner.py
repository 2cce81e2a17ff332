"""The one planner: what ``append``, ``claim_next``, ``prune`` and ``delete`` do, decided without I/O.

Stores that list in Python call the ``plan_*`` functions under their own locks; SQL stores say the same in SQL.
Nothing here folds entries (DESIGN 8.1: stores never fold) or imports ``tether.state``.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence

from .. import journal as j
from ..errors import RunNotFoundError
from ._listing import listing_key
from ._records import RunInfo

__all__ = [
    "check_batch",
    "check_prune_statuses",
    "delete_children_error",
    "delete_subagent_error",
    "listed_child_needs_work",
    "plan_claim_next",
    "plan_delete",
    "plan_prune",
]


def check_batch(run_id: str, entries: Sequence[j.Entry], first_seq: int) -> None:
    """Refuse what is not one sealed batch numbered from ``first_seq`` (what ``State.next_batch()`` returns).

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
                f"seq {first_seq}. Fix: write what State.next_batch() returns"
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
