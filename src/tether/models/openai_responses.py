"""OpenAIResponsesModel: OpenAI's Responses API (``POST /v1/responses``), streamed (DESIGN 12).

Needs the ``openai`` SDK (``pip install 'tether[openai]'``); ``import tether`` never imports it. The model
string is ``"openai-responses:<model>"``. The Chat Completions adapter (``OpenAIModel``) stays for
OpenAI-compatible servers; this one shares with it only what is the same thing: the SDK client, the SDK's
error classes and OpenAI's usage accounting (``tether.models.openai``). Wire format, from tether's messages:

- ``instructions``: the agent's instructions; a ``system`` message is ``{"role": "system", "content"}``.
- ``user`` messages: ``{"role": "user", "content"}``, a string or ``input_text`` / ``input_image`` parts.
- ``assistant`` messages, in block order: the raw items the API sent that tether has no block for (a
  ``reasoning`` item with its ``encrypted_content``), unchanged; text as an output ``message`` item; each
  ``tool_call`` as a ``function_call`` item (``call_id`` = the call's ``provider_call_id``). The item ids the
  API gave (``msg_...``, ``fc_...``) are sent back with them, because a reasoning item must be followed by
  the very items that followed it. Other providers' blocks (Anthropic ``thinking``) are left out.
- ``tool`` messages: one ``function_call_output`` item per result (``call_id``, the result's text); a
  result's images go in one ``user`` message after them.
- ``tools``: ``{"type": "function", "name", "description", "parameters", "strict": false}``.

A reply keeps every output item tether has no block for as a provider block, journaled with the reply:
``{"type": "provider", "provider": "openai-responses", "item": {...}}``. An item tether does have blocks for
(a ``message``, a ``function_call``) is kept as a small marker of the same shape holding only its ``type``
and ids, followed by tether's own ``text`` or ``tool_call`` block. By default the request says
``store: false`` (nothing is kept at OpenAI; the journal is the truth) and, for reasoning models, asks for
``reasoning.encrypted_content``, so a resume days later sends the reasoning back without OpenAI's copy.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from ..messages import Message
from ._http_errors import (
    ConnectionFailed,
    InvalidResponseError,
    PerLoop,
    ProviderError,
    classify,
    emit_text,
    error_fields,
    from_callback,
)
from ._streams import as_dict, read_stream
from .base import ModelReply, ModelRequest, TextCallback
from .openai import (
    _arguments,
    _data_url,
    _images,
    _parse_args,
    _texts,
    _wire_id,
    convert_error,
    make_client,
    openai_key,
    usage_of,
)

__all__ = ["PROVIDER", "OpenAIResponsesModel", "from_name"]

PROVIDER = "openai-responses"
"""The ``provider`` of this adapter's provider blocks, and its model string prefix."""

_SERVER = "a server speaking OpenAI's Responses API (usually ending in /v1)"
_REASONING_MODELS = re.compile(r"^(o\d|gpt-5|codex)", re.IGNORECASE)
_TERMINAL = frozenset({"response.completed", "response.incomplete"})


