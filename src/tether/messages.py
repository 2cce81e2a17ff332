"""Messages and content blocks: the conversation as the model sees it.

Content blocks are plain JSON dicts with a ``type``:

- ``{"type": "text", "text": ...}``
- ``{"type": "image", "media_type": "image/png", "data": <base64>}``
- ``{"type": "tool_call", "id": <tether call id>, "name": ..., "args": {...}, "provider_call_id": ...}``
- ``{"type": "tool_result", "call_id": ..., "outcome": ..., "content": [blocks]}``
- provider blocks (``thinking`` and others) that adapters keep and send back unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, overload

__all__ = ["Message", "Role", "text_block", "text_of"]

Role = Literal["user", "assistant", "tool", "system"]


def text_block(text: str) -> dict[str, Any]:
    """A text content block: ``{"type": "text", "text": text}``."""
    return {"type": "text", "text": text}


def text_of(blocks: Sequence[dict[str, Any]]) -> str:
    """The text blocks of ``blocks`` joined, in order."""
    return "".join(block.get("text", "") for block in blocks if block.get("type") == "text")


@dataclass(frozen=True, slots=True)
class Message:
    """One message of the conversation.

    Attributes:
        role: ``user``, ``assistant`` or ``tool`` (the results of one reply's calls, in call order).
        content: content blocks (see the module docstring).
    """

    role: Role
    content: tuple[dict[str, Any], ...] = field(default=())

    @classmethod
    def user(cls, content: str | Sequence[dict[str, Any]]) -> Message:
        """A user message from text or content blocks."""
        return cls("user", _blocks(content))

    @classmethod
    def assistant(cls, content: str | Sequence[dict[str, Any]]) -> Message:
        """An assistant message from text or content blocks."""
        return cls("assistant", _blocks(content))

    @property
    def text(self) -> str:
        """The message's text blocks joined."""
        return text_of(self.content)

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        """The ``tool_call`` blocks of an assistant message."""
        return [block for block in self.content if block.get("type") == "tool_call"]

    def to_dict(self) -> dict[str, Any]:
        """The JSON form journaled in a ``message`` entry."""
        return {"role": self.role, "content": list(self.content)}


def _blocks(content: str | Sequence[dict[str, Any]]) -> tuple[dict[str, Any], ...]:
    if isinstance(content, str):
        return (text_block(content),)
    for block in content:
        if not isinstance(block, dict) or "type" not in block:
            raise TypeError(
                f"content block {block!r} is not a dict with a 'type'. Fix: pass text, or blocks like "
                '{"type": "text", "text": "..."}'
            )
    return tuple(content)


class MessagesView(Sequence[Message]):
    """A read-only view of ``prefix`` followed by ``items[start:length]``; costs nothing to make.

    The list it views only grows, so the view never changes. ``prefix`` holds what compaction put in
    place of earlier turns (the first user message and the summary).
    """

    __slots__ = ("_items", "_length", "_prefix", "_start")

    def __init__(
        self,
        items: list[Message],
        start: int = 0,
        length: int | None = None,
        prefix: Sequence[Message] = (),
    ) -> None:
        self._items = items
        self._start = start
        self._prefix = tuple(prefix)
        self._length = (len(items) if length is None else length) - start + len(self._prefix)

    def __len__(self) -> int:
        return self._length

    @overload
    def __getitem__(self, index: int) -> Message: ...
    @overload
    def __getitem__(self, index: slice) -> list[Message]: ...
    def __getitem__(self, index: int | slice) -> Message | list[Message]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._length))]
        if index < 0:
            index += self._length
        if not 0 <= index < self._length:
            raise IndexError("message index out of range")
        if index < len(self._prefix):
            return self._prefix[index]
        return self._items[self._start + index - len(self._prefix)]

    def __iter__(self) -> Iterator[Message]:
        yield from self._prefix
        for i in range(self._start, self._start + self._length - len(self._prefix)):
            yield self._items[i]

    def __repr__(self) -> str:
        return f"MessagesView({list(self)!r})"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]
