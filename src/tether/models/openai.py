"""OpenAIModel: OpenAI's Chat Completions API, and any server speaking it, streamed (DESIGN 12).

Needs the ``openai`` SDK (``pip install 'tether[openai]'``); ``import tether`` never imports it.
``OpenAIModel(name, base_url=...)`` talks to any OpenAI-compatible server (vLLM, Ollama, llama.cpp, LM Studio).
Wire format, from tether's messages:

- a ``system`` message with the instructions.
- ``user`` messages: a string, or text and ``image_url`` parts (images as ``data:`` URLs).
- ``assistant`` messages: the text and ``tool_calls`` (``id`` = the call's ``provider_call_id``, ``function`` name
  and ``arguments`` as a JSON string); provider blocks of other providers (``thinking``) are left out.
- ``tool`` messages: one ``{"role": "tool", "tool_call_id", "content"}`` per result, with the result's
  text; a result's images go in one ``user`` message after the tool messages (tool messages carry text only).
- ``tools``: ``{"type": "function", "function": {"name", "description", "parameters"}}``.
"""

from __future__ import annotations

import contextvars
import json
import os
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import Any

try:
    import openai as _sdk
except ModuleNotFoundError as _missing:
    # resolve_model turns this into "Fix: pip install 'tether[openai]'" (it checks the module name)
    raise ModuleNotFoundError(
        f"tether.models.openai needs the openai SDK ({_missing}). Fix: pip install 'tether[openai]'",
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

_SERVER = "an OpenAI-compatible server (usually ending in /v1)"

__all__ = ["OpenAIModel", "convert_error", "from_name", "make_client", "usage_of"]

_NO_KEY = "not-needed"


def openai_key(api_key: str | None, base_url: str | None, how: str) -> str:
    """The API key an OpenAI adapter sends: ``api_key``, else ``OPENAI_API_KEY``; a placeholder for a local server.

    Args:
        how: how to pass a key to this adapter, for the error.

    Raises:
        ValueError: no key and no ``base_url`` (nor ``OPENAI_BASE_URL``).
    """
    key = api_key or os.environ.get("OPENAI_API_KEY")
    if key:
        return key
    if not (base_url or os.environ.get("OPENAI_BASE_URL")):
        raise ValueError(f"OPENAI_API_KEY is not set. Fix: export OPENAI_API_KEY=... or pass {how}")
    return _NO_KEY


class OpenAIModel:
    """A model behind OpenAI's Chat Completions API (or any OpenAI-compatible server), streamed.

    Args:
        model: the model name (``gpt-4.1-mini``, or the name a local server knows); also this Model's ``name``.
        api_key: the API key; ``OPENAI_API_KEY`` when None. With ``base_url`` (or ``OPENAI_BASE_URL``) and no
            key, ``"not-needed"`` is sent (local servers ignore it).
        base_url: an OpenAI-compatible server, e.g. ``http://localhost:11434/v1`` (the SDK reads
            ``OPENAI_BASE_URL`` when None).
        timeout: seconds for one request (the SDK's timeout).
        extra_headers: headers sent with every request.
        stream_usage: ask for token usage in the stream (``stream_options.include_usage``); pass False for
            servers that refuse ``stream_options``.
        extra_body: more request fields (``temperature``, ``max_completion_tokens``, ``reasoning_effort``...).
        stream: stream replies (text deltas reach ``on_text`` as they arrive); False asks for whole replies.

    Raises:
        ValueError: no ``api_key``, no ``OPENAI_API_KEY`` and no ``base_url``.
    """

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        timeout: float = 600,
        extra_headers: Mapping[str, str] | None = None,
        stream_usage: bool = True,
        extra_body: Mapping[str, Any] | None = None,
        stream: bool = True,
    ) -> None:
        if not model or not isinstance(model, str):
            raise ValueError(f"model {model!r} is not a model name. Fix: pass e.g. 'gpt-4.1-mini'")
        key = openai_key(
            api_key,
            base_url,
            "OpenAIModel(..., api_key=...) (for a local server: OpenAIModel(name, base_url=...))",
        )
        self.name = model
        self.base_url = base_url
        self.timeout = timeout
        self.extra_headers = dict(extra_headers or {})
        self.stream_usage = stream_usage
        self.extra_body = dict(extra_body or {})
        self.stream = stream
        self._api_key = key
        self._key_hint = (
            "the api_key passed to OpenAIModel" if api_key else "OPENAI_API_KEY (or OpenAIModel(api_key=...))"
        )
        self._clients: PerLoop[Any] = PerLoop(self._make_client)

    def __repr__(self) -> str:
        where = f", base_url={self.base_url!r}" if self.base_url else ""
        return f"OpenAIModel({self.name!r}{where})"

    def _make_client(self) -> Any:
        return make_client(self._api_key, self.base_url, self.timeout, self.extra_headers)

    async def aclose(self) -> None:
        """Close the running event loop's SDK client (a new one is made on the next request)."""
        client = self._clients.pop()
        if client is not None:
            await client.close()

    # ----------------------------------------------------------------------------------------------
    # The request

    def request_body(self, request: ModelRequest) -> dict[str, Any]:
        """The Chat Completions request for ``request`` (``stream`` included)."""
        messages: list[dict[str, Any]] = []
        if request.instructions:
            messages.append({"role": "system", "content": request.instructions})
        for message in request.messages:
            messages.extend(_to_wire(message))
        body: dict[str, Any] = {"model": self.name, "messages": messages}
        if request.tools:
            body["tools"] = [
                {
                    "type": "function",
                    "function": {
                        "name": schema["name"],
                        "description": schema.get("description") or "",
                        "parameters": schema.get("parameters") or {"type": "object", "properties": {}},
                    },
                }
                for schema in request.tools
            ]
        if self.stream:
            body["stream"] = True
            if self.stream_usage:
                body["stream_options"] = {"include_usage": True}
        body.update(self.extra_body)
        return body

    async def request(self, request: ModelRequest, on_text: TextCallback | None = None) -> ModelReply:
        """Ask the model; text deltas go to ``on_text`` as they arrive.

        Raises:
            ProviderError: one of ``tether.models._http_errors``' classes (``retryable`` set), with the
                SDK's exception as ``__cause__``.
        """
        body = self.request_body(request)
        client = self._clients.get()
        try:
            if not self.stream:
                completion = await client.chat.completions.create(**_sdk_arguments(body))
                return _reply_from_completion(_as_dict(completion), request.index, on_text)
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
        stream = await client.chat.completions.create(**_sdk_arguments(body))
        reply = _StreamedReply(index, on_text)
        end = _StreamEnd()
        token = _STREAM_END.set(end)
        try:
            direct = await read_stream(
                stream,
                provider="openai",
                server=_SERVER,
                base_url=self.base_url,
                on_json=lambda body: _reply_from_completion(body, index, on_text),
                feed=reply.feed,
            )
        finally:
            _STREAM_END.reset(token)
        if direct is not None:  # a server that ignored stream=true
            return direct
        if reply.finish_reason is None and end.watched and not end.done:
            raise ConnectionFailed(
                "openai: the stream ended before the reply finished (neither a finish_reason nor data: [DONE]; "
                "cut mid-way). Fix: nothing; tether asks again",
                provider="openai",
            )
        return reply.finish()

    def _convert(self, exc: BaseException) -> ProviderError | None:
        """The tether error for an SDK or transport exception (None: not a provider error)."""
        return convert_error(exc, key_hint=self._key_hint, base_url=self.base_url)