class OpenAIResponsesModel:
    """A model behind OpenAI's Responses API, streamed.

    Args:
        model: the model name (``gpt-4.1-mini``, ``o4-mini``, ``gpt-5``); also this Model's ``name``.
        api_key: the API key; ``OPENAI_API_KEY`` when None (``"not-needed"`` with a ``base_url`` and no key).
        base_url: another server speaking the Responses API (the SDK reads ``OPENAI_BASE_URL`` when None).
        reasoning: the request's ``reasoning`` (``{"effort": "low", "summary": "auto"}``); None leaves it to
            the model.
        store: whether OpenAI keeps the responses (``store``). False by default: tether journals every item
            itself and sends the reasoning back as ``encrypted_content``.
        encrypted_reasoning: ask for ``reasoning.encrypted_content`` (needed with ``store=False`` for
            reasoning to be sent back); None asks for it for reasoning models (``o1``..., ``gpt-5``...) or when
            ``reasoning`` is given.
        max_output_tokens: the most tokens one reply may have; None leaves it to the model.
        timeout: seconds for one request (the SDK's timeout).
        extra_headers: headers sent with every request.
        extra_body: more request fields (``temperature``, ``text``, ``truncation``...), sent as they are.
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
        reasoning: Mapping[str, Any] | None = None,
        store: bool = False,
        encrypted_reasoning: bool | None = None,
        max_output_tokens: int | None = None,
        timeout: float = 600,
        extra_headers: Mapping[str, str] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        stream: bool = True,
    ) -> None:
        if not model or not isinstance(model, str):
            raise ValueError(f"model {model!r} is not a model name. Fix: pass e.g. 'gpt-4.1-mini'")
        key = openai_key(api_key, base_url, "OpenAIResponsesModel(..., api_key=...)")
        if max_output_tokens is not None and max_output_tokens < 1:
            raise ValueError(f"max_output_tokens={max_output_tokens} is not positive. Fix: pass e.g. 4096")
        self.name = model
        self.base_url = base_url
        self.reasoning = dict(reasoning) if reasoning is not None else None
        self.store = store
        if encrypted_reasoning is None:
            encrypted_reasoning = not store and (
                self.reasoning is not None or bool(_REASONING_MODELS.match(model))
            )
        self.encrypted_reasoning = encrypted_reasoning
        self.max_output_tokens = max_output_tokens
        self.timeout = timeout
        self.extra_headers = dict(extra_headers or {})
        self.extra_body = dict(extra_body or {})
        self.stream = stream
        self._api_key = key
        self._key_hint = (
            "the api_key passed to OpenAIResponsesModel"
            if api_key
            else "OPENAI_API_KEY (or OpenAIResponsesModel(api_key=...))"
        )
        self._clients: PerLoop[Any] = PerLoop(
            lambda: make_client(self._api_key, self.base_url, self.timeout, self.extra_headers)
        )

    def __repr__(self) -> str:
        where = f", base_url={self.base_url!r}" if self.base_url else ""
        return f"OpenAIResponsesModel({self.name!r}{where})"

    async def aclose(self) -> None:
        """Close the running event loop's SDK client (a new one is made on the next request)."""
        client = self._clients.pop()
        if client is not None:
            await client.close()

    # ----------------------------------------------------------------------------------------------
    # The request

    def request_body(self, request: ModelRequest) -> dict[str, Any]:
        """The Responses API request for ``request`` (``stream`` included)."""
        items: list[dict[str, Any]] = []
        for message in request.messages:
            items.extend(_to_items(message))
        body: dict[str, Any] = {"model": self.name, "input": items, "store": self.store}
        if request.instructions:
            body["instructions"] = request.instructions
        if request.tools:
            body["tools"] = [
                {
                    "type": "function",
                    "name": schema["name"],
                    "description": schema.get("description") or "",
                    "parameters": schema.get("parameters") or {"type": "object", "properties": {}},
                    "strict": False,
                }
                for schema in request.tools
            ]
        if self.reasoning is not None:
            body["reasoning"] = dict(self.reasoning)
        if self.encrypted_reasoning:
            body["include"] = ["reasoning.encrypted_content"]
        if self.max_output_tokens is not None:
            body["max_output_tokens"] = self.max_output_tokens
        if self.stream:
            body["stream"] = True
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
                response = await client.responses.create(**_sdk_arguments(body))
                return _reply_from_response(_as_dict(response), request.index, on_text)
            return await self._streamed(client, body, request.index, on_text)
        except ProviderError:
            raise
        except Exception as exc:
            mapped = (
                None
                if from_callback(exc)
                else convert_error(exc, key_hint=self._key_hint, base_url=self.base_url)
            )
            if mapped is None:
                raise
            raise mapped from exc

    async def _streamed(
        self, client: Any, body: dict[str, Any], index: int, on_text: TextCallback | None
    ) -> ModelReply:
        stream = await client.responses.create(**_sdk_arguments(body))
        reply = _StreamedReply(index, on_text)
        direct = await read_stream(
            stream,
            provider="openai",
            server=_SERVER,
            base_url=self.base_url,
            on_json=lambda body: _reply_from_response(body, index, on_text),
            feed=reply.feed,
        )
        if direct is not None:  # a server that ignored stream=true
            return direct
        if reply.final is None:
            raise ConnectionFailed(
                "openai: the Responses stream ended before response.completed (cut mid-way). Fix: nothing; "
                "tether asks again",
                provider="openai",
            )
        return reply.finish()


