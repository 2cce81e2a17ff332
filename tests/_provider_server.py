"""A fake model provider on 127.0.0.1 for the adapter tests: Anthropic's and OpenAI's wire formats, offline.

``ProviderServer`` answers each POST with the next scripted ``Reply`` (JSON, or server-sent events sent in
HTTP/1.1 chunks) and records every request (path, headers, JSON body). A reply can end a stream by closing
the socket after some events (``cut_after``), as a dropped connection does. The builders below write the
events the providers' API references describe: Anthropic ``message_start`` / ``content_block_*`` / ``ping``
/ ``message_delta`` (usage) / ``message_stop``; OpenAI ``chat.completion.chunk`` objects with ``tool_calls``
deltas by ``index``, a final usage chunk (``stream_options.include_usage``) and ``data: [DONE]``; OpenAI
Responses API events (``response.created`` ... ``response.output_item.added`` / deltas /
``response.output_item.done`` ... ``response.completed`` with the usage), items built by ``r_message``,
``r_call`` and ``r_reasoning``.
"""

from __future__ import annotations

import collections
import json
import socket
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = [
    "Block",
    "ProviderServer",
    "Recorded",
    "Reply",
    "anthropic_error",
    "anthropic_message",
    "anthropic_stream",
    "json_reply",
    "openai_chunk",
    "openai_completion",
    "openai_error",
    "openai_stream",
    "r_call",
    "r_message",
    "r_reasoning",
    "redacted_thinking_block",
    "responses_body",
    "responses_stream",
    "sse",
    "text_block",
    "thinking_block",
    "tool_use_block",
]


@dataclass
class Recorded:
    """One request the server received."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class Reply:
    """One scripted answer.

    Attributes:
        status: the HTTP status.
        headers: extra response headers (``retry-after``...).
        json: a JSON body.
        raw: a raw body (with ``content_type``), for malformed answers.
        events: server-sent events as (event name or None, data: a JSON object or a string).
        cut_after: close the socket after this many events, without ending the chunked body.
    """

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    json: Any = None
    raw: bytes | None = None
    content_type: str | None = None
    events: list[tuple[str | None, Any]] | None = None
    cut_after: int | None = None


def json_reply(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Reply:
    """A JSON answer."""
    return Reply(status=status, headers=dict(headers or {}), json=body)


def sse(events: Sequence[tuple[str | None, Any]], *, cut_after: int | None = None) -> Reply:
    """A stream of server-sent events (``cut_after``: drop the connection after that many)."""
    return Reply(events=list(events), cut_after=cut_after)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    owner: ProviderServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hangs up mid-stream (the tests cut streams on purpose) is not an error here."""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length)
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode("utf-8", "replace")
        headers = {key.lower(): value for key, value in self.headers.items()}
        reply = self.server.owner._take(Recorded("POST", self.path, headers, body))
        self._send(reply)

    def _send(self, reply: Reply) -> None:
        if reply.events is None:
            if reply.raw is not None:
                data, kind = reply.raw, reply.content_type or "text/html"
            else:
                data, kind = json.dumps(reply.json).encode(), "application/json"
            self.send_response(reply.status)
            self.send_header("content-type", kind)
            self.send_header("content-length", str(len(data)))
            for key, value in reply.headers.items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(data)
            return
        self.send_response(reply.status)
        self.send_header("content-type", "text/event-stream; charset=utf-8")
        self.send_header("cache-control", "no-cache")
        self.send_header("transfer-encoding", "chunked")
        for key, value in reply.headers.items():
            self.send_header(key, value)
        self.end_headers()
        for number, (name, data) in enumerate(reply.events):
            if reply.cut_after is not None and number >= reply.cut_after:
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            text = data if isinstance(data, str) else json.dumps(data)
            frame = (f"event: {name}\n" if name else "") + f"data: {text}\n\n"
            encoded = frame.encode()
            self.wfile.write(f"{len(encoded):x}\r\n".encode() + encoded + b"\r\n")
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


