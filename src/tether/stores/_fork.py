"""What ``Store.fork`` keeps of a source run: where a turn ends, and each entry as the fork inherits it.

Self-contained: it folds entries (``State``) to find a turn boundary, which the planner never does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from .. import journal as j
from ..state import State

__all__ = ["fork_boundary", "inherited"]

_BOUNDARY_KINDS = frozenset(
    {"run_started", "message", "model_replied", "tool_finished", "compacted", "run_stopped"}
)


def fork_boundary(entries: Sequence[j.Entry], at_seq: int) -> int:
    """The last seq at or before ``at_seq`` that ends a turn (see ``Store.fork``).

    That is a ``run_started``, ``message``, ``model_replied``, ``tool_finished``, ``compacted`` or
    ``run_stopped`` entry after which no call is open.
    """
    state = State(id="fork")
    boundary = 0
    for entry in entries[: at_seq + 1]:
        state.apply(entry)
        if entry.kind in _BOUNDARY_KINDS and not state.open_calls:
            boundary = entry.seq
    return boundary


_INBOX_FIELDS = {"inbox_seq": None, "item_id": None}


def inherited(entry: j.Entry) -> j.Entry:
    """A source entry as a fork keeps it: unsealed, and no longer tied to the source's inbox."""
    changes: dict[str, Any] = {"w": "", "h": "", "b": 0}
    if isinstance(entry, j.InboxSkipped):
        changes.update(inbox_seq=-1, item_id=None)
    else:
        for name, value in _INBOX_FIELDS.items():
            if hasattr(entry, name):
                changes[name] = value
    return dataclasses.replace(entry, **changes)