def _sdk_arguments(body: dict[str, Any]) -> dict[str, Any]:
    """``responses.create`` arguments: the model and the stream flag by name, the rest as ``extra_body``
    (sent as they are, whatever this SDK version's signature knows)."""
    rest = {key: value for key, value in body.items() if key not in ("model", "stream")}
    return {"model": body["model"], "stream": bool(body.get("stream")), "extra_body": rest}


def from_name(name: str) -> OpenAIResponsesModel:
    """The model for ``"openai-responses:<name>"`` (``resolve_model``); the key comes from ``OPENAI_API_KEY``."""
    return OpenAIResponsesModel(name)


# --------------------------------------------------------------------------------------------------
# tether -> Responses API


def _user_content(blocks: tuple[dict[str, Any], ...] | list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    if not any(block.get("type") == "image" for block in blocks):
        return "\n".join(_texts(blocks))
    parts: list[dict[str, Any]] = []
    for block in blocks:
        if block.get("type") == "text" and block.get("text"):
            parts.append({"type": "input_text", "text": block["text"]})
        elif block.get("type") == "image" and isinstance(block.get("data"), str):
            parts.append({"type": "input_image", "image_url": _data_url(block)["image_url"]["url"]})
    return parts


def _assistant_items(blocks: tuple[dict[str, Any], ...]) -> list[dict[str, Any]]:
    """An assistant message's items, in block order (see the module docstring)."""
    items: list[dict[str, Any]] = []
    call_ids: dict[str, str] = {}  # call_id -> the function_call item's id, from markers
    message_id: str | None = None
    for block in blocks:
        kind = block.get("type")
        if kind == "provider":
            item = block.get("item")
            if block.get("provider") != PROVIDER or not isinstance(item, Mapping):
                continue
            if item.get("type") == "message" and "content" not in item:
                message_id = item.get("id") if isinstance(item.get("id"), str) else None
            elif item.get("type") == "function_call" and "arguments" not in item:
                if isinstance(item.get("call_id"), str) and isinstance(item.get("id"), str):
                    call_ids[item["call_id"]] = item["id"]
            else:
                items.append(dict(item))
        elif kind == "text" and block.get("text"):
            part = {"type": "output_text", "text": block["text"], "annotations": []}
            wire: dict[str, Any] = {"type": "message", "role": "assistant", "content": [part]}
            if message_id is not None:
                wire.update(id=message_id, status="completed")
                message_id = None
            items.append(wire)
        elif kind == "tool_call":
            call_id = _wire_id(block, "provider_call_id", "id")
            call: dict[str, Any] = {
                "type": "function_call",
                "call_id": call_id,
                "name": block.get("name", ""),
                "arguments": _arguments(block.get("args")),
            }
            if call_id in call_ids:
                call.update(id=call_ids[call_id], status="completed")
            items.append(call)
    return items


def _to_items(message: Message) -> list[dict[str, Any]]:
    """The Responses API input items for one tether message."""
    blocks = message.content
    if message.role == "system":
        return [{"role": "system", "content": "\n\n".join(_texts(blocks))}]
    if message.role == "assistant":
        return _assistant_items(blocks)
    out: list[dict[str, Any]] = []
    images: list[dict[str, Any]] = []
    for result in (block for block in blocks if block.get("type") == "tool_result"):
        content = result.get("content") or ()
        call_id = _wire_id(result, "provider_call_id", "call_id")
        found = _images(content)
        text = "\n".join(_texts(content))
        if found:
            text = (text + "\n" if text else "") + f"(the {len(found)} image(s) of this result follow)"
            images.append(
                {
                    "type": "input_text",
                    "text": f"Images returned by tool call {call_id} ({result.get('name')}):",
                }
            )
            images.extend(
                {"type": "input_image", "image_url": _data_url(i)["image_url"]["url"]} for i in found
            )
        out.append({"type": "function_call_output", "call_id": call_id, "output": text})
    if images:
        out.append({"role": "user", "content": images})
    if message.role == "tool":
        return out
    rest = [block for block in blocks if block.get("type") != "tool_result"]
    return [*out, {"role": "user", "content": _user_content(rest)}]


# --------------------------------------------------------------------------------------------------
# Responses API -> tether


def _as_dict(value: Any) -> dict[str, Any]:
    return as_dict(value, "openai", _SERVER)


def _provider_block(item: Mapping[str, Any]) -> dict[str, Any]:
    return {"type": "provider", "provider": PROVIDER, "item": dict(item)}


def _clean(item: Mapping[str, Any]) -> dict[str, Any]:
    """A raw output item as it is sent back: no ``null`` fields, no ``status``."""
    return {key: value for key, value in item.items() if value is not None and key != "status"}


def _message_text(item: Mapping[str, Any]) -> str:
    parts = item.get("content") or ()
    return "".join(
        part.get("text") or part.get("refusal") or ""
        for part in parts
        if isinstance(part, Mapping) and part.get("type") in ("output_text", "refusal")
    )


def _content(items: Sequence[Mapping[str, Any]], index: int) -> list[dict[str, Any]]:
    """tether's blocks for the output items, in order; call ids made up where missing or repeated."""
    content: list[dict[str, Any]] = []
    seen: set[str] = set()
    calls = 0
    for item in items:
        kind = item.get("type")
        item_id = item.get("id") if isinstance(item.get("id"), str) else None
        if kind == "message":
            text = _message_text(item)
            if item_id:
                content.append(_provider_block({"type": "message", "id": item_id}))
            if text:
                content.append({"type": "text", "text": text})
        elif kind == "function_call":
            call_id = item.get("call_id")
            if not isinstance(call_id, str) or not call_id or call_id in seen:
                call_id = f"call_{index}_{calls}"
            seen.add(call_id)
            calls += 1
            if item_id:
                content.append(_provider_block({"type": "function_call", "id": item_id, "call_id": call_id}))
            arguments = item.get("arguments")
            content.append(
                {
                    "type": "tool_call",
                    "name": item.get("name") or "",
                    "args": _parse_args(arguments if isinstance(arguments, str) else ""),
                    "provider_call_id": call_id,
                }
            )
        elif isinstance(kind, str):
            content.append(_provider_block(_clean(item)))  # reasoning, and any item tether has no block for
    return content


def _stop_reason(response: Mapping[str, Any], content: list[dict[str, Any]]) -> str:
    """The Chat Completions words: ``tool_calls`` or ``stop``; an incomplete response's reason."""
    details = response.get("incomplete_details")
    if response.get("status") == "incomplete" and isinstance(details, Mapping) and details.get("reason"):
        return str(details["reason"])
    return "tool_calls" if any(block["type"] == "tool_call" for block in content) else "stop"


def _usage(usage: Any) -> dict[str, int]:
    return usage_of(
        usage, input_key="input_tokens", output_key="output_tokens", details_key="input_tokens_details"
    )


def _raise_failed(response: Mapping[str, Any]) -> None:
    error = response.get("error")
    said, kind, code = error_fields(error if isinstance(error, Mapping) else {})
    raise classify("openai", status=None, message=said or "the response failed", error_type=kind, code=code)


def _reply_from_response(response: Mapping[str, Any], index: int, on_text: TextCallback | None) -> ModelReply:
    """A whole (non-streamed) Responses API reply as a ModelReply."""
    if response.get("error") and response.get("object") != "response":  # an error body with status 200
        said, kind, code = error_fields(response)
        raise classify("openai", status=None, message=said, error_type=kind, code=code)
    if response.get("status") == "failed":
        _raise_failed(response)
    output = response.get("output")
    if not isinstance(output, list):
        raise InvalidResponseError(
            "openai: the response has no output. Fix: check base_url points at a server speaking the "
            "Responses API (or use OpenAIModel for Chat Completions servers)",
            provider="openai",
        )
    content = _content([item for item in output if isinstance(item, Mapping)], index)
    for block in content:
        if block["type"] == "text":
            emit_text(on_text, block["text"])
    model = response.get("model")
    return ModelReply(
        content,
        _stop_reason(response, content),
        _usage(response.get("usage")),
        model if isinstance(model, str) else None,
    )


class _StreamedReply:
    """Folds the Responses API's stream events into a reply.

    Items come whole in ``response.output_item.done`` (a reasoning item's final ``encrypted_content`` is
    only there); the deltas before it stream the text. ``response.completed`` (or ``.incomplete``) ends the
    stream with the usage; ``response.failed`` and ``error`` events raise.
    """

    def __init__(self, index: int, on_text: TextCallback | None) -> None:
        self.index = index
        self.on_text = on_text
        self.items: dict[int, dict[str, Any]] = {}
        self.texts: dict[int, list[str]] = {}
        self.arguments: dict[int, list[str]] = {}
        self.done: set[int] = set()
        self.final: Mapping[str, Any] | None = None
        self.model: str | None = None

    def feed(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        position = event.get("output_index")
        if kind in ("response.created", "response.in_progress"):
            response = event.get("response") or {}
            self.model = response.get("model") or self.model
        elif kind == "response.output_item.added" and isinstance(position, int):
            self.items.setdefault(position, dict(event.get("item") or {}))
        elif kind in ("response.output_text.delta", "response.refusal.delta") and isinstance(position, int):
            piece = event.get("delta")
            if isinstance(piece, str) and piece:
                self.texts.setdefault(position, []).append(piece)
                emit_text(self.on_text, piece)
        elif kind == "response.function_call_arguments.delta" and isinstance(position, int):
            self.arguments.setdefault(position, []).append(event.get("delta") or "")
        elif kind == "response.output_item.done" and isinstance(position, int):
            self.items[position] = dict(event.get("item") or {})
            self.done.add(position)
        elif kind in _TERMINAL:
            self.final = event.get("response") or {}
        elif kind == "response.failed":
            _raise_failed(event.get("response") or {})
        elif kind == "error":
            said, error_type, code = error_fields(event)
            raise classify("openai", status=None, message=said, error_type=error_type, code=code)

    def _item(self, position: int) -> dict[str, Any]:
        """An item; one whose ``done`` never came (an incomplete response) is made from its deltas."""
        item = self.items[position]
        if position in self.done:
            return item
        if item.get("type") == "message":
            text = "".join(self.texts.get(position, ()))
            return {**item, "content": [{"type": "output_text", "text": text}]}
        if item.get("type") == "function_call":
            return {**item, "arguments": "".join(self.arguments.get(position, ())) or item.get("arguments")}
        return item

    def finish(self) -> ModelReply:
        final = self.final or {}
        items: list[Mapping[str, Any]] = [self._item(position) for position in sorted(self.items)]
        if not items and isinstance(final.get("output"), list):
            items = [item for item in final["output"] if isinstance(item, Mapping)]
        content = _content(items, self.index)
        model = final.get("model") or self.model
        return ModelReply(
            content,
            _stop_reason(final, content),
            _usage(final.get("usage")),
            model if isinstance(model, str) else None,
        )
