"""Failpoints for crash tests: kill this process at a chosen journal boundary (DESIGN 14).

``TETHER_FAILPOINT=POINT:WHERE`` with POINT one of ``before_append``, ``after_append``, ``torn_append`` and
WHERE either a seq (the append that holds that seq) or an entry kind, optionally ``#n`` for its n-th
occurrence (``after_append:tool_finished#2``). Off by default and free when off: stores test ``ACTIVE``.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Sequence

from ..journal import Entry

__all__ = ["ACTIVE", "die", "hits"]

_POINTS = ("before_append", "after_append", "torn_append")


def _parse(spec: str | None) -> tuple[str, int | None, str | None, int] | None:
    if not spec:
        return None
    point, _, where = spec.partition(":")
    if point not in _POINTS or not where:
        raise ValueError(
            f"TETHER_FAILPOINT={spec!r} is not valid. Fix: use POINT:SEQ or POINT:KIND[#N] with POINT one of "
            f"{', '.join(_POINTS)}"
        )
    if where.isdigit():
        return point, int(where), None, 1
    kind, _, nth = where.partition("#")
    return point, None, kind, int(nth) if nth.isdigit() else 1


_SPEC = _parse(os.environ.get("TETHER_FAILPOINT"))
ACTIVE = _SPEC is not None
_seen = 0


def hits(point: str, entries: Sequence[Entry]) -> bool:
    """Whether the failpoint ``point`` fires for this append (call only when ACTIVE)."""
    global _seen
    if _SPEC is None or _SPEC[0] != point:
        return False
    _, seq, kind, nth = _SPEC
    if seq is not None:
        return any(entry.seq == seq for entry in entries)
    count = sum(1 for entry in entries if entry.kind == kind)
    if not count:
        return False
    _seen += count
    return _seen >= nth and _seen - count < nth


def die() -> None:
    """Kill this process at once with SIGKILL: no cleanup, no flush, as a crash."""
    os.kill(os.getpid(), signal.SIGKILL)
