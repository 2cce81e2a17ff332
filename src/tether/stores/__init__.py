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
        raise ValueError(
            f"store URL {url!r} names a memory store, but a memory store has no name or path: each is a new, "
            "empty store that lives in this process only. Fix: 'memory:' (and pass that store object to "
            "whoever needs it), or a store other processes can open, e.g. 'sqlite:///runs.db'"
        )
    if not sep or "/" in scheme or "\\" in scheme or len(scheme) == 1:  # a plain path (or C:\ on Windows)
        if not _is_path(url):
            raise ValueError(
                f"store URL {url!r} has no scheme, so it may be a folder or a file. Fix: {_guess(url)}"
            )
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
    factory = _schemes.factory_for(scheme)
    if factory is not None:
        made = factory(url)
        if not isinstance(made, Store):
            raise TypeError(
                f"the factory of store URL scheme {scheme!r} returned {made!r}, not a tether Store. Fix: return "
                "an instance of a tether.Store subclass"
            )
        return made
    others = "".join(f", '{name}:...'" for name in _schemes.known_schemes())
    raise ValueError(
        f"store URL {url!r} has an unknown scheme {scheme!r}. Fix: use 'sqlite:///PATH', 'file:PATH', "
        f"'memory:' or postgresql://USER@HOST/DB{others} (a store package adds its scheme with "
        "tether.stores.register_scheme or an entry point in the group tether.stores)"
    )


_SQLITE_SUFFIXES = (".db", ".sqlite", ".sqlite3")


def _is_path(url: str) -> bool:
    """Whether a URL without a scheme is plainly a path: it has a slash, or starts with ``~``, ``.`` or ``..``."""
    return "/" in url or "\\" in url or url.startswith("~") or url in (".", "..") or url[1:2] == ":"


def _guess(word: str) -> str:
    """The fix for a bare word given as a store URL: what the user most likely meant."""
    lower = word.lower()
    if lower in ("memory", "sqlite", "file", "postgres", "postgresql"):
        return {
            "memory": "'memory:' for a store in this process",
            "sqlite": "'sqlite:///runs.db' for a SQLite file",
            "file": "'file:runs' for a folder of runs",
        }.get(lower, "'postgresql://USER@HOST/DB' for PostgreSQL")
    if lower.endswith(_SQLITE_SUFFIXES):
        return f"'sqlite:///{word}' for a SQLite file here (or 'file:{word}' for a folder of that name)"
    return f"'file:{word}' (or './{word}') for a folder of runs, or 'sqlite:///{word}.db' for a SQLite file"
