"""Stores: where runs live (DESIGN 8). ``open_store(url)`` picks one from a URL."""

from __future__ import annotations

from .base import Lease, Owner, RunInfo, Store
from .files import FileStore
from .memory import MemoryStore

__all__ = ["FileStore", "Lease", "MemoryStore", "Owner", "RunInfo", "Store", "open_store"]


def open_store(url: str) -> Store:
    """A store from a URL: ``memory:``, ``file:PATH`` (or a plain path).

    Raises:
        ValueError: the URL's scheme is not known, or it names no path.
    """
    if not isinstance(url, str) or not url.strip():
        raise ValueError("store URL is empty. Fix: pass 'file:runs', 'memory:' or 'sqlite:///path/runs.db'")
    if url == "memory:" or url == "memory://":
        return MemoryStore()
    scheme, sep, rest = url.partition(":")
    if not sep or "/" in scheme or "\\" in scheme or len(scheme) == 1:  # a plain path (or C:\ on Windows)
        return FileStore(url)
    if scheme == "file":
        path = rest[2:] if rest.startswith("//") else rest
        if not path:
            raise ValueError(f"store URL {url!r} names no folder. Fix: 'file:runs' or 'file:///abs/path'")
        return FileStore(path)
    raise ValueError(
        f"store URL {url!r} has an unknown scheme {scheme!r}. Fix: use 'file:PATH' or 'memory:' "
        "(sqlite:// and postgresql:// arrive with their stores)"
    )