def convert_error(exc: BaseException, *, key_hint: str, base_url: str | None) -> ProviderError | None:
    """The tether error for an ``openai`` SDK or transport exception (None: not a provider error).

    Shared by the Chat Completions and Responses adapters (one SDK, one set of exception classes). The
    decision is keyed on the SDK's exception class and the body's ``type`` and ``code`` (``classify``).
    """
    if isinstance(exc, _sdk.APIStatusError):
        message, kind, code = error_fields(exc.body)
        return classify(
            "openai",
            status=exc.status_code,
            message=message or exc.message,
            error_type=kind,
            code=code,
            headers=exc.response.headers,
            key_hint=key_hint,
            category=category_of(exc, _sdk),
        )
    if isinstance(exc, _sdk.APIConnectionError) or is_transport_error(exc):
        return connection_failed("openai", exc)
    if isinstance(exc, _sdk.APIResponseValidationError | json.JSONDecodeError):
        return InvalidResponseError(
            f"openai: the server's reply could not be read ({type(exc).__name__}: {str(exc)[:300]}). "
            f"Fix: check base_url ({base_url or 'the default'}) points at an OpenAI-compatible server",
            provider="openai",
        )
    if isinstance(exc, _sdk.APIError):  # an error object inside the stream
        message, kind, code = error_fields(exc.body)
        return classify(
            "openai",
            status=None,
            message=message or exc.message,
            error_type=kind,
            code=code,
            key_hint=key_hint,
        )
    return None


