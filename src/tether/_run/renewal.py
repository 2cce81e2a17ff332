"""Keeping a drive's lease, and the drives SIGTERM cancels (DURABILITY 4, DESIGN 5.4).

Each ttl drive renews its lease every ttl/4 off the event loop, from renewal threads; one dedicated
thread per process times them all, so driving many runs at once starts no thread per run.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._threads import Threads
from ..errors import LeaseLostError
from ..stores.base import Lease, Store

if TYPE_CHECKING:
    import asyncio  # loaded with the first drive, not by ``import tether`` (DESIGN 13: import time)

__all__ = ["ACTIVE_DRIVES", "Renewer", "cancel_all_drives", "sigterm_received"]

log = logging.getLogger("tether")

_SIGTERM = threading.Event()
ACTIVE_DRIVES: set[tuple[asyncio.AbstractEventLoop, asyncio.Task[Any]]] = set()


def sigterm_received() -> bool:
    """Whether ``handle_sigterm``'s handler has fired in this process."""
    return _SIGTERM.is_set()


def cancel_all_drives() -> bool:
    """Cancel every drive of this process (thread-safe; used by the SIGTERM handler).

    Returns whether there was any drive to cancel.
    """
    _SIGTERM.set()
    active = list(ACTIVE_DRIVES)
    for loop, task in active:
        loop.call_soon_threadsafe(task.cancel)
    return bool(active)


class Renewer:
    """Renews one drive's ttl lease every ttl/4; cancels the drive (``on_lost``) after ttl/2 without success.

    The renewals of every drive of the process are timed by one dedicated thread (``_Renewals``), which
    hands each due renewal to a renewal thread of its own (idle ones are reused), so a drive costs no
    thread start and a slow renewal never delays another's.
    """

    def __init__(self, store: Store, lease: Lease, ttl: float, on_lost: Callable[[], None]) -> None:
        self.store, self.lease, self.ttl, self.on_lost = store, lease, ttl, on_lost
        self.last_ok = time.monotonic()
        self.lost = False
        self.stopped = False
        self.releasing = False  # the drive is letting the lease go: a renewal finding none is no loss

    def start(self) -> None:
        """Renew from now on, the first time ttl/4 from now."""
        _renewals().add(self, time.monotonic() + self.ttl / 4)

    def stop(self) -> None:
        """No more renewals (one in progress finishes; its outcome is ignored)."""
        self.stopped = True

    def renew(self) -> bool:
        """One renewal (on a renewal thread); returns whether to renew again in ttl/4."""
        if self.stopped:
            return False
        try:
            self.lease = self.store.renew(self.lease)
            self.last_ok = time.monotonic()
        except LeaseLostError:
            if self.releasing:  # released meanwhile (the release's outcome says whether it was): stop
                return False
            self.lost = True
        except Exception as exc:  # a failed renewal is retried; too many stop the drive below
            log.warning("renewing run %s failed: %s", self.lease.run_id, exc)
        if self.stopped:
            return False
        if self.lost or time.monotonic() - self.last_ok > self.ttl / 2:
            self.lost = True
            self.on_lost()
            return False
        return True

    def fresh(self) -> bool:
        """Whether the last successful renewal is younger than ttl/2 (a tool may start)."""
        return not self.lost and time.monotonic() - self.last_ok <= self.ttl / 2


class _Renewals:
    """The process's renewal timer: one thread that starts each drive's renewal when it is due."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self._due: list[tuple[float, int, Renewer]] = []  # a heap, by when each renewal is due
        self._count = itertools.count()
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None
        self._calls = Threads("tether-renew")  # the renewals themselves (store calls that may be slow)

    def add(self, renewer: Renewer, due: float) -> None:
        with self._changed:
            heapq.heappush(self._due, (due, next(self._count), renewer))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="tether-renewals", daemon=True)
                self._thread.start()
            self._changed.notify()

    def _run(self) -> None:
        while True:
            with self._changed:
                while True:
                    while self._due and self._due[0][2].stopped:
                        heapq.heappop(self._due)
                    if not self._due:
                        self._changed.wait()
                        continue
                    wait = self._due[0][0] - time.monotonic()
                    if wait <= 0:
                        renewer = heapq.heappop(self._due)[2]
                        break
                    self._changed.wait(wait)
            self._start(renewer)

    def _start(self, renewer: Renewer) -> None:
        def renew() -> None:
            try:
                again = renewer.renew()
            except BaseException:  # never: renew() catches what the store raises; keep renewing all the same
                log.exception("renewing run %s failed", renewer.lease.run_id)
                again = not renewer.stopped
            if again:
                self.add(renewer, time.monotonic() + renewer.ttl / 4)

        try:
            self._calls.submit(renew)
        except RuntimeError:  # no thread could be started: renew on this one
            renew()


_RENEWALS: list[_Renewals] = []


def _renewals() -> _Renewals:
    """This process's renewal timer (a new one in a forked child, where the parent's thread is gone)."""
    if not _RENEWALS or _RENEWALS[0].pid != os.getpid():
        with _RENEWALS_LOCK:
            if not _RENEWALS or _RENEWALS[0].pid != os.getpid():
                _RENEWALS[:] = [_Renewals()]
    return _RENEWALS[0]


_RENEWALS_LOCK = threading.Lock()
