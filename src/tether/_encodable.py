"""Values a journal can hold: lone surrogates replaced, and a clear error for anything else.

A Python ``str`` may hold lone surrogates (U+D800 to U+DFFF), which UTF-8, and so JSON, cannot encode. They
come from the operating system's undecodable bytes (``os.listdir``, ``os.environ`` and ``sys.argv`` decode
them with ``surrogateescape``: the byte 0xE9 of a Latin-1 file name becomes U+DCE9) and from ``json.loads``
of a ``"\\ud800"`` escape. Every entry a writer makes and every item posted to an inbox goes through
:func:`journal_safe` or :func:`clean`: **each lone surrogate becomes U+FFFD**, the replacement character
(what a program shows for bytes it cannot decode). The entry folded into the State is the one journaled, so
the State a driver holds equals what ``store.load`` returns, and a resumed run sees the same text as the live
one. Anything else no entry can hold (an integer beyond 64 bits, a dict key that is not a string, an object
JSON has no form for) is refused with :class:`~tether.errors.UnencodableError` before the entry exists.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from .errors import UnencodableError

__all__ = ["REPLACEMENT", "clean", "clean_text", "journal_safe"]

REPLACEMENT = "\ufffd"
"""What each lone surrogate of a journaled string becomes: U+FFFD REPLACEMENT CHARACTER."""

_SURROGATE = re.compile("[\ud800-\udfff]")


def clean_text(text: str) -> str:
    """``text`` with each lone surrogate replaced by U+FFFD (``text`` itself when it holds none)."""
    if text.isascii():
        return text
    return _SURROGATE.sub(REPLACEMENT, text)


def clean(value: Any) -> Any:
    """``value`` with :func:`clean_text` applied to every string in it, dict keys included.

    Walks dicts, lists and tuples (a tuple stays a tuple); any other value is returned as it is.
    """
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, dict):
        return {clean_text(k) if isinstance(k, str) else k: clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [clean(item) for item in value]
    if isinstance(value, tuple):
        return tuple(clean(item) for item in value)
    return value


def journal_safe(fields: dict[str, Any], what: str) -> dict[str, Any]:
    """The fields of a new entry as the journal can hold them: ``fields`` itself when they encode.

    Args:
        fields: the entry's fields.
        what: the entry, for the error message (e.g. ``"run R: a tool_finished entry"``).

    Raises:
        UnencodableError: a value that no JSON encoding holds, even with its lone surrogates replaced.
    """
    try:
        orjson.dumps(fields)
        return fields
    except TypeError:
        pass
    try:
        fixed = clean(fields)
        orjson.dumps(fixed)
    except (TypeError, RecursionError) as exc:
        raise UnencodableError(what, str(exc)) from None
    return fixed
