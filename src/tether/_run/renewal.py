"""Keeping a drive's lease, and the drives SIGTERM cancels (DURABILITY 4, DESIGN 5.4)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from ..errors import LeaseLostError
from ..stores.base import Lease, Store

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


class Renewer(threading.Thread):
    """Renews a ttl lease every ttl/4 from its own thread; cancels the drive after ttl/2 without success."""

    def __init__(self, store: Store, lease: Lease, ttl: float, on_lost: Callable[[], None]) -> None:
        super().__init__(name=f"tether-renew-{lease.run_id}", daemon=True)
        self.store, self.lease, self.ttl, self.on_lost = store, lease, ttl, on_lost
        self.last_ok = time.monotonic()
        self.stop_event = threading.Event()
        self.lost = False

    def run(self) -> None:
        while not self.stop_event.wait(self.ttl / 4):
            try:
                self.lease = self.store.renew(self.lease)
                self.last_ok = time.monotonic()
            except LeaseLostError:
                self.lost = True
            except Exception as exc:  # a failed renewal is retried; too many stop the drive below
                log.warning("renewing run %s failed: %s", self.lease.run_id, exc)
            if self.lost or time.monotonic() - self.last_ok > self.ttl / 2:
                self.lost = True
                self.on_lost()
                return

    def fresh(self) -> bool:
        """Whether the last successful renewal is younger than ttl/2 (a tool may start)."""
        return not self.lost and time.monotonic() - self.last_ok <= self.ttl / 2
