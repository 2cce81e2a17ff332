"""Stores: where runs live (DESIGN 8). ``open_store(url)`` picks one from a URL."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .base import Lease, Owner, RunInfo, Store
from .memory import MemoryStore

if TYPE_CHECKING:
    from .files.store import FileStore
    from .postgres.store import PostgresStore
    from .sqlite.store import SQLiteStore

__all__ = [
    "FileStore",
    "Lease",
    "MemoryStore",
    "Owner",
    "PostgresStore",
    "RunInfo",
    "SQLiteStore",
    "Store",
    "open_store",
]


def __getattr__(name: str) -> Any:
    """FileStore and SQLiteStore are imported on first use: ``import tether`` stays cheap."""
    if name == "FileStore":
        from .files.store import FileStore

        return FileStore
    if name == "SQLiteStore":
        from .sqlite.store import SQLiteStore

        return SQLiteStore
    if name == "PostgresStore":
        from .postgres.store import PostgresStore  # psycopg is imported here, on first use only

        return PostgresStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def open_store(url: str) -> Store:
    """A store from a URL: ``sqlite:///rel.db`` / ``sqlite:////abs.db``, ``file:PATH`` (or a plain path), ``memory:``.

    ``open_store(store.identity)`` opens the same store again.

    Raises:
        ValueError: the URL's scheme is not known, or it names no path.
    """
    if not isinstance(url, str) or not url.strip():
        raise ValueError("store URL is empty. Fix: pass 'file:runs', 'memory:' or 'sqlite:///path/runs.db'")
    if url == "memory:" or url == "memory://":
        return MemoryStore()
    scheme, sep, rest = url.partition(":")
    if not sep or "/" in scheme or "\\" in scheme or len(scheme) == 1:  # a plain path (or C:\ on Windows)
        from .files.store import FileStore

        return FileStore(url)
    if scheme == "file":
        path = rest[2:] if rest.startswith("//") else rest
        if not path:
            raise ValueError(f"store URL {url!r} names no folder. Fix: 'file:runs' or 'file:///abs/path'")
        from .files.store import FileStore

        return FileStore(path)
    if scheme == "sqlite":
        path = rest[3:] if rest.startswith("///") else rest
        if not path:
            raise ValueError(
                f"store URL {url!r} names no file. Fix: 'sqlite:///runs.db' or 'sqlite:////abs/runs.db'"
            )
        from .sqlite.store import SQLiteStore

        return SQLiteStore(path)
    if scheme in ("postgresql", "postgres"):
        try:
            from .postgres.store import PostgresStore
        except ImportError as exc:
            raise ValueError(
                f"store URL {url!r} needs psycopg ({exc}). Fix: pip install 'tether[postgres]'"
            ) from None
        return PostgresStore(url)
    raise ValueError(
        f"store URL {url!r} has an unknown scheme {scheme!r}. Fix: use 'sqlite:///PATH', 'file:PATH' or "
        "'memory:' (or postgresql://USER@HOST/DB)"
    )
