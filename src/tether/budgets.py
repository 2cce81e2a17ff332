"""Budgets: limits on turns, tokens and cost over a whole run, and model prices (DESIGN 7, 10).

Limits are totals over the run (every resume included), checked only before a model request. A resuming
agent's limits apply; when they differ from the journal's, ``budgets_changed`` is journaled first.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "KNOWN_PRICES",
    "KNOWN_WINDOWS",
    "Price",
    "cost_of",
    "exceeded",
    "price_for",
    "remaining",
    "window_for",
]


@dataclass(frozen=True, slots=True)
class Price:
    """US dollars per million tokens; cache prices default to the input price."""

    input: float
    output: float
    cache_read: float | None = None
    cache_write: float | None = None


KNOWN_PRICES: dict[str, Price] = {
    "claude-opus-4-1": Price(15.0, 75.0, 1.5, 18.75),
    "claude-sonnet-4-5": Price(3.0, 15.0, 0.3, 3.75),
    "claude-haiku-4-5": Price(1.0, 5.0, 0.1, 1.25),
    "gpt-4.1": Price(2.0, 8.0, 0.5),
    "gpt-4.1-mini": Price(0.4, 1.6, 0.1),
    "gpt-4o": Price(2.5, 10.0, 1.25),
    "gpt-4o-mini": Price(0.15, 0.6, 0.075),
}
"""Published list prices for a few models, by name prefix; pass ``price=`` for any other."""


KNOWN_WINDOWS: dict[str, int] = {
    "claude": 200_000,
    "gpt-4.1": 1_047_576,
    "gpt-4o": 128_000,
}
"""Context windows in tokens, by model name prefix."""


def window_for(model_name: str) -> int | None:
    """The known context window of a model (longest matching name prefix), or None."""
    matches = [name for name in KNOWN_WINDOWS if model_name.startswith(name)]
    return KNOWN_WINDOWS[max(matches, key=len)] if matches else None


def price_for(model_name: str) -> Price | None:
    """The known price of a model (longest matching name prefix), or None."""
    matches = [name for name in KNOWN_PRICES if model_name.startswith(name)]
    return KNOWN_PRICES[max(matches, key=len)] if matches else None


def cost_of(usage: Mapping[str, int], price: Price) -> float:
    """The cost in US dollars of ``usage`` (token counts as providers report them)."""
    cache_read = usage.get("cache_read_input_tokens", 0)
    cache_write = usage.get("cache_creation_input_tokens", 0)
    return (
        usage.get("input_tokens", 0) * price.input
        + usage.get("output_tokens", 0) * price.output
        + cache_read * (price.cache_read if price.cache_read is not None else price.input)
        + cache_write * (price.cache_write if price.cache_write is not None else price.input)
    ) / 1_000_000


def _spent(name: str, turn: int, usage: Mapping[str, int], price: Price | None) -> float:
    if name == "max_turns":
        return turn
    if name == "max_tokens":
        return usage.get("input_tokens", 0) + usage.get("output_tokens", 0)
    return cost_of(usage, price) if price is not None else 0.0


def exceeded(
    limits: Mapping[str, Any], turn: int, usage: Mapping[str, int], price: Price | None
) -> str | None:
    """Why no further model request is allowed under ``limits``, or None."""
    for name in ("max_turns", "max_tokens", "max_cost"):
        limit = limits.get(name)
        if limit is None:
            continue
        spent = _spent(name, turn, usage, price)
        if spent >= limit:
            shown = f"${spent:.4f}" if name == "max_cost" else str(spent)
            return f"{name}: {shown} reached the limit of {limit}"
    return None


def remaining(
    limits: Mapping[str, Any], turn: int, usage: Mapping[str, int], price: Price | None
) -> dict[str, Any]:
    """What is left of each limit (for a subagent, which gets its parent's remaining budgets)."""
    return {
        name: max(0, limit - _spent(name, turn, usage, price))
        for name in ("max_turns", "max_tokens", "max_cost")
        if (limit := limits.get(name)) is not None
    }


def tighter(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    """The smaller of each limit in ``a`` and ``b``."""
    out = dict(a)
    for name, limit in b.items():
        out[name] = limit if name not in out else min(out[name], limit)
    return out
