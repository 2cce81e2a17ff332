"""Budgets: limits on turns, tokens and cost over a whole run, and model prices (DESIGN 7, 10).

Limits are totals over the run (every resume included), checked only before a model request. A resuming
agent's limits apply; when they differ from the journal's, ``budgets_changed`` is journaled first.

Prices and context windows come from genai-prices (``pip install genai-prices``, in the ``anthropic`` and
``openai`` extras), imported only when a price or window is first needed, never by ``import tether``.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "KNOWN_WINDOWS",
    "Price",
    "PublishedPrice",
    "cost_of",
    "exceeded",
    "price_for",
    "remaining",
    "window_for",
]

PRICED_PROVIDERS = frozenset({"anthropic", "openai"})
"""The genai-prices providers whose list prices tether uses: those of its adapters. A name another provider
lists (``llama3``) is not priced, since a local or other server bills differently: pass ``price=``."""


@dataclass(frozen=True, slots=True)
class Price:
    """US dollars per million tokens; cache prices default to the input price."""

    input: float
    output: float
    cache_read: float | None = None
    cache_write: float | None = None


class PublishedPrice(Price):
    """The list price of ``model`` in genai-prices, looked up the first time one of its prices is read.

    ``Agent`` holds one when no ``price=`` is given and no ``max_cost`` of its own needs the price at once
    (a parent's ``max_cost`` may still need it later), so ``genai-prices`` is imported only when a cost is
    computed. A model genai-prices does not price costs 0 (``known`` is False).
    """

    __slots__ = ("model",)
    model: str

    def __init__(self, model: str) -> None:
        object.__setattr__(self, "model", model)

    @property
    def known(self) -> bool:
        """Whether genai-prices has a price for the model."""
        return self._get() is not _FREE

    def _get(self) -> Price:
        try:
            return _published(self.model)[0] or _FREE
        except ModuleNotFoundError:
            return _FREE

    @property
    def input(self) -> float:
        return self._get().input

    @property
    def output(self) -> float:
        return self._get().output

    @property
    def cache_read(self) -> float | None:
        return self._get().cache_read

    @property
    def cache_write(self) -> float | None:
        return self._get().cache_write


_FREE = Price(0.0, 0.0)

KNOWN_WINDOWS: dict[str, int] = {
    "claude": 200_000,
    "gpt-4.1": 1_047_576,
    "gpt-4o": 128_000,
}
"""Context windows in tokens by model name prefix, for names genai-prices does not know."""


@functools.cache
def _published(model_name: str) -> tuple[Price | None, int | None]:
    """genai-prices' (price, context window) for a model of an adapter's provider (imported here, once).

    Raises:
        ModuleNotFoundError: genai-prices is not installed.
    """
    from genai_prices import Usage, calc_price

    try:  # the public API finds the model and its current price; the zero usage costs nothing
        found = calc_price(Usage(input_tokens=0, output_tokens=0), model_name)
    except LookupError:
        return None, None
    if found.provider.id not in PRICED_PROVIDERS:
        return None, None
    prices = found.model_price

    def rate(key: str) -> float | None:
        value = getattr(prices, key, None)
        value = getattr(value, "base", value)  # tiered prices: the base tier (see docs/decisions.md)
        return None if value is None else float(value)

    input_rate, output_rate = rate("input_mtok"), rate("output_mtok")
    if input_rate is None or output_rate is None:
        return None, found.model.context_window
    price = Price(input_rate, output_rate, rate("cache_read_mtok"), rate("cache_write_mtok"))
    return price, found.model.context_window


def price_for(model_name: str, *, lazy: bool = False) -> Price | None:
    """The list price of a model from genai-prices (dated names match: ``claude-sonnet-4-5-20250929``).

    Args:
        model_name: the model's name as the provider writes it.
        lazy: return a ``PublishedPrice`` that looks the price up when it is first read, without importing
            genai-prices now.

    Returns:
        The price, or None when genai-prices has none for a model of Anthropic or OpenAI (always a
        ``PublishedPrice`` when ``lazy``).

    Raises:
        ValueError: genai-prices is not installed (and not ``lazy``).
    """
    if lazy:
        return PublishedPrice(model_name)
    try:
        return _published(model_name)[0]
    except ModuleNotFoundError as exc:
        raise ValueError(
            f"no price for model {model_name}: genai-prices, which holds the list prices, is not installed "
            f"({exc}). Fix: pip install genai-prices (it comes with 'tether[anthropic]' and 'tether[openai]'), "
            "or pass price=Price(input=..., output=...)"
        ) from exc


def window_for(model_name: str) -> int | None:
    """The context window of a model: genai-prices', else the longest matching prefix of ``KNOWN_WINDOWS``."""
    try:
        window = _published(model_name)[1]
    except ModuleNotFoundError:
        window = None
    if window:
        return window
    matches = [name for name in KNOWN_WINDOWS if model_name.startswith(name)]
    return KNOWN_WINDOWS[max(matches, key=len)] if matches else None


def cost_of(usage: Mapping[str, int], price: Price) -> float:
    """The cost in US dollars of ``usage`` (tether's usage: ``input_tokens`` is the uncached input).

    Each token is charged once: uncached input at ``input``, cache reads at ``cache_read`` and cache writes
    at ``cache_write`` (each the input price when not given), output at ``output``.
    """
    cache_read = usage.get("cache_read_input_tokens", 0)
    cache_write = usage.get("cache_creation_input_tokens", 0)
    read_rate, write_rate = price.cache_read, price.cache_write
    return (
        usage.get("input_tokens", 0) * price.input
        + usage.get("output_tokens", 0) * price.output
        + cache_read * (read_rate if read_rate is not None else price.input)
        + cache_write * (write_rate if write_rate is not None else price.input)
    ) / 1_000_000


TOKEN_KINDS = ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens", "output_tokens")
"""The usage counts ``max_tokens`` adds up: every token the provider counted, each once."""


def _spent(name: str, turn: int, usage: Mapping[str, int], price: Price | None) -> float:
    if name == "max_turns":
        return turn
    if name == "max_tokens":
        return sum(usage.get(kind, 0) for kind in TOKEN_KINDS)
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
