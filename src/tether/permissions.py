"""Permission rules: allow, deny and ask, by tool name glob and by effect (DESIGN 9)."""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from .tools import ApprovalCondition, Tool

__all__ = ["Decision", "Rule", "allow", "ask", "decide", "deny"]

Decision = Literal["allow", "deny", "ask"]


@dataclass(frozen=True, slots=True)
class Rule:
    """One rule: ``decision`` for tools whose name matches ``tools`` (a glob) and, if set, whose effect is
    ``effect``; ``reason`` is what the model sees for a denial. An ask rule with ``when`` applies only to
    the calls for whose validated arguments (a dict) ``when`` returns a truthy value."""

    decision: Decision
    tools: str = "*"
    effect: str | None = None
    reason: str | None = None
    when: ApprovalCondition | None = None

    def matches(self, tool: Tool) -> bool:
        """Whether the rule applies to ``tool``."""
        return fnmatch.fnmatchcase(tool.name, self.tools) and (
            self.effect is None or self.effect == tool.effect
        )


def allow(tools: str = "*", *, effect: str | None = None) -> Rule:
    """Allow matching calls."""
    return Rule("allow", tools, effect)


def deny(tools: str = "*", *, effect: str | None = None, reason: str | None = None) -> Rule:
    """Deny matching calls; the model sees ``reason``."""
    return Rule("deny", tools, effect, reason)


def ask(tools: str = "*", *, effect: str | None = None, when: ApprovalCondition | None = None) -> Rule:
    """Ask a person before matching calls run; with ``when``, only the calls for whose validated arguments
    (a dict, defaults filled in) ``when`` is truthy, e.g. ``ask("refund_*", when=lambda a: a["amount"] > 100)``.

    The condition is evaluated once, when the model's reply is planned; the journal records the outcome (an
    ``approval_requested``, or none), so recovery never evaluates it again.

    Raises:
        TypeError: ``when`` is not callable.
    """
    if when is not None and not callable(when):
        raise TypeError(f"when={when!r} is not callable. Fix: pass a function of the arguments, or None")
    return Rule("ask", tools, effect, when=when)


def decide(
    tool: Tool, rules: Sequence[Rule], default: Decision = "allow", args: dict[str, Any] | None = None
) -> tuple[Decision, str]:
    """The decision for a call of ``tool``: deny > ask (and ``approval=True``) > allow > ``default``.

    An ask whose condition (``Rule.when``, ``@tool(approval=callable)``) is false for ``args`` does not
    apply. A condition that raises asks (failing closed), with the error as the reason. Each condition is
    called at most once, only when no deny rule matches.
    """
    if not rules and tool.approval is False:  # no rule, and no approval of its own: the default
        return default, "" if default != "deny" else f"tool {tool.name} is not allowed by default"
    matched = [rule for rule in rules if rule.matches(tool)]
    denial = next((rule for rule in matched if rule.decision == "deny"), None)
    if denial is not None:
        return "deny", denial.reason or f"a rule denies {tool.name}"
    asks = [rule.when for rule in matched if rule.decision == "ask"]
    if tool.approval is True or callable(tool.approval):
        asks.append(tool.approval if callable(tool.approval) else None)
    for when in asks:
        if when is None:
            return "ask", ""
        try:
            if when(dict(args or {})):
                return "ask", ""
        except Exception as exc:
            return "ask", (
                f"the approval condition of {tool.name} raised {type(exc).__name__}: {exc}; a person decides "
                "instead"
            )
    if any(rule.decision == "allow" for rule in matched):
        return "allow", ""
    return default, "" if default != "deny" else f"tool {tool.name} is not allowed by default"
