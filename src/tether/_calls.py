"""The fold's record of each tool call, and what a resume would do with it (DESIGN 7)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import orjson

from .journal import RETRY_EFFECTS

__all__ = [
    "ABORTED_UNKNOWN",
    "Action",
    "CallRecord",
    "DecisionRecord",
    "OpenCall",
    "PendingApproval",
    "decision_body",
    "edited_args",
    "edited_note",
]

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
    args: dict[str, Any] | None = None  # the arguments a person approved the call with, when edited


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

    @property
    def edited_args(self) -> dict[str, Any] | None:
        """The arguments a person approved this call with in place of the model's, or None."""
        decision = self.decision
        return decision.args if decision is not None and decision.approved else None

    @property
    def run_args(self) -> Any:
        """The arguments the call runs with: a person's edited ones, else the model's."""
        edited = self.edited_args
        return edited if edited is not None else self.args

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


def edited_note(call: CallRecord) -> dict[str, Any] | None:
    """The text block the model sees before the result of a call a person approved with other arguments.

    The journal keeps the fact once (``approval_decided.args``); the fold puts this note in the call's
    result, so every process shows the model the same thing: who changed the arguments, from what, to what.
    """
    edited, decision = call.edited_args, call.decision
    if edited is None or decision is None:
        return None
    who = decision.by or "a person"
    asked = orjson.dumps(call.args).decode()
    given = orjson.dumps(edited).decode()
    why = f" (reason: {decision.reason})" if decision.reason else ""
    text = (
        f"Note: {who} approved this call with changed arguments{why}. You asked for {asked}; {who} changed "
        f"them to {given}. What follows is the result for the changed arguments."
    )
    return {"type": "text", "text": text}


def edited_args(args: Any) -> dict[str, Any] | None:
    """``args`` (a person's edited arguments) if it is None or a JSON object, else raise ValueError."""
    if args is None:
        return None
    try:
        ok = isinstance(args, dict) and all(isinstance(k, str) for k in args) and orjson.dumps(args) != b""
    except TypeError:
        ok = False
    if not ok:
        raise ValueError(
            f"args {args!r} is not a JSON object of arguments. Fix: pass a dict such as "
            '{"amount": 50}, with the names the tool takes'
        )
    return dict(args)


def decision_body(
    call_id: str, round_: int, approved: bool, by: str | None, reason: str | None, args: dict[str, Any] | None
) -> dict[str, Any]:
    """The fields of a decision's inbox item (``args`` only when a person edited the arguments).

    Raises:
        ValueError: edited arguments for an ``on_unknown`` question (round > 0), which re-runs a call as it was.
    """
    if args is not None and round_ > 0:
        raise ValueError(
            f"call {call_id} is asked about because a crash cut it off; it runs again as it was, so its "
            "arguments cannot be changed. Fix: approve it without args, or deny it"
        )
    body = {"call_id": call_id, "round": round_, "approved": approved, "by": by, "reason": reason}
    return body if args is None else {**body, "args": args}
