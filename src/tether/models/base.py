"""The Model protocol: what tether asks a model, and what it gets back (DESIGN 12)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from ..messages import Message

__all__ = ["Model", "ModelReply", "ModelRequest", "TextCallback"]

TextCallback = Callable[[str], None]
"""Called with each text delta as a streaming model produces it."""


@dataclass(frozen=True, slots=True)
class ModelRequest:
    """One request to the model.

    Attributes:
        index: the number of ``model_replied``, ``model_failed`` and ``compacted`` entries already in the
            run; a request cut off by a crash is asked again with the same index.
        instructions: the agent's system instructions.
        messages: the context (a cheap view, not a copy): user, assistant and tool-result messages.
        tools: the tool schemas (``{"name", "description", "parameters"}``).
        run_id: the run asking.
    """

    index: int
    instructions: str
    messages: Sequence[Message]
    tools: list[dict[str, Any]]
    run_id: str = ""


@dataclass(slots=True)
class ModelReply:
    """A model's reply.

    Attributes:
        content: content blocks; tool calls are ``{"type": "tool_call", "name", "args", "provider_call_id"}``
            (tether assigns the ``id``); items a provider needs back that tether has no block for are
            ``{"type": "provider", "provider": <adapter>, "item": {...}}`` (Anthropic's ``thinking`` blocks
            stay as Anthropic sends them).
        stop_reason: the provider's stop reason (``end_turn``, ``tool_use``, ``stop``, ``tool_calls``, ...).
        usage: token counts, each token in one of them: ``input_tokens`` (input not read from or written
            to a cache), ``cache_read_input_tokens``, ``cache_creation_input_tokens``, ``output_tokens``, as
            Anthropic reports them (docs/decisions.md, "Providers").
        model: the model name the provider reported.
    """

    content: list[dict[str, Any]]
    stop_reason: str | None = None
    usage: dict[str, int] = field(default_factory=dict)
    model: str | None = None


@runtime_checkable
class Model(Protocol):
    """A model tether can ask: a name and one async request method."""

    name: str

    async def request(self, request: ModelRequest, on_text: TextCallback | None = None) -> ModelReply:
        """Answer ``request``; call ``on_text`` with text deltas when streaming.

        Raise ``tether.errors.ModelError`` (``retryable`` set) for provider errors; the driver retries.
        """
        ...
