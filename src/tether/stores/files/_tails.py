"""What a FileStore object keeps of each run's files between calls, so no call re-reads history.

See ``tether.stores.files``. Each cached state is checked before use (``stat``/``fstat``: size, inode,
modification time), so a write by another process or store object is seen.
"""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Callable
from typing import Any

from ...errors import RunNotFoundError
from . import _lock as fl
from . import _tail as ft
from ._info import full_record, static_of

__all__ = ["TailCache"]


class TailCache:
    """Per run: the journal's tail (size, length, last append), the inbox's, and the static fields of the
    journal's last full listing line.

    Args:
        jlock: the thread lock of a run's journal (the store's stripe), held while its tail is refreshed.
    """

    def __init__(self, jlock: Callable[[str], threading.RLock]) -> None:
        self._jlock = jlock
        self.journals: dict[str, ft.JTail] = {}
        self.inboxes: dict[str, ft.ITail] = {}
        self.fulls: dict[str, tuple[bytes, tuple[Any, ...] | None]] = {}  # see ``last_static``

    def journal(self, run_id: str, jpath: str) -> ft.JTail:
        """The journal's tail state: one ``stat`` when cached and unchanged, else one tail block."""
        with self._jlock(run_id):
            try:
                st = os.stat(jpath)
            except FileNotFoundError:
                raise RunNotFoundError(run_id) from None
            cached = self.journals.get(run_id)
            if cached is not None and ft.same(cached, st):
                return cached
            with fl.locked(run_id, jpath, os.O_RDONLY, fcntl.LOCK_SH) as fd, ft.lines_named(jpath):
                tail = self.journals[run_id] = ft.refresh_journal(run_id, fd, os.fstat(fd), cached)
                return tail

    def last_static(self, run_id: str, tail: ft.JTail) -> tuple[Any, ...] | None:
        """The ``STATIC`` fields of the journal's last full listing line, or None (then the next line is a
        full one).

        Decoded once per line: they are kept with the line they came from (the tail carries the same
        bytes object from append to append until a full line is written again).
        """
        line = tail.full_line
        seen = self.fulls.get(run_id)
        if seen is not None and seen[0] is line:
            return seen[1]
        try:
            found = static_of(full_record(line)) if line else None
        except (ValueError, KeyError, TypeError):
            found = None
        self.fulls[run_id] = (line, found)
        return found

    def inbox(self, run_id: str, fd: int) -> ft.ITail:
        """The inbox's state; the caller holds a flock on ``fd``."""
        tail = self.inboxes[run_id] = ft.refresh_inbox(run_id, fd, os.fstat(fd), self.inboxes.get(run_id))
        return tail
