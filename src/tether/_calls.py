"""The fold's record of each tool call, and what a resume would do with it (DESIGN 7)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from .journal import RETRY_EFFECTS

__all__ = ["ABORTED_UNKNOWN", "Action", "CallRecord", "DecisionRecord", "OpenCall", "PendingApproval"]

Action = Literal["run", "retry", "abort", "deny", "wait", "resume_child"]

ABORTED_UNKNOWN = (
    "unknown: the run stopped before this result was saved, so the tool may or may not have run. Check "
    "whether it took effect before relying on it or running it again"
)


@dataclass(frozen=True, slots=True)
class PendingApproval:
    """A call waiting for a person's decision."""

    call_id: str
    tool: str
    args: Any
    asked_at: str
    run_id: str
    round: int = 0
    question: str | None = None


@dataclass(frozen=True, slots=True)
class OpenCall:
    """A call without a ``tool_finished``, and what a resume would do with it.

    ``action`` is ``run`` (never started, or approved), ``retry`` (cut off; same key, ``attempt`` + 1),
    ``abort`` (closed ``aborted``), ``deny`` (closed ``denied``), ``wait`` (approval pending) or
    ``resume_child`` (a subagent).
    """

    call_id: str
    tool: str
    args: Any
    action: Action
    attempt: int
    effect: str | None
    reason: str


@dataclass(slots=True)
class DecisionRecord:
    approved: bool
    round: int
    by: str | None
    reason: str | None
    at: str


@dataclass(slots=True)
class CallRecord:
    call_id: str
    tool: str
    args: Any
    provider_call_id: str | None
    index: int
    attempt: int = 0
    effect: str | None = None
    key: str | None = None
    max_attempts: int | None = None
    started_after_decision: bool = False
    outcome: str | None = None
    open_round: int | None = None
    last_round: int = -1
    asked_at: str = ""
    question: str | None = None
    decision: DecisionRecord | None = None
    child_id: str | None = None  # set by child_waiting: the subagent run this call waits on
    child_pending: list[dict[str, Any]] | None = None  # that child's calls waiting for a decision

    def plan(self) -> tuple[Action, str]:
        """What a resume would do with this call, from what the journal recorded."""
        if self.open_round is not None:
            return "wait", "waiting for a decision"
        if self.child_id is not None:
            return "wait", f"waiting for its subagent run {self.child_id}"
        if self.decision is not None and not self.started_after_decision:
            if not self.decision.approved:
                return ("abort" if self.decision.round > 0 else "deny"), self.decision.reason or "denied"
            return "run", f"approved by {self.decision.by or 'someone'}"
        if self.attempt == 0:
            return "run", "never started"
        if self.effect == "resumable":
            return "resume_child", "its subagent run is resumed"
        if self.effect in RETRY_EFFECTS:
            limit = self.max_attempts or 3
            if self.attempt >= limit:
                return "abort", f"gave up after {self.attempt} attempts, each cut off"
            return "retry", f"cut off; {self.effect}, so it runs again (attempt {self.attempt + 1})"
        return "abort", ABORTED_UNKNOWN
