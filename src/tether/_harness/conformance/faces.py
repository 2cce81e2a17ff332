"""The two faces the conformance cases run through: a store as it is, and its async twins (DESIGN 8.1).

``AsyncFaced`` wraps a store so that each sync call of a case (``store.read(...)``) awaits the store's twin
(``store.aread(...)``) on an event loop of its own thread, and returns its result. The cases are written
once, against the sync names; run through ``AsyncFaced`` they check the async face to the same contract.
"""

from __future__ import annotations

from typing import Any

from ..._threads import LoopThread
from ...stores.base import PRIMITIVES, Store

__all__ = ["FACES", "AsyncFaced", "through"]

FACES = ("sync", "async")
"""The faces each case runs through: the store's sync methods, and their ``a``-prefixed twins."""

_TWINNED = frozenset(
    (*PRIMITIVES, "load", "exists", "save", "catch_up", "settle", "cancel", "ids_matching", "fork",
     "list_page", "operate")
)  # fmt: skip
_TWIN_OF = {"operate": "aoperate"}


class AsyncFaced:
    """A store whose sync methods run its async twins, each on this object's own event loop thread.

    Every other attribute is the store's own (``identity``, ``ttl``, ``follow``, ...).
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        self._loop = LoopThread(f"tether-conformance-{id(store):x}")

    def __getattr__(self, name: str) -> Any:
        if name not in _TWINNED:
            return getattr(self.store, name)
        twin = getattr(self.store, _TWIN_OF.get(name, f"a{name}"))

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._loop.run(twin(*args, **kwargs))

        call.__name__ = name
        return call

    def __eq__(self, other: object) -> bool:
        return self.store == (other.store if isinstance(other, AsyncFaced) else other)

    def __hash__(self) -> int:
        return hash(self.store)

    def close(self) -> None:
        """Close the store through its twin (``aclose``) on this object's loop, then the loop."""
        self._loop.run(self.store.aclose())
        self._loop.close()


def through(face: str, store: Store) -> Any:
    """``store`` as the cases see it through ``face`` (``"sync"``: the store itself)."""
    return AsyncFaced(store) if face == "async" else store
