"""What ``tether ls`` lists and how: trees of runs (each root with its subagent runs folded under it), as a
table that fits the terminal, or as JSON.

Columns are dropped or cut in a fixed order when the terminal is narrow (the first message, then the
agent's name is cut, then ``updated``, then ``turn``); the id and the status are never cut.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from rich.text import Text

from .._timeline import parse_time, truncate
from ..stores import RunInfo, Store
from .common import STATUS_STYLES
from .ids import known_runs

__all__ = ["Row", "age", "rows_of", "run_json", "table_lines", "trees"]

_PAGE = 200
_TREE_LIMIT = 100_000


def run_json(info: RunInfo) -> dict[str, Any]:
    """A run as ``--json`` shows it (docs/cli.md): the same fields in ``ls``, ``show`` and ``follow``."""
    return {
        "id": info.id,
        "parent_id": info.parent_id,
        "root_id": info.root_id or info.id,
        "agent": info.agent,
        "status": info.status,
        "display_status": info.display_status,
        "turn": info.turn,
        "first_message": info.first_message,
        "created_at": info.created_at,
        "updated_at": info.updated_at,
        "held_by": info.lease_owner,
        "metadata": dict(info.metadata),
    }


def _matches(info: RunInfo, status: str | None, agent: str | None, metadata: dict[str, str]) -> bool:
    return (
        (status is None or info.status == status)
        and (agent is None or info.agent == agent)
        and all(info.metadata.get(key) == value for key, value in metadata.items())
    )


def _ordered(root: RunInfo, below: Sequence[RunInfo]) -> list[tuple[RunInfo, int, bool, list[bool]]]:
    """The tree depth first, siblings oldest first: (run, depth, last among its siblings, the ancestors' lasts)."""
    kids: dict[str, list[RunInfo]] = {}
    for info in below:
        kids.setdefault(info.parent_id or root.id, []).append(info)
    for group in kids.values():
        group.sort(key=lambda info: (info.created_at or "", info.id))
    out: list[tuple[RunInfo, int, bool, list[bool]]] = []

    def walk(info: RunInfo, depth: int, last: bool, lasts: list[bool]) -> None:
        out.append((info, depth, last, lasts))
        group = kids.pop(info.id, [])
        for index, kid in enumerate(group):
            walk(kid, depth + 1, index == len(group) - 1, [*lasts, last] if depth else [])

    walk(root, 0, True, [])
    for group in kids.values():  # runs whose parent is gone: under the root, as they are
        for index, kid in enumerate(group):
            walk(kid, 1, index == len(group) - 1, [])
    return out


def trees(
    store: Store, *, status: str | None, agent: str | None, limit: int, metadata: dict[str, str] | None = None
) -> tuple[list[tuple[RunInfo, list[RunInfo]]], list[str], bool]:
    """Up to ``limit`` trees, newest root first: each root (matching the filters) with the runs below it.

    ``metadata`` matches every pair given (a subagent run has its root's metadata).

    Returns:
        The trees, every id this looked at (to shorten ids among), and whether that is every run of the
        store.
    """
    known, complete = known_runs(store)
    seen = [info.id for info in known]
    if complete:
        ids = set(seen)
        below: dict[str, list[RunInfo]] = {}
        for info in known:
            if info.parent_id is not None and info.root_id in ids:
                below.setdefault(info.root_id or "", []).append(info)
        roots = [
            info
            for info in known
            if (info.parent_id is None or info.root_id not in ids)
            and _matches(info, status, agent, metadata or {})
        ]
        return [(root, below.get(root.id, [])) for root in roots[:limit]], seen, True
    found: list[tuple[RunInfo, list[RunInfo]]] = []
    cursor: str | None = None
    while len(found) < limit:
        page, cursor = store.list_page(
            status=status, agent=agent, metadata=metadata or None, limit=_PAGE, cursor=cursor
        )
        for info in page:
            if info.parent_id is None and len(found) < limit and all(info.id != r.id for r, _ in found):
                tree = [run for run in store.list(root_id=info.id, limit=_TREE_LIMIT) if run.id != info.id]
                seen.extend(run.id for run in tree)
                found.append((info, tree))
        if cursor is None:
            break
    return found, seen, False


@dataclass(slots=True)
class Row:
    """One line of ``tether ls``: the run, how deep in its tree, and its id cell (tree lines and short id)."""

    info: RunInfo
    depth: int
    id_cell: str
    lead: int = 0
    """How many characters of ``id_cell`` are tree lines."""


def rows_of(
    found: Sequence[tuple[RunInfo, Sequence[RunInfo]]], short: Callable[[str], str], *, unicode: bool = True
) -> list[Row]:
    """The rows of ``found``, each subagent run under its parent with tree lines (``├ └ │``)."""
    tee, corner, bar = ("├ ", "└ ", "│ ") if unicode else ("|-", "`-", "| ")
    rows: list[Row] = []
    for root, below in found:
        for info, depth, last, lasts in _ordered(root, below):
            lead = "".join("  " if done else bar for done in lasts)
            branch = (corner if last else tee) if depth else ""
            rows.append(Row(info, depth, f"{lead}{branch}{short(info.id)}", len(lead) + len(branch)))
    return rows


def age(at: str | None, now: datetime) -> str:
    """How long ago an ISO timestamp was: ``12s ago``, ``5m ago``, ``3h ago``, ``2d ago``, else the date."""
    then = parse_time(at)
    if then is None:
        return at or "-"
    seconds = int((now - then).total_seconds())
    if seconds >= 30 * 86400:
        return then.astimezone(UTC).strftime("%Y-%m-%d")
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit} ago"
    return f"{max(seconds, 0)}s ago"


