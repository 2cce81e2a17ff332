"""Polling a driven run's inbox and journaling what it holds (DURABILITY 2.3, 2.4).

The holder reads the inbox at least every ``poll_interval`` while tools run or it waits, and before each
append; the length each append reads (``Writer.inbox_hint``) spares a read when nothing was posted since.
While a model request is in flight, items are only held (``hold``), and journaled after its reply.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from .. import journal as j
from .._consume import ArgsCheck, consume
from ..inbox import InboxItem
from .writer import Writer

__all__ = ["InboxWatch"]


class InboxWatch:
    """Reads one driven run's inbox and journals its items through the run's writer.

    Args:
        writer: the run's writer task.
        poll_interval: seconds between reads (the agent's ``poll_interval``).
        before_cancel: awaited before a cancel item is journaled: the run's open subagent runs are cancelled
            first (DURABILITY 6).
        check_args: validates a person's edited arguments when their decision is journaled.
    """

    def __init__(
        self,
        writer: Writer,
        poll_interval: float,
        before_cancel: Callable[[], Awaitable[None]],
        check_args: ArgsCheck | None = None,
    ) -> None:
        self.writer = writer
        self.check_args = check_args
        self.poll_interval = poll_interval
        self.before_cancel = before_cancel
        self._held: list[InboxItem] = []  # read during a model request, journaled after its reply

    async def read(self) -> list[InboxItem]:
        """The items past those consumed or held, read from the store (none when the last append's read of
        the inbox's length, less than a poll interval ago, shows nothing new)."""
        writer = self.writer
        state, store = writer.journal.state, writer.store
        known = state.inbox_consumed
        if self._held:
            known = max(known, max(i.inbox_seq for i in self._held))
        hinted, when = writer.inbox_hint
        if hinted <= known + 1 and time.monotonic() - when < self.poll_interval:
            return []
        length = await store.ainbox_length(state.id)
        writer.inbox_hint = (length, time.monotonic())
        if length <= known + 1:
            return []
        return await store.aread_inbox(state.id, known)

    def hold(self, items: list[InboxItem]) -> None:
        """Keep items read while a model request is in flight, to journal after its reply."""
        seen = {item.inbox_seq for item in self._held}
        self._held.extend(item for item in items if item.inbox_seq not in seen)

    def journal_held(self) -> bool:
        """Journal the held items (right after the reply); returns whether a message was among them."""
        items = self._held
        if not items:
            return False
        self._held = []
        consume(self.writer.journal, items, self.check_args)
        return any(item.type == "message" for item in items)

    async def consume(self) -> bool:
        """Journal every unconsumed item, acting on it (as the holder); returns whether there were any."""
        items = self._held + await self.read()
        self._held = []
        if not items:
            return False
        state = self.writer.journal.state
        if any(item.type == "cancel" for item in items) and state.status not in j.STOP_STATUSES:
            await self.before_cancel()
        consume(self.writer.journal, items, self.check_args)
        self.writer.act()
        return True

    async def consume_stopping(self) -> None:
        """Journal new items without acting on them: the drive is stopping (DURABILITY 1.6)."""
        consume(self.writer.journal, await self.read(), self.check_args)
