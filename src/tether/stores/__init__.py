"""Stores: where runs live (DESIGN 8). ``open_store(url)`` picks one from a URL; ``register_scheme`` (or an
entry point in the group ``tether.stores``) adds a scheme for a store of another package."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import _schemes
from ._schemes import register_scheme
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
    "register_scheme",
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
    """A store from a URL: ``sqlite:///rel.db`` / ``sqlite:////abs.db``, ``file:PATH`` (or a path with a
    slash: ``./runs``, ``/srv/runs``), ``memory:``, ``postgresql://...``, or a scheme a store package
    registered (``register_scheme``, or an entry point in the group ``tether.stores``).

    ``open_store(store.identity)`` opens the same store again (except a MemoryStore's ``memory:``, a new one).

    Raises:
        ValueError: the URL's scheme is not known, it names no path, it is a bare word (``runs``: a folder or
            a file?), or it gives a memory store a name (each MemoryStore is its own, in one process).
    """
    if not isinstance(url, str) or not url.strip():
        raise ValueError("store URL is empty. Fix: pass 'file:runs', 'memory:' or 'sqlite:///path/runs.db'")
    scheme, sep, rest = url.partition(":")
    if scheme == "memory" and sep:
        if rest in ("", "//"):
            return MemoryStore()
        raise _schemes.memory_name_error(url)
    if not sep or "/" in scheme or "\\" in scheme or len(scheme) == 1:  # a plain path (or C:\ on Windows)
        if (bare := _schemes.bare_word_error(url)) is not None:
            raise bare
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
    made = _schemes.open_registered(scheme, url)
    if made is not None:
        return made
    raise _schemes.unknown_scheme_error(url, scheme)
