"""Models: the protocol, string resolution and the adapters (extras, imported only when used)."""

from __future__ import annotations

from .base import Model, ModelReply, ModelRequest, TextCallback

__all__ = ["Model", "ModelReply", "ModelRequest", "TextCallback", "resolve_model"]

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
