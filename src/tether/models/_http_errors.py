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
    "QuotaExceededError",
    "RateLimitError",
    "ServerError",
    "category_of",
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


class QuotaExceededError(ProviderError):
    """The account has no credit or quota left (OpenAI's 429 ``insufficient_quota``, Anthropic's
    ``billing_error``, a spend limit reached): waiting cannot help, so it is not retried."""


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

    Accepts Anthropic's ``{"type": "error", "error": {"type", "message", "details": {"error_code"}}}``,
    OpenAI's ``{"error": {"message", "type", "code"}}``, the Responses API's stream ``error`` event
    (``{"type": "error", "code", "message"}``) and the inner ``error`` object alone (what the OpenAI SDK keeps
    as ``body``). Without a ``code``, Anthropic's ``details.error_code`` is the code.
    """
    if not isinstance(body, Mapping):
        return (body.strip()[:500] or None, None, None) if isinstance(body, str) else (None, None, None)
    inner = body.get("error")
    if isinstance(inner, Mapping):
        body = inner
    elif isinstance(inner, str):
        return inner, None, None
    message, kind, code = body.get("message"), body.get("type"), body.get("code")
    details = body.get("details")
    if code is None and isinstance(details, Mapping):
        code = details.get("error_code")
    return (
        message if isinstance(message, str) else None,
        kind if isinstance(kind, str) and kind != "error" else None,
        str(code) if isinstance(code, str | int) else None,
    )


_SDK_CATEGORIES = (
    # (the SDK's exception class name, tether's category); subclasses before their bases. Newer SDKs have
    # classes for single error codes (anthropic's EnforcedSpendLimitReachedError is a RateLimitError).
    ("EnforcedSpendLimitReachedError", "billing"),
    ("ContractSpendLimitReachedError", "billing"),
    ("OverloadedError", "overloaded"),
    ("RateLimitError", "rate_limit"),
    ("AuthenticationError", "auth"),
    ("PermissionDeniedError", "permission"),
    ("PaymentRequiredError", "billing"),
    ("NotFoundError", "not_found"),
    ("RequestTimeoutError", "server"),
    ("ConflictError", "server"),
    ("ContentTooLargeError", "bad_request"),
    ("RequestTooLargeError", "bad_request"),
    ("UnprocessableEntityError", "bad_request"),
    ("BadRequestError", "bad_request"),
    ("InternalServerError", "server"),
)

_STATUS_CATEGORIES = {
    401: "auth",
    402: "billing",
    403: "permission",
    408: "server",
    409: "server",
    429: "rate_limit",
}

# Error codes and types that say the account's money or quota is used up (OpenAI's error codes reference;
# Anthropic's errors page: ``billing_error``, and ``enforced_spend_limit_reached`` in ``details.error_code``)
_QUOTA_KINDS = frozenset(
    {
        "insufficient_quota",
        "credit_balance_exhausted",
        "organization_spend_limit_exceeded",
        "project_spend_limit_exceeded",
        "organization_usage_limit_exceeded",
        "billing_hard_limit_reached",
        "billing_error",
        "enforced_spend_limit_reached",
        "contract_spend_limit_reached",
        "linked_organization_spend_limit_reached",
    }
)
_NO_CREDIT = re.compile(
    r"credit balance is too low|exceeded your current quota|spend(ing)? limit", re.IGNORECASE
)


def category_of(exc: BaseException, sdk: Any) -> str | None:
    """tether's category for an SDK status error, from the SDK's own exception classes.

    Args:
        exc: the SDK's exception (an ``APIStatusError``).
        sdk: the SDK module (``anthropic`` or ``openai``); classes an SDK version lacks are skipped.

    Returns:
        ``overloaded``, ``rate_limit``, ``auth``, ``permission``, ``billing``, ``not_found``, ``server`` or
        ``bad_request``; None for a class the table does not know (an error event inside a stream, which the
        SDK raises with the stream's own 200 status).
    """
    for name, category in _SDK_CATEGORIES:
        klass = getattr(sdk, name, None)
        if isinstance(klass, type) and isinstance(exc, klass):
            return category
    return None


def classify(
    provider: str,
    *,
    status: int | None,
    message: str | None,
    error_type: str | None = None,
    code: str | None = None,
    headers: Mapping[str, str] | None = None,
    key_hint: str = "",
    category: str | None = None,
) -> ProviderError:
    """The tether error for a provider's error response (or an error event inside a stream).

    The decision is keyed on ``category`` (from the SDK's exception class, ``category_of``) and on the body's
    ``error_type`` and ``code``; the HTTP status decides only when neither says anything (an SDK class the
    table does not know).

    Args:
        provider: ``anthropic`` or ``openai``, used in the message.
        status: the HTTP status; None for an error event inside a stream.
        message: the provider's own text.
        error_type: the provider's error type (``overloaded_error``, ``insufficient_quota``...).
        code: the provider's error code (``context_length_exceeded``, ``rate_limit_exceeded``...).
        headers: the response headers, for ``retry-after``.
        key_hint: how the API key is given (``ANTHROPIC_API_KEY or AnthropicModel(api_key=...)``).
        category: what the SDK's exception class says (``category_of``).
    """
    said = (message or "").strip().rstrip(".")  # the message goes on with ". Fix: ..."
    if len(said) > 500:
        said = said[:500] + " [cut]"
    where = f"{status}" if status is not None else "in the stream"
    label = code or error_type
    detail = f" ({where}, {label})" if label else f" ({where})"
    text = f": {said}" if said else ""
    kinds = " ".join(k for k in (error_type, code) if k).lower()
    if category is None and status is not None:
        category = _STATUS_CATEGORIES.get(status) or ("overloaded" if status == 529 else None)
        if category is None:
            category = "server" if status >= 500 else "bad_request" if status >= 400 else None
    fields: dict[str, Any] = {"provider": provider, "status_code": status, "error_type": code or error_type}
    retry_after = parse_retry_after(headers)
    if (
        category == "billing"
        or {error_type, code} & _QUOTA_KINDS
        or (category in ("rate_limit", "bad_request", "permission") and _NO_CREDIT.search(said))
    ):
        return QuotaExceededError(
            f"{provider}: the account has no quota or credit left{detail}{text}. Fix: add credits or raise "
            f"the spend limit in the {provider} account, or use another API key ({key_hint or 'the API key'}); "
            "waiting does not help, so tether does not retry",
            **fields,
        )
    if category == "overloaded" or "overloaded" in kinds:
        return OverloadedError(
            f"{provider} is overloaded{detail}{text}. Fix: nothing; tether retries (Agent(model_retries=...))",
            retry_after=retry_after,
            **fields,
        )
    if category == "rate_limit" or "rate_limit" in kinds:
        wait = f" after {retry_after:g}s" if retry_after is not None else ""
        return RateLimitError(
            f"{provider} rate limit{detail}{text}. Fix: nothing; tether retries{wait} (Agent(model_retries=...)); "
            "ask the provider for a higher limit if it keeps happening",
            retry_after=retry_after,
            **fields,
        )
    if category in ("auth", "permission") or "authentication" in kinds or "permission" in kinds:
        fix = f"check {key_hint}" if key_hint else "check the API key"
        denied = category == "permission" or "permission" in kinds
        what = "denied permission" if denied else "refused the API key"
        return AuthenticationError(f"{provider} {what}{detail}{text}. Fix: {fix}", **fields)
    if category in ("bad_request", "not_found", None) and (
        _CONTEXT_TOO_LONG.search(said) or "context_length" in kinds
    ):
        return ContextTooLongError(
            f"{provider} says the context is too long{detail}{text}. Fix: shorten the instructions, tool "
            "results or conversation (start a new run with a summary), or use a model with a longer context",
            **fields,
        )
    if category == "server" or (
        category is None and ("api_error" in kinds or "server_error" in kinds or not kinds)
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
