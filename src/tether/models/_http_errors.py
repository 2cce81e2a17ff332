"""Provider errors as tether's own, and what the HTTP adapters share (DESIGN 5.5, 12).

The SDKs' own retries are off (``max_retries=0``); the driver retries what these errors mark ``retryable``,
waiting at least ``retry_after`` seconds. Each adapter turns the SDK's exception into one of the classes
below with ``raise ... from sdk_exception``, so the provider's exception stays the ``__cause__``.

This module imports no SDK.
"""

from __future__ import annotations

import asyncio
import email.utils
import re
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from ..errors import ModelError

__all__ = [
    "AuthenticationError",
    "BadRequestError",
    "ConnectionFailed",
    "ContextTooLongError",
    "InvalidResponseError",
    "OverloadedError",
    "ProviderError",
    "RateLimitError",
    "ServerError",
    "classify",
    "emit_text",
    "error_fields",
    "from_callback",
    "is_transport_error",
    "parse_retry_after",
]

T = TypeVar("T")


class ProviderError(ModelError):
    """A model provider's request failed (base class of the errors below).

    Attributes:
        provider: ``anthropic`` or ``openai`` (an OpenAI-compatible server reports ``openai``).
        status_code: the HTTP status, when the server answered (an error inside a stream has none).
        error_type: the provider's error type or code (``overloaded_error``, ``context_length_exceeded``).
    """

    default_retryable = False

    def __init__(
        self,
        message: str,
        *,
        retryable: bool | None = None,
        retry_after: float | None = None,
        provider: str = "",
        status_code: int | None = None,
        error_type: str | None = None,
    ) -> None:
        super().__init__(
            message,
            retryable=self.default_retryable if retryable is None else retryable,
            retry_after=retry_after,
        )
        self.provider = provider
        self.status_code = status_code
        self.error_type = error_type


class RateLimitError(ProviderError):
    """429: too many requests or tokens; retried after ``retry_after``."""

    default_retryable = True


class OverloadedError(ProviderError):
    """529 or an ``overloaded_error`` (also inside a stream): the provider is overloaded; retried."""

    default_retryable = True


class ServerError(ProviderError):
    """5xx (and 408/409, which the SDKs retry too): a fault on the provider's side; retried."""

    default_retryable = True


class ConnectionFailed(ProviderError):
    """No answer: the connection failed, timed out, or the stream was cut mid-way; retried."""

    default_retryable = True


class AuthenticationError(ProviderError):
    """401/403: the API key is missing, wrong or lacks permission; not retried."""


class BadRequestError(ProviderError):
    """400/404/413/422 and other 4xx: the request is wrong (model name, schema, parameters); not retried."""


class ContextTooLongError(BadRequestError):
    """400 saying the prompt or context is too long for the model; not retried."""


class InvalidResponseError(ProviderError):
    """The server answered with something that is not the provider's format; not retried."""


_CONTEXT_TOO_LONG = re.compile(
    r"prompt is too long|context[ _-]?length|context window|maximum context|too many (input )?tokens|"
    r"input is too long|exceeds? the (model'?s? )?(context|maximum)|reduce the length",
    re.IGNORECASE,
)


