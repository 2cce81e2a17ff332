"""Store URL schemes beyond tether's own, and ``open_store``'s words for URLs it cannot open.

Other packages add schemes with ``register_scheme(name, factory)`` or the entry point group ``tether.stores``
(each entry point's name is a scheme, its object the factory), read on first use of a scheme ``open_store``
does not know itself. A factory takes the whole URL and returns a Store.

```toml
# a store package's pyproject.toml
[project.entry-points."tether.stores"]
redis = "tether_redis:open_redis_store"     # open_store("redis://host/0") calls open_redis_store(url)
```
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable

from .base import Store

__all__ = [
    "BUILT_IN",
    "ENTRY_POINT_GROUP",
    "StoreFactory",
    "bare_word_error",
    "factory_for",
    "memory_name_error",
    "open_registered",
    "register_scheme",
    "registered",
    "unknown_scheme_error",
]

StoreFactory = Callable[[str], Store]
"""Makes a store from its whole URL (``redis://host/0``)."""

ENTRY_POINT_GROUP = "tether.stores"
"""The entry point group store packages list their schemes in."""

BUILT_IN = frozenset({"file", "sqlite", "postgresql", "postgres", "memory"})
"""The schemes ``open_store`` knows itself; no package may take them."""

_NAME = re.compile(r"[a-z][a-z0-9+.-]*")  # RFC 3986's scheme, lower case
_lock = threading.Lock()
_registered: dict[str, StoreFactory] = {}
_loaded: dict[str, StoreFactory] = {}  # from entry points, on first use


def _check_name(scheme: object) -> str:
    if not isinstance(scheme, str) or not _NAME.fullmatch(scheme) or len(scheme) < 2:
        raise ValueError(
            f"store URL scheme {scheme!r} is not a scheme name. Fix: lower-case letters, digits, '+', '-' or "
            "'.', starting with a letter and at least 2 characters (e.g. 'redis')"
        )
    if scheme in BUILT_IN:
        raise ValueError(
            f"store URL scheme {scheme!r} is tether's own. Fix: register your store under another name"
        )
    return scheme


def register_scheme(scheme: str, factory: StoreFactory, *, replace: bool = False) -> None:
    """Have ``open_store("SCHEME:...")`` (and ``tether --store``) open a store with ``factory(url)``.

    The conformance suite's multi-process cases register the same factory in each child process (it
    travels by reference: a module-level function or class); an entry point in the group ``tether.stores``
    needs no registering at all.

    Args:
        scheme: the URL scheme, without the colon (``"redis"``).
        factory: called with the whole URL; returns a Store.
        replace: replace another factory registered for ``scheme`` (otherwise that is an error).

    Raises:
        ValueError: the name is not a scheme, is one of tether's own, or has another factory already.
        TypeError: ``factory`` is not callable.
    """
    name = _check_name(scheme)
    if not callable(factory):
        raise TypeError(f"factory for scheme {name!r} is {factory!r}. Fix: pass a callable taking the URL")
    with _lock:
        known = _registered.get(name)
        if known is not None and known != factory and not replace:
            raise ValueError(
                f"store URL scheme {name!r} is registered already (to {_describe(known)}). Fix: pick another "
                "name, or pass replace=True"
            )
        _registered[name] = factory


def registered() -> dict[str, StoreFactory]:
    """The schemes registered with ``register_scheme`` in this process (not those of entry points)."""
    with _lock:
        return dict(_registered)


def factory_for(scheme: str) -> StoreFactory | None:
    """The factory of ``scheme``: registered in this process, else from an entry point; None when neither.

    Raises:
        ValueError: the entry point for ``scheme`` cannot be loaded (its package is broken or missing).
    """
    with _lock:
        found = _registered.get(scheme) or _loaded.get(scheme)
    if found is not None or scheme in BUILT_IN:
        return found
    from importlib import metadata  # only for a scheme tether does not know: import tether stays cheap

    points = [ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP) if ep.name == scheme]
    if not points:
        return None
    point = points[0]
    try:
        loaded = point.load()
    except Exception as exc:
        source = f" of {point.dist.name}" if point.dist is not None else ""
        raise ValueError(
            f"store URL scheme {scheme!r} comes from entry point {point.value!r}{source} (group "
            f"{ENTRY_POINT_GROUP}), which cannot be loaded: {type(exc).__name__}: {exc}. Fix: reinstall that "
            "package, or uninstall it"
        ) from exc
    if not callable(loaded):
        raise ValueError(
            f"entry point {point.value!r} for store URL scheme {scheme!r} is not callable. Fix: point it at a "
            "function (or class) taking the URL"
        )
    with _lock:
        _loaded[scheme] = loaded
    return loaded


def known_schemes() -> list[str]:
    """Every scheme a URL may use here: tether's own, registered ones, entry points' (for error messages)."""
    with _lock:
        names = set(_registered) | set(_loaded)
    try:
        from importlib import metadata

        names |= {ep.name for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}
    except Exception:  # a broken installation never hides the error being reported
        pass
    return sorted(names - BUILT_IN)


def _describe(factory: StoreFactory) -> str:
    module = getattr(factory, "__module__", None)
    name = getattr(factory, "__qualname__", None)
    return f"{module}.{name}" if module and name else repr(factory)


def open_registered(scheme: str, url: str) -> Store | None:
    """The store a registered (or entry point) factory makes for ``url``; None when ``scheme`` has none.

    Raises:
        TypeError: the factory returned something that is not a Store.
        ValueError: the scheme's entry point cannot be loaded.
    """
    factory = factory_for(scheme)
    if factory is None:
        return None
    made = factory(url)
    if not isinstance(made, Store):
        raise TypeError(
            f"the factory of store URL scheme {scheme!r} returned {made!r}, not a tether Store. Fix: return "
            "an instance of a tether.Store subclass"
        )
    return made


def unknown_scheme_error(url: str, scheme: str) -> ValueError:
    """The error of a URL whose scheme nothing here knows (the schemes that exist are offered)."""
    others = "".join(f", '{name}:...'" for name in known_schemes())
    return ValueError(
        f"store URL {url!r} has an unknown scheme {scheme!r}. Fix: use 'sqlite:///PATH', 'file:PATH', "
        f"'memory:' or postgresql://USER@HOST/DB{others} (a store package adds its scheme with "
        "tether.stores.register_scheme or an entry point in the group tether.stores)"
    )


def memory_name_error(url: str) -> ValueError:
    """The error of ``memory:NAME``: a MemoryStore has no name (each is its own, in one process)."""
    return ValueError(
        f"store URL {url!r} names a memory store, but a memory store has no name or path: each is a new, "
        "empty store that lives in this process only. Fix: 'memory:' (and pass that store object to "
        "whoever needs it), or a store other processes can open, e.g. 'sqlite:///runs.db'"
    )


_SQLITE_SUFFIXES = (".db", ".sqlite", ".sqlite3")


def bare_word_error(url: str) -> ValueError | None:
    """The error of a URL without a scheme that is not plainly a path (``runs``: a folder or a file?); None
    for a path: a slash, or a start of ``~``, ``.``, ``..`` or a drive letter."""
    if "/" in url or "\\" in url or url.startswith("~") or url in (".", "..") or url[1:2] == ":":
        return None
    return ValueError(f"store URL {url!r} has no scheme, so it may be a folder or a file. Fix: {_guess(url)}")


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