class _StreamEnd:
    """What the stream being read showed of its end: whether its SSE decoder ran, and saw ``data: [DONE]``."""

    __slots__ = ("done", "watched")

    def __init__(self) -> None:
        self.watched = False
        self.done = False


_STREAM_END: contextvars.ContextVar[_StreamEnd | None] = contextvars.ContextVar(
    "tether_openai_end", default=None
)


class _WatchingDecoder:
    """The SDK's own SSE decoder, noting ``data: [DONE]`` for the stream the running task reads.

    The SDK reads ``[DONE]`` itself and ends the iteration without passing it on, so without this a stream
    that ended with ``[DONE]`` and a stream that the server closed early look the same.
    """

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def iter_bytes(self, iterator: Iterator[bytes]) -> Any:
        return self._inner.iter_bytes(iterator)

    async def aiter_bytes(self, iterator: AsyncIterator[bytes]) -> AsyncIterator[Any]:
        end = _STREAM_END.get()
        if end is not None:
            end.watched = True
        async for event in self._inner.aiter_bytes(iterator):
            if end is not None and isinstance(event.data, str) and event.data.startswith("[DONE]"):
                end.done = True
            yield event


class _Client(_sdk.AsyncOpenAI):
    """``AsyncOpenAI`` whose streams note ``[DONE]`` (``_make_sse_decoder`` is the SDK's hook for decoders)."""

    def _make_sse_decoder(self) -> Any:
        return _WatchingDecoder(super()._make_sse_decoder())


def make_client(api_key: str, base_url: str | None, timeout: float, headers: Mapping[str, str]) -> Any:
    """An SDK client with the SDK's retries off (the driver retries, DESIGN 5.5)."""
    options: dict[str, Any] = {
        "api_key": api_key,
        "timeout": timeout,
        "max_retries": 0,
        "default_headers": dict(headers) or None,
    }
    if base_url:
        options["base_url"] = base_url
    return _Client(**options, **_http_client(timeout))


def _sdk_arguments(body: dict[str, Any]) -> dict[str, Any]:
    """``chat.completions.create`` arguments: the required fields by name, the rest as ``extra_body`` (sent
    as they are, whatever this SDK version's signature knows)."""
    rest = {key: value for key, value in body.items() if key not in ("model", "messages", "stream")}
    return {
        "model": body["model"],
        "messages": body["messages"],
        "stream": bool(body.get("stream")),
        "extra_body": rest,
    }


def _http_client(timeout: float) -> dict[str, Any]:
    """The SDK's own HTTP client class without the wrapper whose ``__del__`` schedules a close on whatever
    loop runs then: a client of a closed loop is dropped quietly instead of failing a task on another loop."""
    make = getattr(_sdk, "DefaultAsyncHttpxClient", None)
    return {"http_client": make(timeout=timeout)} if make is not None else {}


def from_name(name: str) -> OpenAIModel:
    """The model for ``"openai:<name>"`` (``resolve_model``); the key comes from ``OPENAI_API_KEY``."""
    return OpenAIModel(name)


# --------------------------------------------------------------------------------------------------
# tether -> OpenAI


def _data_url(block: Mapping[str, Any]) -> dict[str, Any]:
    media_type = block.get("media_type") or "image/png"
    return {"type": "image_url", "image_url": {"url": f"data:{media_type};base64,{block['data']}"}}