def parse_retry_after(headers: Mapping[str, str] | None, now: float | None = None) -> float | None:
    """Seconds to wait from ``retry-after-ms`` or ``retry-after`` (seconds or an HTTP date), if given.

    Args:
        headers: the response headers (a case-insensitive mapping, or a dict with lower-case keys).
        now: the current time (seconds since the epoch) for HTTP dates; ``time.time()`` when None.

    Returns:
        Seconds (never negative), or None when the headers say nothing usable.
    """
    if not headers:
        return None
    value = headers.get("retry-after-ms")
    if value is not None:
        try:
            return max(0.0, float(value) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def error_fields(body: object) -> tuple[str | None, str | None, str | None]:
    """The (message, type, code) of a provider error body.

    Accepts Anthropic's ``{"type": "error", "error": {"type", "message"}}``, OpenAI's ``{"error": {"message",
    "type", "code"}}`` and the inner ``error`` object alone (what the OpenAI SDK keeps as ``body``).
    """
    if not isinstance(body, Mapping):
        return (body.strip()[:500] or None, None, None) if isinstance(body, str) else (None, None, None)
    inner = body.get("error")
    if isinstance(inner, Mapping):
        body = inner
    elif isinstance(inner, str):
        return inner, None, None
    message, kind, code = body.get("message"), body.get("type"), body.get("code")
    return (
        message if isinstance(message, str) else None,
        kind if isinstance(kind, str) and kind != "error" else None,
        str(code) if isinstance(code, str | int) else None,
    )


def classify(
    provider: str,
    *,
    status: int | None,
    message: str | None,
    error_type: str | None = None,
    code: str | None = None,
    headers: Mapping[str, str] | None = None,
    key_hint: str = "",
) -> ProviderError:
    """The tether error for a provider's error response (or an error event inside a stream).

    Args:
        provider: ``anthropic`` or ``openai``, used in the message.
        status: the HTTP status; None for an error event inside a stream (then ``error_type`` decides).
        message: the provider's own text.
        error_type: the provider's error type (``overloaded_error``, ``invalid_request_error``...).
        code: the provider's error code (``context_length_exceeded``, ``rate_limit_exceeded``...).
        headers: the response headers, for ``retry-after``.
        key_hint: how the API key is given (``ANTHROPIC_API_KEY or AnthropicModel(api_key=...)``).
    """
    said = (message or "").strip().rstrip(".")  # the message goes on with ". Fix: ..."
    if len(said) > 500:
        said = said[:500] + " [cut]"
    where = f"{status}" if status is not None else "in the stream"
    label = code or error_type
    detail = f" ({where}, {label})" if label else f" ({where})"
    text = f": {said}" if said else ""
    kinds = " ".join(k for k in (error_type, code) if k).lower()
    fields: dict[str, Any] = {"provider": provider, "status_code": status, "error_type": code or error_type}
    retry_after = parse_retry_after(headers)
    if status == 529 or "overloaded" in kinds:
        return OverloadedError(
            f"{provider} is overloaded{detail}{text}. Fix: nothing; tether retries (Agent(model_retries=...))",
            retry_after=retry_after,
            **fields,
        )
    if status == 429 or "rate_limit" in kinds:
        wait = f" after {retry_after:g}s" if retry_after is not None else ""
        return RateLimitError(
            f"{provider} rate limit{detail}{text}. Fix: nothing; tether retries{wait} (Agent(model_retries=...)); "
            "ask the provider for a higher limit if it keeps happening",
            retry_after=retry_after,
            **fields,
        )
    if status in (401, 403) or "authentication" in kinds or "permission" in kinds:
        fix = f"check {key_hint}" if key_hint else "check the API key"
        what = "refused the API key" if status != 403 and "permission" not in kinds else "denied permission"
        return AuthenticationError(f"{provider} {what}{detail}{text}. Fix: {fix}", **fields)
    if (status is None or 400 <= status < 500) and (
        _CONTEXT_TOO_LONG.search(said) or "context_length" in kinds
    ):
        return ContextTooLongError(
            f"{provider} says the context is too long{detail}{text}. Fix: shorten the instructions, tool "
            "results or conversation (start a new run with a summary), or use a model with a longer context",
            **fields,
        )
    if (
        status in (408, 409)
        or (status is not None and status >= 500)
        or (status is None and ("api_error" in kinds or "server_error" in kinds or not kinds))
    ):
        return ServerError(
            f"{provider} server error{detail}{text}. Fix: nothing; tether retries (Agent(model_retries=...))",
            retry_after=retry_after,
            **fields,
        )
    return BadRequestError(
        f"{provider} refused the request{detail}{text}. Fix: check the model name, the tool schemas and "
        "the model's settings",
        **fields,
    )


def emit_text(on_text: Callable[[str], None] | None, text: str) -> None:
    """Give ``text`` to the caller's ``on_text``; an exception it raises is marked so that it propagates as it
    is (never mistaken for a provider's or a network's error)."""
    if on_text is None or not text:
        return
    try:
        on_text(text)
    except Exception as exc:
        exc._tether_on_text = True  # type: ignore[attr-defined]
        raise


def from_callback(exc: BaseException) -> bool:
    """Whether ``exc`` came out of the caller's ``on_text`` (see ``emit_text``)."""
    return bool(getattr(exc, "_tether_on_text", False))


_TRANSPORT_MODULES = frozenset({"httpx", "httpx2", "httpcore", "httpcore2", "h11", "h2", "anyio", "ssl"})


def is_transport_error(exc: BaseException) -> bool:
    """Whether ``exc`` is a network failure: an HTTP library's transport error, an OSError or a timeout."""
    if isinstance(exc, OSError | TimeoutError | EOFError):
        return True
    for klass in type(exc).__mro__:
        if klass.__module__.split(".")[0] in _TRANSPORT_MODULES and klass is not object:
            return True
    return False


def connection_failed(provider: str, exc: BaseException) -> ConnectionFailed:
    """A ConnectionFailed naming ``exc`` (a timeout, a refused connection, a cut stream)."""
    said = str(exc).strip() or type(exc).__name__
    inner = exc.__cause__ or exc.__context__
    if inner is not None and str(inner).strip():
        said = f"{said} {type(inner).__name__}: {str(inner).strip()}"
    return ConnectionFailed(
        f"{provider} connection failed ({type(exc).__name__}: {said[:300]}). Fix: nothing; tether retries; "
        "check the network and base_url if it keeps happening",
        provider=provider,
    )


class PerLoop(Generic[T]):
    """One object per running event loop (SDK clients hold connections bound to the loop that made them).

    Entries are keyed by ``id(loop)`` and checked through a weak reference, so a new loop that reuses a dead
    loop's id gets a new object; entries of closed or collected loops are dropped when another is made.
    """

    def __init__(self, make: Callable[[], T]) -> None:
        self._make = make
        self._items: dict[int, tuple[weakref.ref[asyncio.AbstractEventLoop], T]] = {}
        self._lock = threading.Lock()

    def get(self) -> T:
        """The object for the running loop, made on first use (call from inside the loop)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            found = self._items.get(id(loop))
            if found is not None and found[0]() is loop:
                return found[1]
            for key, (ref, _) in list(self._items.items()):
                alive = ref()
                if alive is None or alive.is_closed():
                    del self._items[key]
            made = self._make()
            self._items[id(loop)] = (weakref.ref(loop), made)
            return made

    def pop(self) -> T | None:
        """Forget the running loop's object and return it (None when there is none)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            found = self._items.pop(id(loop), None)
        return found[1] if found is not None and found[0]() is loop else None

    def __len__(self) -> int:
        return len(self._items)
