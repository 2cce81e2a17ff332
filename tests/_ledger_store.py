"""A store as another package would ship one: its own class and URL scheme (``ledger:///abs/path.db``).

SQLite underneath (the storage is not the point): what matters is that only its package knows the scheme,
so ``open_store`` reaches it through ``register_scheme`` (or an entry point), in this process and in the
conformance suite's child processes.
"""

from __future__ import annotations

from tether.stores.sqlite import SQLiteStore

SCHEME = "ledger"


class LedgerStore(SQLiteStore):
    """A third party's store, reached by ``ledger:///PATH`` URLs."""

    @property
    def identity(self) -> str:
        return f"{SCHEME}://{self.path}"


def open_ledger(url: str) -> LedgerStore:
    """The factory registered for ``ledger:``: ``ledger:///abs/path.db`` (or ``ledger:rel.db``)."""
    _, _, rest = url.partition(":")
    path = rest[2:] if rest.startswith("//") else rest
    if not path:
        raise ValueError(f"store URL {url!r} names no file. Fix: ledger:///abs/path.db")
    return LedgerStore(path)
