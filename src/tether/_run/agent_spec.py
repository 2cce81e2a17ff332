"""What the driver reads of its agent: ``DrivenAgent``, the part of ``tether.Agent`` the driver uses.

The driver sits below ``tether.agent`` (DESIGN 2: journal ← state ← context ← _run ← agent), so it names
the agent by this protocol and never imports the ``Agent`` class.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal, Protocol

from ..budgets import Price
from ..humans import Human
from ..models.base import Model
from ..output import OutputSpec
from ..permissions import Decision
from ..state import State
from ..stores.base import Store
from ..tools import Tool
from ..tracing import InstrumentSettings

__all__ = ["DrivenAgent", "OnUnknown"]

OnUnknown = Literal["abort", "ask"]
"""What a resume does with a cut-off ``unsafe`` call: close it ``aborted``, or ask a person."""


class DrivenAgent(Protocol):
    """An agent as the driver sees it: its settings, its tools and the questions the driver asks it."""

    name: str
    description: str | None
    model: Model
    instructions: str
    human: Human | None
    on_text: Callable[[str], None] | None
    poll_interval: float
    model_retries: int
    strict_resume: bool
    on_unknown: OnUnknown
    output: OutputSpec | None
    output_retries: int
    compact_at: float | None
    context_window: int
    price: Price | None
    instrument: bool | InstrumentSettings | None

    @property
    def subagents(self) -> Mapping[str, DrivenAgent]:
        """The agents among its tools, by tool name (each call runs as a run of its own)."""

    @property
    def tools(self) -> Mapping[str, Tool]:
        """Its tools by name (subagents included); ``tools.get(name)`` is None for a tool it lacks."""

    def tool_schemas(self) -> list[dict[str, Any]]:
        """The tool schemas the model is shown."""

    def unknown_tool_text(self, name: str) -> str:
        """What the model is told when it calls a tool the agent lacks."""

    def permission_for(self, tool: Tool, args: dict[str, Any]) -> tuple[Decision, str]:
        """The decision for a call of ``tool`` with validated ``args`` under the agent's rules, and its reason
        (conditions are evaluated here, once per call)."""

    def fingerprint(self) -> dict[str, Any]:
        """The model name and hashes of the instructions and tool schemas."""

    def budgets(self) -> dict[str, Any]:
        """The limits recorded in ``run_started``."""

    def budget_exceeded(self, state: State, inherited: dict[str, Any] | None = None) -> str | None:
        """Why no further model request is allowed, or None."""

    def retry_delay_for(self, attempt: int, retry_after: float | None) -> float:
        """Seconds to wait before retrying a failed model request."""

    def lease_ttl_for(self, store: Store) -> float | None:
        """The lease length this agent takes runs of ``store`` for (None: the store's lease is a lock)."""