def table_lines(rows: Sequence[Row], width: int, now: datetime) -> list[Text]:
    """``rows`` as a table fitting ``width`` columns: id, agent, status, turn, updated, first message.

    The first message takes what is left of the line (at most 60 characters) and is left out when fewer
    than 12 are left; then the agent's name is cut (to 6 characters at least), then ``updated`` and
    ``turn`` are left out. The id and the status are shown whole whatever the width.
    """
    columns: dict[str, list[str]] = {
        "id": [row.id_cell for row in rows],
        "agent": [row.info.agent or "-" for row in rows],
        "status": [row.info.display_status for row in rows],
        "turn": [str(row.info.turn) for row in rows],
        "updated": [age(row.info.updated_at, now) for row in rows],
    }
    widths = {name: max(len(name), *(len(cell) for cell in cells)) for name, cells in columns.items()}
    gap = 2

    def used() -> int:
        return sum(widths.values()) + gap * (len(widths) - 1)

    room = width - used() - gap
    message = min(room, 60) if room >= 12 else 0
    if not message and used() > width:
        widths["agent"] = max(6, widths["agent"] - (used() - width))
    for name in ("updated", "turn"):
        if used() > width:
            del widths[name]
    lines = [Text("  ".join(_cell(name, name, widths[name]) for name in widths), style="bold")]
    if message:
        lines[0].append(" " * gap + "first message")
    for index, row in enumerate(rows):
        line = Text()
        for position, name in enumerate(widths):
            if position:
                line.append(" " * gap)
            text = _cell(name, columns[name][index], widths[name])
            if name == "status":
                line.append(text, style=STATUS_STYLES.get(row.info.status, ""))
            elif name == "id" and row.lead:
                line.append(text[: row.lead], style="dim")
                line.append(text[row.lead :])
            else:
                line.append(text)
        if message:
            line.append(" " * gap + truncate(row.info.first_message or "", message))
        line.rstrip()
        lines.append(line)
    lines[0].rstrip()
    return lines


def _cell(name: str, text: str, width: int) -> str:
    if name == "turn":
        return text.rjust(width)
    return truncate(text, width).ljust(width) if len(text) > width else text.ljust(width)
