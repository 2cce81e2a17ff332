"""JournalWriter: the entries one writer adds to a run, folded at once, appended in sealed batches.

A ``State`` is the fold of a journal and nothing else. Whoever writes to a run (a driver, a short-lived
taker such as ``store.save``, a fork) makes its entries through a ``JournalWriter``: each new entry is folded
into the State the moment it is made, so the writer can plan its next step from the State; the entries not
yet durable wait here until an append takes them. ``next_batch`` seals them (writer id, countdown ``b``,
checksum ``h``, DURABILITY 3) where the State holds them (a format 1–2 journal: hands it sealed copies), so the
fold holds exactly the entries a later ``store.load`` returns; a retried append resends that batch
byte-identical.
"""

from __future__ import annotations

from typing import Any

from . import journal as j
from ._encodable import journal_safe
from .state import State

__all__ = ["JournalWriter"]


class JournalWriter:
    """One writer's new entries for one run.

    Args:
        state: the run as this writer has read it; every entry of its history is durable.
        writer_id: the writer id stamped on each entry (``w``); by default a fresh one. A taker uses the
            writer id of its lease's owner.
    """

    def __init__(self, state: State, writer_id: str | None = None) -> None:
        self.state = state
        self.writer_id = writer_id or j.new_writer_id()
        self._saved = len(state.history)
        self._batch: list[j.Entry] | None = None

    def __repr__(self) -> str:
        return f"JournalWriter(run={self.state.id!r}, writer={self.writer_id[:8]!r}, unsaved={self.unsaved})"

    def add(self, entry_type: type[j.Entry], **fields: Any) -> j.Entry:
        """Make the next entry, fold it into the State, and keep it until an append takes it.

        A journal begun in format 1 is appended to in format 2, each entry carrying ``v`` 2 (so a format-1
        tether refuses the journal as newer, DESIGN 4); a format-2 journal stays format 2, a format-3 one
        format 3 (``docs/journal-format.md``). Lone surrogates in its strings become U+FFFD before it is
        folded (``tether._encodable``), so the State holds what a load returns.

        Raises:
            UnencodableError: a field holds a value no journal can hold; nothing was added.
        """
        fields = journal_safe(fields, f"run {self.state.id}: a {entry_type.kind} entry")
        if self.state.format_version < j.LEGACY_VERSION and entry_type is not j.RunStarted:
            fields.setdefault("v", j.LEGACY_VERSION)
        entry = entry_type(seq=len(self.state.history), at=j.now_iso(), **fields)
        self.state.apply(entry)
        return entry

    @property
    def unsaved(self) -> int:
        """How many entries of the State's history are not durable yet (the batch in flight included)."""
        return len(self.state.history) - self._saved

    @property
    def saved(self) -> int:
        """How many entries are durable: the store's journal length as this writer knows it."""
        return self._saved

    def next_batch(self) -> list[j.Entry]:
        """The append to send now: the batch in flight (byte-identical on retry), else every unsaved entry.

        Sealing stamps the State's own entries (in a format 1–2 journal, replaces them with sealed copies).
        """
        if self._batch is None:
            state = self.state
            if state.format_version >= j.FORMAT_VERSION:  # stamped where they are: the State holds them
                self._batch = j.seal_own(state.history[self._saved :], self.writer_id, run_id=state.id)
            else:
                self._batch = j.seal(
                    state.history[self._saved :],
                    self.writer_id,
                    run_id=state.id,
                    version=state.format_version,
                )
                state.take_sealed(self._batch)
        return self._batch

    def batch_saved(self) -> None:
        """The batch from ``next_batch`` is durable."""
        batch = self._batch
        if batch is not None:
            forget = j.forget_line
            for entry in batch:
                forget(entry)  # durable now: the State need not hold its bytes
            self._saved += len(batch)
            self._batch = None

    def caught_up(self) -> None:
        """Every entry of the State's history is durable (the caller read them from the store)."""
        self._batch = None
        self._saved = len(self.state.history)
