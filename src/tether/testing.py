"""Testing helpers: ScriptedModel and ``call``, the side file that records tool executions, the store
conformance suite and the crash harness.

``ScriptedModel(replies)`` answers request number ``request.index`` with ``replies[request.index]``
(DESIGN 3), so a resumed process gets the reply that comes next, and a request cut off by a crash gets the
same reply again.

Importing this module loads only ScriptedModel and ExecutionLog. The store conformance suite
(``StoreConformance``, which imports pytest) and the crash harness (``crash_test`` and its types,
``record_execution``) live in ``tether._harness`` and load on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._harness.execution_log import ExecutionLog
from .models.scripted import ScriptedCall, ScriptedModel, call

if TYPE_CHECKING:
    from ._harness.conformance.suite import StoreConformance
    from ._harness.crash.child import record_execution
    from ._harness.crash.crash_test import CrashCase, CrashReport, InvariantViolation, crash_test

__all__ = [
    "CrashCase",
    "CrashReport",
    "ExecutionLog",
    "InvariantViolation",
    "ScriptedCall",
    "ScriptedModel",
    "StoreConformance",
    "call",
    "crash_test",
    "record_execution",
]

_LAZY = {
    "StoreConformance": "._harness.conformance.suite",
    "CrashCase": "._harness.crash.crash_test",
    "CrashReport": "._harness.crash.crash_test",
    "InvariantViolation": "._harness.crash.crash_test",
    "crash_test": "._harness.crash.crash_test",
    "record_execution": "._harness.crash.child",
}
"""The names that load on first use, and the module each comes from."""


def __getattr__(name: str) -> Any:
    """Load a name of ``_LAZY`` on first use (the conformance suite imports pytest; the crash harness
    starts processes), and keep it here."""
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(where, __package__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
