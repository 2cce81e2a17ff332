"""tether: durable LLM agent runs.

Every step of a run is journaled as it happens; any process that knows a run's id resumes it after a
crash, and a finished tool never runs again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .agent import Agent, handle_sigterm
from .errors import (
    ConflictError,
    CorruptJournalError,
    LeaseLostError,
    ModelError,
    NewerFormatError,
    RunBusyError,
    RunNotFoundError,
    StoreBrokenError,
    StoreFullError,
    StoreLockedError,
    TetherError,
)
from .events import EntryEvent, Event, Reset, TextDelta
from .humans import ApprovalQuestion, Human, HumanDecision, ScriptedHuman, TerminalHuman
from .inbox import InboxItem
from .messages import Message
from .models import Model, ModelReply, ModelRequest
from .permissions import Rule, allow, ask, deny
from .state import OpenCall, PendingApproval, State
from .stores import Lease, MemoryStore, Owner, RunInfo, Store, open_store
from .tools import Tool, ToolContext, ToolInputError, tool
from .tracing import InstrumentSettings, instrument

if TYPE_CHECKING:
    from .stores.files.store import FileStore
    from .stores.postgres.store import PostgresStore
    from .stores.sqlite.store import SQLiteStore
    from .worker import Worker

__all__ = [
    "Agent",
    "ApprovalQuestion",
    "ConflictError",
    "CorruptJournalError",
    "EntryEvent",
    "Event",
    "FileStore",
    "Human",
    "HumanDecision",
    "InboxItem",
    "InstrumentSettings",
    "Lease",
    "LeaseLostError",
    "MemoryStore",
    "Message",
    "Model",
    "ModelError",
    "ModelReply",
    "ModelRequest",
    "NewerFormatError",
    "OpenCall",
    "Owner",
    "PendingApproval",
    "PostgresStore",
    "Reset",
    "Rule",
    "RunBusyError",
    "RunInfo",
    "RunNotFoundError",
    "SQLiteStore",
    "ScriptedHuman",
    "State",
    "Store",
    "StoreBrokenError",
    "StoreFullError",
    "StoreLockedError",
    "TerminalHuman",
    "TetherError",
    "TextDelta",
    "Tool",
    "ToolContext",
    "ToolInputError",
    "Worker",
    "allow",
    "ask",
    "deny",
    "handle_sigterm",
    "instrument",
    "open_store",
    "tool",
]

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    """FileStore, SQLiteStore, PostgresStore and Worker load on first use: ``import tether`` stays cheap."""
    if name in ("FileStore", "SQLiteStore", "PostgresStore"):
        from . import stores

        return getattr(stores, name)
    if name == "Worker":
        from .worker import Worker

        return Worker
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
