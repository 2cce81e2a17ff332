"""ScriptedModel: a model that answers from a list, for tests, examples and the demo (DESIGN 3)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .base import ModelReply, ModelRequest, TextCallback

__all__ = ["ScriptedCall", "ScriptedModel", "call"]


@dataclass(frozen=True, slots=True)
class ScriptedCall:
    """One scripted tool call: the tool's name and its arguments."""

    name: str
    args: dict[str, Any] = field(default_factory=dict)
    provider_call_id: str | None = None


def call(name: str, /, **args: Any) -> ScriptedCall:
    """A scripted tool call: ``call("get_weather", city="London")``."""
    return ScriptedCall(name, args)


Reply = (
    str | ScriptedCall | Sequence[ScriptedCall] | BaseException | ModelReply | Callable[[ModelRequest], Any]
)


class ScriptedModel:
    """Answers request number ``request.index`` with ``replies[request.index]``.

    A reply is a string (final text), ``call(name, **args)`` (one tool call), a list of calls (parallel
    calls), an exception instance (raised), a ``ModelReply``, or a callable taking the request and
    returning one of those. A process that resumes a run gets the reply that comes next in the script,
    and a request cut off by a crash gets the same reply again. Every request is kept in ``requests``.
    """

    def __init__(self, replies: Sequence[Reply], *, name: str = "scripted", stream_chunk: int = 0) -> None:
        self.replies = list(replies)
        self.name = name
        self.requests: list[ModelRequest] = []
        self.stream_chunk = stream_chunk

    async def request(self, request: ModelRequest, on_text: TextCallback | None = None) -> ModelReply:
        """Answer from the script."""
        self.requests.append(request)
        if request.index >= len(self.replies):
            raise AssertionError(
                f"ScriptedModel has {len(self.replies)} replies; request {request.index + 1} asked"
            )
        reply: Any = self.replies[request.index]
        if callable(reply) and not isinstance(reply, ScriptedCall | ModelReply | BaseException):
            reply = reply(request)
            if inspect.isawaitable(reply):
                reply = await reply
        if isinstance(reply, BaseException):
            raise reply
        made = _to_reply(reply)
        if on_text is not None:
            for block in made.content:
                if block.get("type") == "text" and block["text"]:
                    text = block["text"]
                    size = self.stream_chunk or len(text)
                    for start in range(0, len(text), size):
                        on_text(text[start : start + size])
        return made


def _to_reply(reply: Any) -> ModelReply:
    if isinstance(reply, ModelReply):
        return reply
    usage = {"input_tokens": 10, "output_tokens": 5}
    if isinstance(reply, str):
        return ModelReply([{"type": "text", "text": reply}], "end_turn", usage)
    if isinstance(reply, ScriptedCall):
        reply = [reply]
    if isinstance(reply, Sequence) and all(isinstance(c, ScriptedCall) for c in reply):
        blocks = [
            {
                "type": "tool_call",
                "name": c.name,
                "args": c.args,
                "provider_call_id": c.provider_call_id or f"toolu_{i}",
            }
            for i, c in enumerate(reply)
        ]
        return ModelReply(blocks, "tool_use", usage)
    raise TypeError(
        f"scripted reply {reply!r} is not a string, call(...), a list of calls, an exception, a ModelReply or a "
        "callable. Fix: change the script"
    )