class ProviderServer:
    """The fake provider: ``url``, ``reply(...)`` to script answers, ``requests`` to see what came."""

    def __init__(self) -> None:
        self.requests: list[Recorded] = []
        self._replies: collections.deque[Reply] = collections.deque()
        self._lock = threading.Lock()
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.owner = self
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05})
        self._thread.daemon = True
        self._thread.start()

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``."""
        port = self._server.server_address[1]
        return f"http://127.0.0.1:{port}"

    @property
    def bodies(self) -> list[Any]:
        """The JSON bodies received, in order."""
        return [request.body for request in self.requests]

    def reply(self, *replies: Reply) -> None:
        """Queue answers, used in order; a request past them gets a 400 naming the problem."""
        with self._lock:
            self._replies.extend(replies)

    def _take(self, recorded: Recorded) -> Reply:
        with self._lock:
            self.requests.append(recorded)
            if self._replies:
                return self._replies.popleft()
        return json_reply(
            {
                "type": "error",
                "error": {"type": "invalid_request_error", "message": "fake server: no reply left"},
            },
            status=400,
        )

    def close(self) -> None:
        """Stop serving."""
        self._server.shutdown()
        self._server.server_close()


# --------------------------------------------------------------------------------------------------
# Anthropic (Messages API, https://docs.anthropic.com/en/api/messages-streaming)


@dataclass
class Block:
    """One content block as the stream sends it (start + deltas) and as a whole message holds it."""

    start: dict[str, Any]
    deltas: list[dict[str, Any]]
    final: dict[str, Any]


def text_block(*pieces: str) -> Block:
    """A text block streamed as ``text_delta`` pieces."""
    return Block(
        {"type": "text", "text": ""},
        [{"type": "text_delta", "text": piece} for piece in pieces],
        {"type": "text", "text": "".join(pieces)},
    )


def tool_use_block(tool_id: str | None, name: str, *json_pieces: str) -> Block:
    """A tool_use block whose input arrives as ``input_json_delta`` partial JSON (first piece empty)."""
    start: dict[str, Any] = {"type": "tool_use", "id": tool_id, "name": name, "input": {}}
    if tool_id is None:
        del start["id"]
    joined = "".join(json_pieces)
    try:
        final_input: Any = json.loads(joined) if joined else {}
    except ValueError:
        final_input = joined
    return Block(
        start,
        [{"type": "input_json_delta", "partial_json": piece} for piece in ("", *json_pieces)],
        {**start, "input": final_input},
    )


def thinking_block(pieces: Iterable[str], signature: str) -> Block:
    """An extended thinking block: ``thinking_delta`` pieces, then one ``signature_delta``."""
    pieces = list(pieces)
    return Block(
        {"type": "thinking", "thinking": ""},
        [{"type": "thinking_delta", "thinking": piece} for piece in pieces]
        + [{"type": "signature_delta", "signature": signature}],
        {"type": "thinking", "thinking": "".join(pieces), "signature": signature},
    )


def redacted_thinking_block(data: str) -> Block:
    """A redacted thinking block: all in ``content_block_start``."""
    block = {"type": "redacted_thinking", "data": data}
    return Block(dict(block), [], dict(block))


def anthropic_stream(
    *blocks: Block,
    stop_reason: str = "end_turn",
    model: str = "claude-x-20250101",
    input_tokens: int = 472,
    output_tokens: int = 89,
    cache_read: int = 0,
    cache_write: int = 0,
) -> list[tuple[str | None, Any]]:
    """The events of one streamed message, with ``ping`` events between them as the API sends."""
    usage = {
        "input_tokens": input_tokens,
        "output_tokens": 1,
        "cache_creation_input_tokens": cache_write,
        "cache_read_input_tokens": cache_read,
    }
    events: list[tuple[str | None, Any]] = [
        (
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": "msg_014p7gG3wDgGV9EUtLvnow3U",
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": usage,
                },
            },
        )
    ]
    for index, block in enumerate(blocks):
        events.append(
            (
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": block.start},
            )
        )
        if index == 0:
            events.append(("ping", {"type": "ping"}))
        for delta in block.deltas:
            events.append(
                ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})
            )
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    events.append(
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop_reason, "stop_sequence": None},
                "usage": {"output_tokens": output_tokens},
            },
        )
    )
    events.append(("message_stop", {"type": "message_stop"}))
    return events


def anthropic_message(
    *blocks: Block,
    stop_reason: str = "end_turn",
    model: str = "claude-x-20250101",
    input_tokens: int = 472,
    output_tokens: int = 89,
    cache_read: int = 0,
    cache_write: int = 0,
) -> dict[str, Any]:
    """The same message as a whole (non-streamed) JSON reply."""
    return {
        "id": "msg_014p7gG3wDgGV9EUtLvnow3U",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [block.final for block in blocks],
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
            "cache_creation_input_tokens": cache_write,
            "cache_read_input_tokens": cache_read,
        },
    }


def anthropic_error(status: int, kind: str, message: str, headers: dict[str, str] | None = None) -> Reply:
    """An error answer as the API sends it: ``{"type": "error", "error": {"type", "message"}}``."""
    return json_reply({"type": "error", "error": {"type": kind, "message": message}}, status, headers)


# --------------------------------------------------------------------------------------------------
# OpenAI (Chat Completions, https://platform.openai.com/docs/api-reference/chat-streaming)


def openai_chunk(
    delta: dict[str, Any] | None = None,
    *,
    finish_reason: str | None = None,
    usage: dict[str, Any] | None = None,
    model: str = "gpt-x-2025-01-01",
    choices: bool = True,
) -> dict[str, Any]:
    """One ``chat.completion.chunk``; ``choices=False`` makes the final usage chunk (empty choices)."""
    return {
        "id": "chatcmpl-123",
        "object": "chat.completion.chunk",
        "created": 1694268190,
        "model": model,
        "system_fingerprint": "fp_44709d6fcb",
        "choices": [{"index": 0, "delta": delta or {}, "logprobs": None, "finish_reason": finish_reason}]
        if choices
        else [],
        "usage": usage,
    }


def _usage(prompt: int, completion: int, cached: int | None) -> dict[str, Any]:
    usage: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    if cached is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached, "audio_tokens": 0}
        usage["completion_tokens_details"] = {"reasoning_tokens": 0, "audio_tokens": 0}
    return usage


def openai_stream(
    text: Sequence[str] = (),
    calls: Sequence[tuple[str | None, str, Sequence[str]]] = (),
    *,
    finish_reason: str | None = None,
    prompt_tokens: int = 82,
    completion_tokens: int = 17,
    cached_tokens: int | None = 0,
    include_usage: bool = True,
    done: bool = True,
    finish: bool = True,
) -> list[tuple[str | None, Any]]:
    """The chunks of one streamed completion: a role chunk, text pieces, each call's name then its
    argument pieces (by ``index``), the finish chunk, the usage chunk and ``[DONE]``.

    ``finish=False`` leaves out the finish chunk (no ``finish_reason`` at all), as some OpenAI-compatible
    gateways do; ``done=False`` leaves out ``data: [DONE]``."""
    chunks = [openai_chunk({"role": "assistant", "content": "", "refusal": None})]
    chunks += [openai_chunk({"content": piece}) for piece in text]
    for index, (call_id, name, pieces) in enumerate(calls):
        first: dict[str, Any] = {
            "index": index,
            "type": "function",
            "function": {"name": name, "arguments": ""},
        }
        if call_id is not None:
            first["id"] = call_id
        chunks.append(openai_chunk({"tool_calls": [first]}))
        chunks += [
            openai_chunk({"tool_calls": [{"index": index, "function": {"arguments": p}}]}) for p in pieces
        ]
    if finish:
        chunks.append(openai_chunk({}, finish_reason=finish_reason or ("tool_calls" if calls else "stop")))
    if include_usage:
        chunks.append(
            openai_chunk(choices=False, usage=_usage(prompt_tokens, completion_tokens, cached_tokens))
        )
    events: list[tuple[str | None, Any]] = [(None, chunk) for chunk in chunks]
    if done:
        events.append((None, "[DONE]"))
    return events


def openai_completion(
    text: str | None = None,
    calls: Sequence[tuple[str | None, str, str]] = (),
    *,
    finish_reason: str | None = None,
    prompt_tokens: int = 82,
    completion_tokens: int = 17,
    cached_tokens: int | None = 0,
) -> dict[str, Any]:
    """A whole (non-streamed) ``chat.completion``."""
    message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
    if calls:
        message["tool_calls"] = [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
            for call_id, name, arguments in calls
        ]
    return {
        "id": "chatcmpl-123",
        "object": "chat.completion",
        "created": 1694268190,
        "model": "gpt-x-2025-01-01",
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": finish_reason or ("tool_calls" if calls else "stop"),
            }
        ],
        "usage": _usage(prompt_tokens, completion_tokens, cached_tokens),
    }


def openai_error(
    status: int,
    message: str,
    kind: str = "invalid_request_error",
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> Reply:
    """An error answer as the API sends it: ``{"error": {"message", "type", "param", "code"}}``."""
    return json_reply(
        {"error": {"message": message, "type": kind, "param": None, "code": code}}, status, headers
    )


# --------------------------------------------------------------------------------------------------
# OpenAI Responses API (https://platform.openai.com/docs/api-reference/responses-streaming)


@dataclass
class RItem:
    """One output item: as ``response.output_item.added`` announces it, its delta events, and whole."""

    added: dict[str, Any]
    deltas: list[dict[str, Any]]
    final: dict[str, Any]


def r_message(item_id: str, *pieces: str) -> RItem:
    """An assistant ``message`` item whose text streams as ``response.output_text.delta`` pieces."""
    text = "".join(pieces)
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    empty = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
    base = {"id": item_id, "type": "message", "role": "assistant"}
    deltas: list[dict[str, Any]] = [
        {"type": "response.content_part.added", "item_id": item_id, "content_index": 0, "part": empty}
    ]
    deltas += [
        {
            "type": "response.output_text.delta",
            "item_id": item_id,
            "content_index": 0,
            "delta": piece,
            "logprobs": [],
        }
        for piece in pieces
    ]
    deltas += [
        {
            "type": "response.output_text.done",
            "item_id": item_id,
            "content_index": 0,
            "text": text,
            "logprobs": [],
        },
        {"type": "response.content_part.done", "item_id": item_id, "content_index": 0, "part": part},
    ]
    return RItem(
        {**base, "status": "in_progress", "content": []},
        deltas,
        {**base, "status": "completed", "content": [part]},
    )


def r_call(item_id: str, call_id: str, name: str, *pieces: str) -> RItem:
    """A ``function_call`` item whose arguments stream as ``response.function_call_arguments.delta``."""
    arguments = "".join(pieces)
    base = {"id": item_id, "type": "function_call", "call_id": call_id, "name": name}
    deltas: list[dict[str, Any]] = [
        {"type": "response.function_call_arguments.delta", "item_id": item_id, "delta": piece}
        for piece in pieces
    ]
    deltas.append(
        {"type": "response.function_call_arguments.done", "item_id": item_id, "arguments": arguments}
    )
    return RItem(
        {**base, "arguments": "", "status": "in_progress"},
        deltas,
        {**base, "arguments": arguments, "status": "completed"},
    )


def r_reasoning(item_id: str, summary: Sequence[str], encrypted: str | None) -> RItem:
    """A ``reasoning`` item: summary text deltas; ``encrypted_content`` whole only in its ``done`` event."""
    text = "".join(summary)
    deltas: list[dict[str, Any]] = []
    if summary:
        deltas.append(
            {
                "type": "response.reasoning_summary_part.added",
                "item_id": item_id,
                "summary_index": 0,
                "part": {"type": "summary_text", "text": ""},
            }
        )
        deltas += [
            {
                "type": "response.reasoning_summary_text.delta",
                "item_id": item_id,
                "summary_index": 0,
                "delta": p,
            }
            for p in summary
        ]
        deltas.append(
            {
                "type": "response.reasoning_summary_text.done",
                "item_id": item_id,
                "summary_index": 0,
                "text": text,
            }
        )
    final: dict[str, Any] = {
        "id": item_id,
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": text}] if summary else [],
    }
    if encrypted is not None:
        final["encrypted_content"] = encrypted
    return RItem({**final, "summary": [], "encrypted_content": None}, deltas, final)


def _r_usage(input_tokens: int, output_tokens: int, cached: int, reasoning: int) -> dict[str, Any]:
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": input_tokens + output_tokens,
    }


def responses_body(
    *items: RItem,
    status: str = "completed",
    incomplete: str | None = None,
    model: str = "gpt-x-2025-01-01",
    input_tokens: int = 320,
    output_tokens: int = 48,
    cached_tokens: int = 0,
    reasoning_tokens: int = 0,
    usage: bool = True,
) -> dict[str, Any]:
    """A whole ``response`` object (the non-streamed reply, and what ``response.completed`` carries)."""
    return {
        "id": "resp_67ccd2bed1ec8190b14f964abc0542670bb6a6b452d3795b",
        "object": "response",
        "created_at": 1741476542,
        "status": status,
        "error": None,
        "incomplete_details": {"reason": incomplete} if incomplete else None,
        "model": model,
        "output": [item.final for item in items],
        "parallel_tool_calls": True,
        "store": False,
        "usage": _r_usage(input_tokens, output_tokens, cached_tokens, reasoning_tokens) if usage else None,
    }


def responses_stream(*items: RItem, terminal: bool = True, **options: Any) -> list[tuple[str | None, Any]]:
    """The events of one streamed response, each named by its ``type`` and numbered by ``sequence_number``:
    ``response.created``, ``response.in_progress``, per item ``output_item.added`` / its deltas /
    ``output_item.done``, then ``response.completed`` (``response.incomplete`` for ``status="incomplete"``);
    ``terminal=False`` leaves that last event out."""
    whole = responses_body(*items, **options)
    start = {**whole, "status": "in_progress", "output": [], "usage": None, "incomplete_details": None}
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": start},
        {"type": "response.in_progress", "response": start},
    ]
    for index, item in enumerate(items):
        events.append({"type": "response.output_item.added", "output_index": index, "item": item.added})
        events += [{**delta, "output_index": index} for delta in item.deltas]
        events.append({"type": "response.output_item.done", "output_index": index, "item": item.final})
    if terminal:
        kind = "response.incomplete" if whole["status"] == "incomplete" else "response.completed"
        events.append({"type": kind, "response": whole})
    return [(event["type"], {**event, "sequence_number": n}) for n, event in enumerate(events)]


# --------------------------------------------------------------------------------------------------
# The agent of the end-to-end and crash-resume tests (the same in the killed process and the test)


def calc_agent(model: Any, store: Any, side: Any, **options: Any) -> Any:
    """An agent with one ``add`` tool that records each execution in the side file."""
    from tether import Agent, tool
    from tether.testing import ExecutionLog

    log = ExecutionLog(side)

    @tool(effect="read_only")
    def add(a: int, b: int) -> int:
        """Add two numbers.

        Args:
            a: The first number.
            b: The second number.
        """
        log.record(tool="add", a=a, b=b)
        return a + b

    options.setdefault("retry_delay", 0.01)
    options.setdefault("poll_interval", 0.05)
    return Agent(model, instructions="You add numbers.", tools=[add], store=store, name="calc", **options)


def make_model(provider: str, url: str) -> Any:
    """The adapter under test, pointed at the fake server."""
    if provider == "anthropic":
        from tether.models.anthropic import AnthropicModel

        return AnthropicModel("claude-x", base_url=url, api_key="k")
    if provider == "openai-responses":
        from tether.models.openai_responses import OpenAIResponsesModel

        return OpenAIResponsesModel("o4-mini", base_url=url + "/v1", api_key="k")
    from tether.models.openai import OpenAIModel

    return OpenAIModel("gpt-x", base_url=url + "/v1", api_key="k")


def crash_main(argv: Sequence[str]) -> None:
    """``PROVIDER URL STORE_DIR RUN_ID SIDE``: start a run; ``TETHER_FAILPOINT`` kills the process."""
    from tether import FileStore

    provider, url, store_dir, run_id, side = argv
    agent = calc_agent(make_model(provider, url), FileStore(store_dir), side)
    agent.run("What is 2 + 3?", id=run_id)


if __name__ == "__main__":
    import sys

    crash_main(sys.argv[1:])
