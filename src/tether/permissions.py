"""Permission rules: allow, deny and ask, by tool name glob and by effect (DESIGN 9)."""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from .tools import Tool

__all__ = ["Decision", "Rule", "allow", "ask", "decide", "deny"]

Decision = Literal["allow", "deny", "ask"]
_PRECEDENCE: dict[str, int] = {"deny": 0, "ask": 1, "allow": 2}


@dataclass(frozen=True, slots=True)
class Rule:
    """One rule: ``decision`` for tools whose name matches ``tools`` (a glob) and, if set, whose effect is
    ``effect``; ``reason`` is what the model sees for a denial."""

    decision: Decision
    tools: str = "*"
    effect: str | None = None
    reason: str | None = None

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


def ask(tools: str = "*", *, effect: str | None = None) -> Rule:
    """Ask a person before matching calls run."""
    return Rule("ask", tools, effect)


def decide(tool: Tool, rules: Sequence[Rule], default: Decision = "allow") -> tuple[Decision, str]:
    """The decision for a call of ``tool``: deny > ask (and ``approval=True``) > allow > ``default``."""
    matched = [rule for rule in rules if rule.matches(tool)]
    if tool.approval:
        matched.append(Rule("ask", tool.name))
    if not matched:
        return default, "" if default != "deny" else f"tool {tool.name} is not allowed by default"
    best = min(matched, key=lambda rule: _PRECEDENCE[rule.decision])
    reason = best.reason or (f"a rule denies {tool.name}" if best.decision == "deny" else "")
    return best.decision, reason