def _texts(blocks: Sequence[Mapping[str, Any]]) -> list[str]:
    return [b["text"] for b in blocks if b.get("type") == "text" and isinstance(b.get("text"), str)]


def _images(blocks: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [b for b in blocks if b.get("type") == "image" and isinstance(b.get("data"), str)]


def _wire_id(block: Mapping[str, Any], *keys: str) -> str:
    for key in keys:
        value = block.get(key)
        if isinstance(value, str) and value:
            return value
    return "call_missing"


def _arguments(args: Any) -> str:
    if isinstance(args, str):
        return args  # what the model sent, when it was not JSON
    return json.dumps({} if args is None else args, ensure_ascii=False)


def _to_wire(message: Message) -> list[dict[str, Any]]:
    """The Chat Completions messages for one tether message."""
    blocks = message.content
    if message.role == "system":
        return [{"role": "system", "content": "\n\n".join(_texts(blocks))}]
    if message.role == "assistant":
        text = "".join(_texts(blocks))
        calls = [
            {
                "id": _wire_id(block, "provider_call_id", "id"),
                "type": "function",
                "function": {"name": block.get("name", ""), "arguments": _arguments(block.get("args"))},
            }
            for block in blocks
            if block.get("type") == "tool_call"
        ]
        wire: dict[str, Any] = {"role": "assistant", "content": text or (None if calls else "")}
        if calls:
            wire["tool_calls"] = calls
        return [wire]
    results = [block for block in blocks if block.get("type") == "tool_result"]
    out: list[dict[str, Any]] = []
    images: list[dict[str, Any]] = []
    for result in results:
        content = result.get("content") or ()
        wire_id = _wire_id(result, "provider_call_id", "call_id")
        found = _images(content)
        text = "\n".join(_texts(content))
        if found:
            text = (text + "\n" if text else "") + f"(the {len(found)} image(s) of this result follow)"
            images.append(
                {"type": "text", "text": f"Images returned by tool call {wire_id} ({result.get('name')}):"}
            )
            images.extend(_data_url(image) for image in found)
        out.append({"role": "tool", "tool_call_id": wire_id, "content": text})
    if images:
        out.append({"role": "user", "content": images})
    if message.role == "tool":
        return out
    rest = [block for block in blocks if block.get("type") != "tool_result"]
    if any(block.get("type") == "image" for block in rest):
        parts: list[dict[str, Any]] = []
        for block in rest:
            if block.get("type") == "text" and block.get("text"):
                parts.append({"type": "text", "text": block["text"]})
            elif block.get("type") == "image" and isinstance(block.get("data"), str):
                parts.append(_data_url(block))
        return [*out, {"role": "user", "content": parts}]
    return [*out, {"role": "user", "content": "\n".join(_texts(rest))}]


# --------------------------------------------------------------------------------------------------
# OpenAI -> tether


def _as_dict(value: Any) -> dict[str, Any]:
    return as_dict(value, "openai", _SERVER)


def usage_of(
    usage: Any,
    *,
    input_key: str = "prompt_tokens",
    output_key: str = "completion_tokens",
    details_key: str = "prompt_tokens_details",
) -> dict[str, int]:
    """tether's usage (docs/decisions.md, "Usage") from an OpenAI usage object.

    OpenAI's input count (``prompt_tokens``; the Responses API's ``input_tokens``) already includes the
    ``cached_tokens`` (and ``cache_write_tokens``) of its details; tether's ``input_tokens`` is the uncached
    rest, so that no token is counted, or charged, twice. The keys are the Chat Completions ones by default.
    """
    if not isinstance(usage, Mapping):
        return {}
    total, output = usage.get(input_key), usage.get(output_key)
    total = total if isinstance(total, int) else 0
    details = usage.get(details_key)
    details = details if isinstance(details, Mapping) else {}
    cached, written = details.get("cached_tokens"), details.get("cache_write_tokens")
    cached = cached if isinstance(cached, int) and cached > 0 else 0
    written = written if isinstance(written, int) and written > 0 else 0
    out = {
        "input_tokens": max(0, total - cached - written),
        "output_tokens": output if isinstance(output, int) else 0,
    }
    if "cached_tokens" in details:
        out["cache_read_input_tokens"] = cached
    if written:
        out["cache_creation_input_tokens"] = written
    return out


def _parse_args(raw: str) -> Any:
    """Parsed arguments; the raw text when it is not JSON (tether's validator answers ``input_error``)."""
    if not raw.strip():
        return {}
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def _reply(
    text: str,
    calls: list[tuple[str | None, str, str]],
    finish: str | None,
    usage: Any,
    model: Any,
    index: int,
) -> ModelReply:
    """A ModelReply from the text and the (id, name, arguments) of each call, ids made up where missing or
    repeated."""
    content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    seen: set[str] = set()
    for n, (call_id, name, arguments) in enumerate(calls):
        if not call_id or call_id in seen:
            call_id = f"call_{index}_{n}"
        seen.add(call_id)
        content.append(
            {"type": "tool_call", "name": name, "args": _parse_args(arguments), "provider_call_id": call_id}
        )
    if finish is None:  # a stream that ended with [DONE] but no finish_reason (some gateways): it finished
        finish = "tool_calls" if calls else "stop"
    return ModelReply(content, finish, usage_of(usage), model if isinstance(model, str) else None)


def _reply_from_completion(
    completion: Mapping[str, Any], index: int, on_text: TextCallback | None
) -> ModelReply:
    """A whole (non-streamed) chat completion as a ModelReply."""
    if completion.get("error"):
        said, kind, code = error_fields(completion)
        raise classify("openai", status=None, message=said, error_type=kind, code=code)
    choices = completion.get("choices") or []
    if not choices or not isinstance(choices[0], Mapping):
        raise InvalidResponseError(
            "openai: the completion has no choices. Fix: check the model name and base_url", provider="openai"
        )
    choice = choices[0]
    message: Mapping[str, Any] = choice.get("message") or {}
    text = message.get("content") or message.get("refusal") or ""
    emit_text(on_text, text)
    calls = [
        (
            call.get("id"),
            (call.get("function") or {}).get("name") or "",
            (call.get("function") or {}).get("arguments") or "",
        )
        for call in message.get("tool_calls") or ()
        if isinstance(call, Mapping)
    ]
    return _reply(
        text, calls, choice.get("finish_reason"), completion.get("usage"), completion.get("model"), index
    )


class _StreamedReply:
    """Folds chat completion chunks into a reply: text deltas, and tool calls accumulated by ``index``."""

    def __init__(self, index: int, on_text: TextCallback | None) -> None:
        self.index = index
        self.on_text = on_text
        self.text: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}
        self.finish_reason: str | None = None
        self.usage: Any = None
        self.model: Any = None

    def feed(self, chunk: Mapping[str, Any]) -> None:
        if chunk.get("error"):
            message, kind, code = error_fields(chunk)
            raise classify("openai", status=None, message=message, error_type=kind, code=code)
        self.model = chunk.get("model") or self.model
        if isinstance(chunk.get("usage"), Mapping):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, Mapping) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            for key in ("content", "refusal"):
                piece = delta.get(key)
                if isinstance(piece, str) and piece:
                    self.text.append(piece)
                    emit_text(self.on_text, piece)
            for call in delta.get("tool_calls") or ():
                self._call(call)
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]

    def _call(self, delta: Mapping[str, Any]) -> None:
        position = delta.get("index")
        if not isinstance(position, int):  # servers that leave out index: a new id starts a new call
            new = delta.get("id") and all(c["id"] != delta.get("id") for c in self.calls.values())
            position = len(self.calls) if new or not self.calls else max(self.calls)
        call = self.calls.setdefault(position, {"id": None, "name": "", "arguments": []})
        if delta.get("id") and not call["id"]:
            call["id"] = delta["id"]
        function = delta.get("function") or {}
        if function.get("name") and not call["name"]:
            call["name"] = function["name"]
        if function.get("arguments"):
            call["arguments"].append(function["arguments"])

    def finish(self) -> ModelReply:
        calls = [(c["id"], c["name"], "".join(c["arguments"])) for _, c in sorted(self.calls.items())]
        return _reply("".join(self.text), calls, self.finish_reason, self.usage, self.model, self.index)
