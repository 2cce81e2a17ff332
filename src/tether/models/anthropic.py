"""AnthropicModel: Claude through the Messages API, streamed (DESIGN 12).

Needs the ``anthropic`` SDK (``pip install 'tether[anthropic]'``); ``import tether`` never imports it.
Wire format, from tether's messages:

- ``system``: the instructions (a text block with ``cache_control`` when ``cache``).
- ``user`` messages: text and images (``{"type": "image", "source": {"type": "base64", ...}}``).
- ``assistant`` messages: text, ``tool_use`` (``id`` = the call's ``provider_call_id``) and the provider blocks the
  model sent (``thinking`` with its signature, ``redacted_thinking``), unchanged; other providers' raw items
  (``{"type": "provider", ...}``, the Responses API's reasoning) are left out.
- ``tool`` messages: one user message of ``tool_result`` blocks (``tool_use_id`` = ``provider_call_id``,
  ``is_error`` for outcomes other than ``done``), text and images.
- consecutive messages of one role are merged (the API wants user and assistant to alternate).
- ``tools``: ``{"name", "description", "input_schema"}``, ``cache_control`` on the last one when ``cache``.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

try:
    import anthropic as _sdk
except ModuleNotFoundError as _missing:
    # resolve_model turns this into "Fix: pip install 'tether[anthropic]'" (it checks the module name)
    raise ModuleNotFoundError(
        f"tether.models.anthropic needs the anthropic SDK ({_missing}). Fix: pip install 'tether[anthropic]'",
        name=_missing.name,
    ) from _missing

from ..messages import Message
from ._http_errors import (
    ConnectionFailed,
    InvalidResponseError,
    PerLoop,
    ProviderError,
    category_of,
    classify,
    connection_failed,
    emit_text,
    error_fields,
    from_callback,
    is_transport_error,
)
from ._streams import as_dict, read_stream
from .base import ModelReply, ModelRequest, TextCallback

_SERVER = "a server speaking Anthropic's Messages API"

__all__ = ["AnthropicModel", "from_name"]

_EPHEMERAL = {"type": "ephemeral"}
_CACHEABLE = frozenset({"text", "image", "tool_result", "tool_use", "document"})
_TETHER_TYPES = frozenset({"text", "image", "tool_call", "tool_result"})
_WIRE_ID = re.compile(r"[^a-zA-Z0-9_-]")


class AnthropicModel:
    """Claude through Anthropic's Messages API (or any server speaking it), streamed.

    Args:
        model: the model name (``claude-sonnet-4-5``); also this Model's ``name``.
        api_key: the API key; ``ANTHROPIC_API_KEY`` when None.
        base_url: another server speaking the Messages API (the SDK reads ``ANTHROPIC_BASE_URL`` when None).
        max_tokens: the most tokens one reply may have.
        thinking: extended thinking: ``{"type": "enabled", "budget_tokens": N}``, ``{"type": "adaptive"}``,
            or an int (a budget); None leaves it to the model's default.
        cache: prompt caching: ``cache_control`` breakpoints on the system prompt, the last tool and the
            newest message, so each turn reads the conversation so far from the cache.
        timeout: seconds for one request (the SDK's timeout).
        extra_headers: headers sent with every request (``anthropic-beta``...).
        extra_body: more request fields (``temperature``, ``top_p``, ``stop_sequences``...).
        stream: stream replies (text deltas reach ``on_text`` as they arrive); False asks for whole replies.

    Raises:
        ValueError: no ``api_key`` and ``ANTHROPIC_API_KEY`` is not set.
    """

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        max_tokens: int = 4096,
        thinking: Mapping[str, Any] | int | None = None,
        cache: bool = True,
        timeout: float = 600,
        extra_headers: Mapping[str, str] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        stream: bool = True,
    ) -> None:
        if not model or not isinstance(model, str):
            raise ValueError(f"model {model!r} is not a model name. Fix: pass e.g. 'claude-sonnet-4-5'")
        key = api_key or os.environ.get("ANTHROPIC_API_KEY")
        if not key:
            raise ValueError(
                "ANTHROPIC_API_KEY is not set. Fix: export ANTHROPIC_API_KEY=... or pass "
                "AnthropicModel(..., api_key=...)"
            )
        if max_tokens < 1:
            raise ValueError(f"max_tokens={max_tokens} is not positive. Fix: pass e.g. 4096")
        self.name = model
        self.base_url = base_url
        self.max_tokens = max_tokens
        self.thinking: dict[str, Any] | None = (
            {"type": "enabled", "budget_tokens": thinking}
            if isinstance(thinking, int)
            else dict(thinking)
            if thinking is not None
            else None
        )
        self.cache = cache
        self.timeout = timeout
        self.extra_headers = dict(extra_headers or {})
        self.extra_body = dict(extra_body or {})
        self.stream = stream
        self._api_key = key
        self._key_hint = (
            "the api_key passed to AnthropicModel"
            if api_key
            else "ANTHROPIC_API_KEY (or AnthropicModel(api_key=...))"
        )
        self._clients: PerLoop[Any] = PerLoop(self._make_client)

    def __repr__(self) -> str:
        where = f", base_url={self.base_url!r}" if self.base_url else ""
        return f"AnthropicModel({self.name!r}{where})"

    def _make_client(self) -> Any:
        return _sdk.AsyncAnthropic(
            api_key=self._api_key,
            base_url=self.base_url,
            timeout=self.timeout,
            max_retries=0,  # the driver retries (DESIGN 5.5)
            default_headers=self.extra_headers or None,
            **_http_client(self.timeout),
        )

    async def aclose(self) -> None:
        """Close the running event loop's SDK client (a new one is made on the next request)."""
        client = self._clients.pop()
        if client is not None:
            await client.close()

    # ----------------------------------------------------------------------------------------------
    # The request

    def request_body(self, request: ModelRequest) -> dict[str, Any]:
        """The Messages API request for ``request`` (without ``stream``)."""
        system_texts = [request.instructions] if request.instructions else []
        messages: list[dict[str, Any]] = []
        for message in request.messages:
            if message.role == "system":
                system_texts.append(message.text)
                continue
            role, blocks = _to_wire(message)
            if not blocks:
                continue
            if messages and messages[-1]["role"] == role:
                messages[-1]["content"].extend(blocks)
            else:
                messages.append({"role": role, "content": blocks})
        for wire in messages:
            if wire["role"] == "user":  # tool results must come first in a user message
                wire["content"].sort(key=lambda block: block.get("type") != "tool_result")
        body: dict[str, Any] = {"model": self.name, "max_tokens": self.max_tokens, "messages": messages}
        system = "\n\n".join(text for text in system_texts if text)
        if system:
            body["system"] = (
                [{"type": "text", "text": system, "cache_control": dict(_EPHEMERAL)}]
                if self.cache
                else system
            )
        if request.tools:
            tools = [
                {
                    "name": schema["name"],
                    "description": schema.get("description") or "",
                    "input_schema": schema.get("parameters") or {"type": "object", "properties": {}},
                }
                for schema in request.tools
            ]
            if self.cache:
                tools[-1]["cache_control"] = dict(_EPHEMERAL)
            body["tools"] = tools
        if self.cache and messages and messages[-1]["role"] == "user":
            last = messages[-1]["content"]
            if last and last[-1].get("type") in _CACHEABLE:
                last[-1] = {**last[-1], "cache_control": dict(_EPHEMERAL)}
        if self.thinking is not None:
            body["thinking"] = dict(self.thinking)
        body.update(self.extra_body)
        return body

    async def request(self, request: ModelRequest, on_text: TextCallback | None = None) -> ModelReply:
        """Ask Claude; text deltas go to ``on_text`` as they arrive.

        Raises:
            ProviderError: one of ``tether.models._http_errors``' classes (``retryable`` set), with the
                SDK's exception as ``__cause__``.
        """
        body = self.request_body(request)
        client = self._clients.get()
        try:
            if not self.stream:
                message = await client.messages.create(**_sdk_arguments(body, stream=False))
                return _reply_from_message(_as_dict(message), request.index, on_text)
            return await self._streamed(client, body, request.index, on_text)
        except ProviderError:
            raise
        except Exception as exc:
            mapped = None if from_callback(exc) else self._convert(exc)
            if mapped is None:
                raise
            raise mapped from exc

    async def _streamed(
        self, client: Any, body: dict[str, Any], index: int, on_text: TextCallback | None
    ) -> ModelReply:
        stream = await client.messages.create(**_sdk_arguments(body, stream=True))
        reply = _StreamedReply(index, on_text)
        direct = await read_stream(
            stream,
            provider="anthropic",
            server=_SERVER,
            base_url=self.base_url,
            on_json=lambda body: _reply_from_message(body, index, on_text),
            feed=reply.feed,
        )
        if direct is not None:  # a server that ignored stream=true
            return direct
        if not reply.stopped:
            raise ConnectionFailed(
                "anthropic: the stream ended before message_stop (cut mid-way). Fix: nothing; tether asks again",
                provider="anthropic",
            )
        return reply.finish()

    def _convert(self, exc: BaseException) -> ProviderError | None:
        """The tether error for an SDK or transport exception (None: not a provider error)."""
        if isinstance(exc, _sdk.APIStatusError):
            message, kind, code = error_fields(exc.body)
            status = exc.status_code if exc.status_code >= 400 else None  # an error event inside a stream
            return classify(
                "anthropic",
                status=status,
                message=message or exc.message,
                error_type=kind,
                code=code,
                headers=exc.response.headers,
                key_hint=self._key_hint,
                category=category_of(exc, _sdk) if status is not None else None,
            )
        if isinstance(exc, _sdk.APIConnectionError) or is_transport_error(exc):
            return connection_failed("anthropic", exc)
        if isinstance(exc, _sdk.APIResponseValidationError | json.JSONDecodeError):
            return InvalidResponseError(
                f"anthropic: the server's reply could not be read ({type(exc).__name__}: {str(exc)[:300]}). "
                f"Fix: check base_url ({self.base_url or 'the default'}) points at a server speaking "
                "Anthropic's Messages API",
                provider="anthropic",
            )
        return None


def _sdk_arguments(body: dict[str, Any], *, stream: bool) -> dict[str, Any]:
    """``messages.create`` arguments: the required fields by name, the rest as ``extra_body`` (sent as they
    are, whatever this SDK version's signature knows)."""
    rest = {key: value for key, value in body.items() if key not in ("model", "max_tokens", "messages")}
    return {
        "model": body["model"],
        "max_tokens": body["max_tokens"],
        "messages": body["messages"],
        "stream": stream,
        "extra_body": rest,
    }


def _http_client(timeout: float) -> dict[str, Any]:
    """The SDK's own HTTP client class without the wrapper whose ``__del__`` schedules a close on whatever
    loop runs then: a client of a closed loop is dropped quietly instead of failing a task on another loop."""
    make = getattr(_sdk, "DefaultAsyncHttpxClient", None)
    return {"http_client": make(timeout=timeout)} if make is not None else {}


def from_name(name: str) -> AnthropicModel:
    """The model for ``"anthropic:<name>"`` (``resolve_model``); the key comes from ``ANTHROPIC_API_KEY``."""
    return AnthropicModel(name)


# --------------------------------------------------------------------------------------------------
# tether -> Anthropic


def _wire_id(block: Mapping[str, Any], *keys: str) -> str:
    for key in keys:
        value = block.get(key)
        if isinstance(value, str) and value:
            return _WIRE_ID.sub("_", value)
    return "toolu_missing"


def _image(block: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "type": "image",
        "source": {
            "type": "base64",
            "media_type": block.get("media_type", "image/png"),
            "data": block["data"],
        },
    }


def _content(blocks: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Text and image blocks on the wire (empty text dropped: the API refuses it)."""
    out: list[dict[str, Any]] = []
    for block in blocks:
        kind = block.get("type")
        if kind == "text":
            if block.get("text"):
                out.append(_text(block))
        elif kind == "image" and "data" in block:
            out.append(_image(block))
        elif kind not in _TETHER_TYPES and kind != "provider":  # another provider's raw items stay out
            out.append(dict(block))
    return out


def _text(block: Mapping[str, Any]) -> dict[str, Any]:
    out = {"type": "text", "text": block["text"]}
    if block.get("citations"):
        out["citations"] = block["citations"]
    return out


def _result(block: Mapping[str, Any]) -> dict[str, Any]:
    """A tether ``tool_result`` as an Anthropic ``tool_result`` block."""
    result: dict[str, Any] = {
        "type": "tool_result",
        "tool_use_id": _wire_id(block, "provider_call_id", "call_id"),
    }
    content = _content(block.get("content") or ())
    if content:
        result["content"] = content
    if block.get("outcome", "done") != "done":
        result["is_error"] = True
    return result


def _to_wire(message: Message) -> tuple[str, list[dict[str, Any]]]:
    """The role and content blocks of one tether message."""
    if message.role == "assistant":
        out: list[dict[str, Any]] = []
        for block in message.content:
            if block.get("type") == "tool_call":
                args = block.get("args")
                out.append(
                    {
                        "type": "tool_use",
                        "id": _wire_id(block, "provider_call_id", "id"),
                        "name": block.get("name", ""),
                        "input": args if isinstance(args, dict) else {},
                    }
                )
            else:
                out.extend(_content([block]))
        return "assistant", out
    results = [_result(b) for b in message.content if b.get("type") == "tool_result"]
    if message.role == "tool":
        return "user", results
    return "user", results + _content([b for b in message.content if b.get("type") != "tool_result"])


# --------------------------------------------------------------------------------------------------
# Anthropic -> tether


def _as_dict(value: Any) -> dict[str, Any]:
    return as_dict(value, "anthropic", _SERVER)


def _usage(into: dict[str, int], usage: Any) -> None:
    if isinstance(usage, Mapping):
        for key in (
            "input_tokens",
            "output_tokens",
            "cache_read_input_tokens",
            "cache_creation_input_tokens",
        ):
            value = usage.get(key)
            if isinstance(value, int):
                into[key] = value


def _new_usage() -> dict[str, int]:
    return dict.fromkeys(
        ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"), 0
    )


def _parse_args(raw: str) -> Any:
    """Parsed tool input; the raw text when it is not JSON (tether's validator answers ``input_error``)."""
    if not raw.strip():
        return {}
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def _from_wire(block: Mapping[str, Any], raw_json: str | None) -> dict[str, Any]:
    """One Anthropic content block as a tether block (unknown kinds kept as provider blocks)."""
    kind = block.get("type")
    if kind == "text":
        return _text({"text": block.get("text") or "", "citations": block.get("citations")})
    if kind == "tool_use":
        args = _parse_args(raw_json) if raw_json is not None else block.get("input") or {}
        return {
            "type": "tool_call",
            "name": block.get("name", ""),
            "args": args,
            "provider_call_id": block.get("id"),
        }
    if kind == "thinking":
        return {
            "type": "thinking",
            "thinking": block.get("thinking") or "",
            "signature": block.get("signature") or "",
        }
    if (
        kind == "image"
        and isinstance(block.get("source"), Mapping)
        and block["source"].get("type") == "base64"
    ):
        return {
            "type": "image",
            "media_type": block["source"].get("media_type"),
            "data": block["source"].get("data"),
        }
    out = {key: value for key, value in block.items() if value is not None}
    if raw_json is not None and "input" in block:
        out["input"] = _parse_args(raw_json)
    return out


def _finish(blocks: list[dict[str, Any]], index: int) -> list[dict[str, Any]]:
    """Make up provider ids that are missing or repeated, so the wire stays consistent."""
    seen: set[str] = set()
    calls = 0
    for block in blocks:
        if block.get("type") == "tool_call":
            pid = block.get("provider_call_id")
            if not isinstance(pid, str) or not pid or pid in seen:
                block["provider_call_id"] = pid = f"toolu_t{index}_{calls}"
            seen.add(pid)
            calls += 1
    return blocks


def _reply_from_message(message: Mapping[str, Any], index: int, on_text: TextCallback | None) -> ModelReply:
    """A whole (non-streamed) Messages API reply as a ModelReply."""
    if message.get("type") == "error":
        text, kind, code = error_fields(message)
        raise classify("anthropic", status=None, message=text, error_type=kind, code=code)
    blocks = [_from_wire(block, None) for block in message.get("content") or () if isinstance(block, Mapping)]
    for block in blocks:
        if block["type"] == "text":
            emit_text(on_text, block["text"])
    usage = _new_usage()
    _usage(usage, message.get("usage"))
    return ModelReply(_finish(blocks, index), message.get("stop_reason"), usage, message.get("model"))


class _StreamedReply:
    """Folds the Messages API's stream events into a reply."""

    def __init__(self, index: int, on_text: TextCallback | None) -> None:
        self.index = index
        self.on_text = on_text
        self.blocks: dict[int, dict[str, Any]] = {}
        self.json: dict[int, list[str]] = {}
        self.usage = _new_usage()
        self.stop_reason: str | None = None
        self.model: str | None = None
        self.stopped = False

    def feed(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        if kind == "message_start":
            message = event.get("message") or {}
            self.model = message.get("model")
            _usage(self.usage, message.get("usage"))
        elif kind == "content_block_start":
            block = dict(event.get("content_block") or {})
            self.blocks[event["index"]] = block
            if block.get("type") == "text" and block.get("text"):
                self._text(block["text"])
        elif kind == "content_block_delta":
            self._delta(self.blocks.setdefault(event["index"], {"type": "text", "text": ""}), event)
        elif kind == "message_delta":
            delta = event.get("delta") or {}
            if delta.get("stop_reason") is not None:
                self.stop_reason = delta["stop_reason"]
            _usage(self.usage, event.get("usage"))
        elif kind == "message_stop":
            self.stopped = True
        elif kind == "error":
            text, error_type, code = error_fields(event)
            raise classify("anthropic", status=None, message=text, error_type=error_type, code=code)

    def _delta(self, block: dict[str, Any], event: Mapping[str, Any]) -> None:
        delta = event.get("delta") or {}
        kind = delta.get("type")
        if kind == "text_delta":
            block["text"] = (block.get("text") or "") + delta.get("text", "")
            self._text(delta.get("text", ""))
        elif kind == "input_json_delta":
            self.json.setdefault(event["index"], []).append(delta.get("partial_json") or "")
        elif kind == "thinking_delta":
            block["thinking"] = (block.get("thinking") or "") + delta.get("thinking", "")
        elif kind == "signature_delta":
            block["signature"] = (block.get("signature") or "") + delta.get("signature", "")
        elif kind == "citations_delta":
            block.setdefault("citations", [])
            if block["citations"] is None:
                block["citations"] = []
            block["citations"].append(delta.get("citation"))

    def _text(self, text: str) -> None:
        emit_text(self.on_text, text)

    def finish(self) -> ModelReply:
        blocks = [
            _from_wire(self.blocks[i], "".join(self.json[i]) if i in self.json else None)
            for i in sorted(self.blocks)
        ]
        return ModelReply(_finish(blocks, self.index), self.stop_reason, self.usage, self.model)
