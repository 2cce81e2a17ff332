"""Models: the protocol, string resolution and the adapters (extras, imported only when used)."""

from __future__ import annotations

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
        RateLimitError,
        ServerError,
    )
    from .anthropic import AnthropicModel
    from .openai import OpenAIModel

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
    "OverloadedError",
    "ProviderError",
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
        "RateLimitError",
        "ServerError",
    }
)

_PROVIDERS = {"anthropic": "tether[anthropic]", "openai": "tether[openai]"}


def resolve_model(model: str | Model) -> Model:
    """A Model from a Model object or a string ``"anthropic:<model>"`` / ``"openai:<model>"``.

    Raises:
        ValueError: an unknown prefix, or an adapter this version of tether does not ship.
    """
    if not isinstance(model, str):
        if not isinstance(model, Model):
            raise TypeError(
                f"model {model!r} is not a Model. Fix: pass 'anthropic:<model>', 'openai:<model>' or an "
                "object with a name and an async request(request, on_text) method"
            )
        return model
    provider, sep, name = model.partition(":")
    if not sep or provider not in _PROVIDERS or not name:
        raise ValueError(
            f"model {model!r} is not known. Fix: use 'anthropic:<model>' or 'openai:<model>', or pass a Model "
            "object (OpenAIModel(name, base_url=...) for OpenAI-compatible servers)"
        )
    import importlib

    try:
        module = importlib.import_module(f"tether.models.{provider}")
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.startswith("tether"):
            raise ValueError(
                f"the {provider} adapter is not in this version of tether. Fix: pass a Model object, or "
                "upgrade tether"
            ) from None
        raise ValueError(
            f"model {model!r} needs the {provider} SDK. Fix: pip install '{_PROVIDERS[provider]}'"
        ) from exc
    factory = module.from_name
    resolved: Model = factory(name)
    return resolved
