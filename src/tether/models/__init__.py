"""Models: the protocol, string resolution and the adapters (extras, imported only when used)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from .base import Model, ModelReply, ModelRequest, TextCallback

if TYPE_CHECKING:
    from ._http_errors import (
        AuthenticationError,
        BadRequestError,
        ConnectionFailed,
        ContextTooLongError,
        InvalidResponseError,
        OverloadedError,
        ProviderError,
        QuotaExceededError,
        RateLimitError,
        ServerError,
    )
    from .anthropic import AnthropicModel
    from .openai import OpenAIModel
    from .openai_responses import OpenAIResponsesModel

__all__ = [
    "AnthropicModel",
    "AuthenticationError",
    "BadRequestError",
    "ConnectionFailed",
    "ContextTooLongError",
    "InvalidResponseError",
    "Model",
    "ModelReply",
    "ModelRequest",
    "OpenAIModel",
    "OpenAIResponsesModel",
    "OverloadedError",
    "ProviderError",
    "QuotaExceededError",
    "RateLimitError",
    "ServerError",
    "TextCallback",
    "resolve_model",
]


def __getattr__(name: str) -> Any:
    """The adapters and their errors load on first use: ``import tether`` imports no provider SDK."""
    if name == "AnthropicModel":
        from .anthropic import AnthropicModel

        return AnthropicModel
    if name == "OpenAIModel":
        from .openai import OpenAIModel

        return OpenAIModel
    if name == "OpenAIResponsesModel":
        from .openai_responses import OpenAIResponsesModel

        return OpenAIResponsesModel
    if name in _ERRORS:
        from . import _http_errors

        return getattr(_http_errors, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_ERRORS = frozenset(
    {
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
    }
)

_PROVIDERS = {
    # prefix: (the adapter's module, the extra that brings its SDK)
    "anthropic": ("anthropic", "tether[anthropic]"),
    "openai": ("openai", "tether[openai]"),
    "openai-responses": ("openai_responses", "tether[openai]"),
}

_BARE_NAMES = re.compile(r"^(?:(?P<anthropic>claude-)|(?P<openai>gpt-|o1|o3|o4|chatgpt-))", re.IGNORECASE)
"""Model names as the providers write them, resolved without a prefix."""

_PREFIXES = "'anthropic:<model>', 'openai:<model>' or 'openai-responses:<model>'"


def resolve_model(model: str | Model) -> Model:
    """A Model from a Model object or a model string.

    Strings are ``"anthropic:<model>"``, ``"openai:<model>"`` (Chat Completions),
    ``"openai-responses:<model>"`` (the Responses API), or a bare name as the providers write it:
    ``claude-*`` is Anthropic's, ``gpt-*``, ``chatgpt-*``, ``o1*``, ``o3*`` and ``o4*`` are OpenAI's (Chat
    Completions).

    Raises:
        ValueError: an unknown prefix or bare name, or an adapter whose SDK is not installed.
        TypeError: neither a string nor a Model.
    """
    if not isinstance(model, str):
        if not isinstance(model, Model):
            raise TypeError(
                f"model {model!r} is not a Model. Fix: pass {_PREFIXES}, or an object with a name and an async "
                "request(request, on_text) method"
            )
        return model
    provider, sep, name = model.partition(":")
    if not sep:
        bare = _BARE_NAMES.match(model)
        if bare is None:
            raise ValueError(
                f"model {model!r} is not a name tether knows without a prefix (claude-*, gpt-*, o1*, o3*, "
                f"o4*). Fix: use {_PREFIXES}, or pass a Model object (OpenAIModel(name, base_url=...) for "
                "OpenAI-compatible servers)"
            )
        provider, name = bare.lastgroup or "", model
    if provider not in _PROVIDERS or not name:
        raise ValueError(
            f"model {model!r} is not known. Fix: use {_PREFIXES}, or pass a Model object "
            "(OpenAIModel(name, base_url=...) for OpenAI-compatible servers)"
        )
    module_name, extra = _PROVIDERS[provider]
    import importlib

    try:
        module = importlib.import_module(f"tether.models.{module_name}")
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.startswith("tether"):
            raise ValueError(
                f"the {provider} adapter is not in this version of tether. Fix: pass a Model object, or "
                "upgrade tether"
            ) from None
        raise ValueError(f"model {model!r} needs the {provider} SDK. Fix: pip install '{extra}'") from exc
    factory = module.from_name
    resolved: Model = factory(name)
    return resolved
