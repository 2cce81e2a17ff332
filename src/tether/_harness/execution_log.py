"""``ExecutionLog``: the side file, outside any store, where tools record each execution (DESIGN 14).

Public as ``tether.testing.ExecutionLog``. It lives here so that the crash harness, which writes and reads
such files, never imports ``tether.testing`` (which re-exports the harness: that would be a cycle).
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import Any

import orjson

__all__ = ["ExecutionLog"]


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
