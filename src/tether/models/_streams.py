"""What both SDK adapters do alike: read a reply object as JSON, and read a streamed response.

Imports no SDK; the adapters hand it their SDK's objects.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from ._http_errors import InvalidResponseError

__all__ = ["as_dict", "read_stream"]


def as_dict(value: Any, provider: str, server: str) -> dict[str, Any]:
    """An SDK object (or a dict) as a JSON dict.

    Raises:
        InvalidResponseError: the server's reply is not an object; ``server`` says what base_url should be.
    """
    if isinstance(value, dict):
        return value
    to_dict = getattr(value, "to_dict", None)
    if to_dict is None:
        raise InvalidResponseError(
            f"{provider}: the server's reply is not an object ({type(value).__name__}). Fix: check base_url "
            f"points at {server}",
            provider=provider,
        )
    result: dict[str, Any] = to_dict(mode="json")
    return result


async def read_stream(
    stream: Any,
    *,
    provider: str,
    server: str,
    base_url: str | None,
    on_json: Callable[[dict[str, Any]], Any],
    feed: Callable[[dict[str, Any]], None],
) -> Any:
    """Read an SDK stream: each event to ``feed``; a JSON body (a server that ignored ``stream=true``) to
    ``on_json``, whose result is returned. Returns None after the events. The stream is always closed.

    Raises:
        InvalidResponseError: the server answered something that is neither JSON nor events.
    """
    try:
        kind = stream.response.headers.get("content-type", "")
        if "json" in kind:
            return on_json(json.loads(await stream.response.aread()))
        if "event-stream" not in kind:
            raise InvalidResponseError(
                f"{provider}: the server answered {kind or 'without a content type'}, not a stream of events. "
                f"Fix: check base_url ({base_url or 'the default'}) points at {server}",
                provider=provider,
                status_code=stream.response.status_code,
            )
        async for event in stream:
            feed(as_dict(event, provider, server))
        return None
    finally:
        try:
            await stream.close()
        except Exception:  # closing a broken connection: the first error is the one to report
            pass
