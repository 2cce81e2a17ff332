"""Testing helpers: ScriptedModel and ``call``, and a side file that records tool executions.

``ScriptedModel(replies)`` answers request number ``request.index`` with ``replies[request.index]``
(DESIGN 3), so a resumed process gets the reply that comes next, and a request cut off by a crash gets the
same reply again.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from ._harness.crash.crash_test import (
    CrashCase,
    CrashReport,
    InvariantViolation,
    crash_test,
    record_execution,
)
from .models.scripted import ScriptedCall, ScriptedModel, call

if TYPE_CHECKING:
    from ._harness.conformance.suite import StoreConformance

__all__ = [
    "CrashCase",
    "CrashReport",
    "ExecutionLog",
    "InvariantViolation",
    "ScriptedCall",
    "ScriptedModel",
    "StoreConformance",
    "call",
    "crash_test",
    "record_execution",
]


class ExecutionLog:
    """An append-only side file, outside any store, where tools record each execution.

    "Ran once" is judged here, per call id, never from the journal alone. Safe across processes: each
    record is one ``O_APPEND`` write of one line, fsynced.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def record(self, **fields: Any) -> None:
        """Append one record (with this process's pid)."""
        line = orjson.dumps({"pid": os.getpid(), **fields}) + b"\n"
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)

    def records(self) -> list[dict[str, Any]]:
        """Every complete record, in order."""
        if not self.path.exists():
            return []
        out = []
        for raw in self.path.read_bytes().split(b"\n"):
            if raw:
                out.append(orjson.loads(raw))
        return out

    def count(self, **match: Any) -> int:
        """How many records have every field of ``match``."""
        return sum(1 for r in self.records() if all(r.get(k) == v for k, v in match.items()))


def __getattr__(name: str) -> Any:
    """``StoreConformance`` (the store test suite) loads on first use, so pytest is imported only then."""
    if name == "StoreConformance":
        from ._harness.conformance.suite import StoreConformance

        return StoreConformance
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
