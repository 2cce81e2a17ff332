"""Tests for tether.models.openai against a fake Chat Completions server on 127.0.0.1 (no network).

The fake server (tests/_provider_server.py) speaks the wire format of OpenAI's API reference: JSON, and
``chat.completion.chunk`` server-sent events with ``tool_calls`` deltas split by ``index``, a final usage
chunk (``stream_options.include_usage``) and ``data: [DONE]``. Every model here is built with ``base_url``:
the same code path as any OpenAI-compatible server (vLLM, Ollama, llama.cpp, LM Studio).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

openai = pytest.importorskip("openai")

from _provider_server import (  # noqa: E402
    ProviderServer,
    Reply,
    calc_agent,
    json_reply,
    openai_chunk,
    openai_completion,
    openai_error,
    openai_stream,
    sse,
)
from tether import FileStore, Message, State  # noqa: E402
from tether.budgets import cost_of  # noqa: E402
from tether.models import ModelReply, ModelRequest, resolve_model  # noqa: E402
from tether.models._http_errors import (  # noqa: E402
    AuthenticationError,
    BadRequestError,
    ConnectionFailed,
    ContextTooLongError,
    InvalidResponseError,
    OverloadedError,
    QuotaExceededError,
    RateLimitError,
    ServerError,
)
from tether.models.openai import OpenAIModel  # noqa: E402
from tether.testing import ExecutionLog  # noqa: E402

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\nfake").decode()
DATA_URL = f"data:image/png;base64,{PNG}"
ADD_SCHEMA = {
    "name": "add",
    "description": "Add two numbers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
}


@pytest.fixture
def server() -> Iterator[ProviderServer]:
    made = ProviderServer()
    yield made
    made.close()


@pytest.fixture
def model(server: ProviderServer) -> OpenAIModel:
    return OpenAIModel("gpt-x", base_url=server.url + "/v1", api_key="k")


def ask(
    model: OpenAIModel,
    messages: list[Message] | None = None,
    *,
    instructions: str = "Be brief.",
    tools: list[dict[str, Any]] | None = None,
    index: int = 0,
    texts: list[str] | None = None,
) -> ModelReply:
    request = ModelRequest(index, instructions, messages or [Message.user("hi")], tools or [])
    return asyncio.run(model.request(request, texts.append if texts is not None else None))


def fails(model: OpenAIModel, **kwargs: Any) -> Exception:
    with pytest.raises(Exception) as info:
        ask(model, **kwargs)
    return info.value


def kinds(state: State) -> list[str]:
    return [entry.kind for entry in state.history]


def result(
    call_id: str, provider_call_id: str, content: list[dict[str, Any]], outcome: str = "done"
) -> dict[str, Any]:
    return {
        "type": "tool_result",
        "call_id": call_id,
        "name": "add",
        "provider_call_id": provider_call_id,
        "outcome": outcome,
        "content": content,
    }


# --------------------------------------------------------------------------------------------------
# The request


def test_request_has_system_tools_and_stream_usage(server: ProviderServer, model: OpenAIModel) -> None:
    server.reply(sse(openai_stream(["ok"])))
    ask(model, [Message.user("What is 2 + 3?")], tools=[ADD_SCHEMA])
    (sent,) = server.requests
    assert sent.path == "/v1/chat/completions"
    assert sent.headers["authorization"] == "Bearer k"
    assert sent.body == {
        "model": "gpt-x",
        "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What is 2 + 3?"},
        ],
        "tools": [{"type": "function", "function": ADD_SCHEMA}],
    }


def test_stream_usage_off_and_options_pass_through(server: ProviderServer) -> None:
    model = OpenAIModel(
        "local-model",
        base_url=server.url + "/v1",
        stream_usage=False,
        extra_headers={"x-team": "t1"},
        extra_body={"temperature": 0.2, "max_completion_tokens": 50},
    )
    server.reply(sse(openai_stream(["ok"], include_usage=False)))
    reply = ask(model, instructions="")
    body = server.bodies[0]
    assert "stream_options" not in body and "tools" not in body
    assert body["messages"] == [{"role": "user", "content": "hi"}]
    assert body["temperature"] == 0.2 and body["max_completion_tokens"] == 50
    headers = server.requests[0].headers
    assert headers["x-team"] == "t1" and headers["authorization"] == "Bearer not-needed"
    assert reply.usage == {}


def test_history_maps_to_chat_messages(server: ProviderServer, model: OpenAIModel) -> None:
    messages = [
        Message.user(
            [
                {"type": "text", "text": "Add these:"},
                {"type": "image", "media_type": "image/png", "data": PNG},
            ]
        ),
        Message.assistant(
            [
                {"type": "thinking", "thinking": "Add them.", "signature": "SIG"},  # another provider's block
                {"type": "text", "text": "Adding."},
                {
                    "type": "tool_call",
                    "id": "c2_0",
                    "name": "add",
                    "args": {"a": 2, "b": 3},
                    "provider_call_id": "call_A",
                },
                {
                    "type": "tool_call",
                    "id": "c2_1",
                    "name": "add",
                    "args": '{"a": 1',
                    "provider_call_id": "call_B",
                },
            ]
        ),
        Message(
            "tool",
            (
                result(
                    "c2_0",
                    "call_A",
                    [
                        {"type": "text", "text": "5"},
                        {"type": "image", "media_type": "image/png", "data": PNG},
                    ],
                ),
                result("c2_1", "call_B", [{"type": "text", "text": "invalid arguments"}], "input_error"),
            ),
        ),
        Message.user("thanks"),
    ]
    server.reply(sse(openai_stream(["ok"])))
    ask(model, messages)
    assert server.bodies[0]["messages"] == [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Add these:"},
                {"type": "image_url", "image_url": {"url": DATA_URL}},
            ],
        },
        {
            "role": "assistant",
            "content": "Adding.",
            "tool_calls": [
                {
                    "id": "call_A",
                    "type": "function",
                    "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'},
                },
                {"id": "call_B", "type": "function", "function": {"name": "add", "arguments": '{"a": 1'}},
            ],
        },
        {"role": "tool", "tool_call_id": "call_A", "content": "5\n(the 1 image(s) of this result follow)"},
        {"role": "tool", "tool_call_id": "call_B", "content": "invalid arguments"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Images returned by tool call call_A (add):"},
                {"type": "image_url", "image_url": {"url": DATA_URL}},
            ],
        },
        {"role": "user", "content": "thanks"},
    ]


def test_an_assistant_message_of_calls_only_has_null_content(
    server: ProviderServer, model: OpenAIModel
) -> None:
    messages = [
        Message.user("go"),
        Message.assistant(
            [{"type": "tool_call", "id": "c1_0", "name": "add", "args": None, "provider_call_id": "call_1"}]
        ),
        Message("tool", (result("c1_0", "call_1", [{"type": "text", "text": ""}]),)),
    ]
    server.reply(sse(openai_stream(["ok"])))
    ask(model, messages)
    wire = server.bodies[0]["messages"]
    assert wire[2] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "add", "arguments": "{}"}}],
    }
    assert wire[3] == {"role": "tool", "tool_call_id": "call_1", "content": ""}


# --------------------------------------------------------------------------------------------------
# The reply


def test_text_deltas_reach_on_text_in_order(server: ProviderServer, model: OpenAIModel) -> None:
    server.reply(
        sse(
            openai_stream(
                ["The ", "answer ", "is ", "5."], prompt_tokens=12, completion_tokens=7, cached_tokens=8
            )
        )
    )
    texts: list[str] = []
    reply = ask(model, texts=texts)
    assert texts == ["The ", "answer ", "is ", "5."]
    assert reply == ModelReply(
        [{"type": "text", "text": "The answer is 5."}],
        "stop",
        {
            "input_tokens": 4,
            "output_tokens": 7,
            "cache_read_input_tokens": 8,
        },  # 12 prompt tokens, 8 of them cached
        "gpt-x-2025-01-01",
    )


def test_tool_call_deltas_are_joined_by_index(server: ProviderServer, model: OpenAIModel) -> None:
    # two parallel calls whose argument pieces interleave, as the API allows
    first = {"index": 0, "id": "call_A", "type": "function", "function": {"name": "add", "arguments": ""}}
    second = {"index": 1, "id": "call_B", "type": "function", "function": {"name": "add", "arguments": ""}}
    pieces = [(0, '{"a": 2,'), (1, '{"a": 1'), (0, ' "b": 3}'), (1, ', "b": 1}')]
    chunks = [
        openai_chunk({"role": "assistant", "content": None}),
        openai_chunk({"tool_calls": [first]}),
        openai_chunk({"tool_calls": [second]}),
        *(openai_chunk({"tool_calls": [{"index": i, "function": {"arguments": p}}]}) for i, p in pieces),
        openai_chunk({}, finish_reason="tool_calls"),
        openai_chunk(choices=False, usage={"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}),
    ]
    server.reply(sse([*((None, c) for c in chunks), (None, "[DONE]")]))
    reply = ask(model, tools=[ADD_SCHEMA])
    assert reply.content == [
        {"type": "tool_call", "name": "add", "args": {"a": 2, "b": 3}, "provider_call_id": "call_A"},
        {"type": "tool_call", "name": "add", "args": {"a": 1, "b": 1}, "provider_call_id": "call_B"},
    ]
    assert reply.stop_reason == "tool_calls"
    assert reply.usage == {"input_tokens": 5, "output_tokens": 3}


def test_streamed_and_whole_replies_are_equal(server: ProviderServer) -> None:
    calls = [("call_1", "add", ['{"a": ', '1, "b": 2}'])]
    server.reply(
        sse(openai_stream(["Let ", "me."], calls, cached_tokens=4)),
        json_reply(openai_completion("Let me.", [("call_1", "add", '{"a": 1, "b": 2}')], cached_tokens=4)),
    )
    streamed_texts: list[str] = []
    whole_texts: list[str] = []
    streamed = ask(OpenAIModel("gpt-x", base_url=server.url + "/v1"), texts=streamed_texts)
    whole = ask(OpenAIModel("gpt-x", base_url=server.url + "/v1", stream=False), texts=whole_texts)
    assert streamed == whole
    assert "".join(streamed_texts) == "".join(whole_texts) == "Let me."
    assert not server.bodies[1].get("stream") and "stream_options" not in server.bodies[1]


def test_a_server_that_ignores_stream_true_is_read_as_a_whole_reply(
    server: ProviderServer, model: OpenAIModel
) -> None:
    server.reply(json_reply(openai_completion("whole")))
    texts: list[str] = []
    assert ask(model, texts=texts).content == [{"type": "text", "text": "whole"}]
    assert texts == ["whole"]


def test_arguments_that_are_not_json_are_kept_as_text(server: ProviderServer, model: OpenAIModel) -> None:
    server.reply(sse(openai_stream([], [("call_1", "add", ['{"a": 2', ", b: 3"])])))
    reply = ask(model)
    assert reply.content == [
        {"type": "tool_call", "name": "add", "args": '{"a": 2, b: 3', "provider_call_id": "call_1"}
    ]


def test_missing_and_repeated_call_ids_are_made_up(server: ProviderServer, model: OpenAIModel) -> None:
    server.reply(
        sse(openai_stream([], [("call_0", "add", ["{}"]), ("call_0", "add", ["{}"]), (None, "add", [""])]))
    )
    reply = ask(model, index=3)
    assert [b["provider_call_id"] for b in reply.content] == ["call_0", "call_3_1", "call_3_2"]
    assert reply.content[2]["args"] == {}  # empty arguments: no arguments


def test_calls_without_index_are_told_apart_by_id(server: ProviderServer, model: OpenAIModel) -> None:
    chunks = [
        openai_chunk(
            {"tool_calls": [{"id": "call_A", "function": {"name": "add", "arguments": '{"a": 1,'}}]}
        ),
        openai_chunk({"tool_calls": [{"function": {"arguments": ' "b": 2}'}}]}),
        openai_chunk({"tool_calls": [{"id": "call_B", "function": {"name": "add", "arguments": "{}"}}]}),
        openai_chunk({}, finish_reason="tool_calls"),
    ]
    server.reply(sse([(None, c) for c in chunks]))
    reply = ask(model)
    assert [(b["provider_call_id"], b["args"]) for b in reply.content] == [
        ("call_A", {"a": 1, "b": 2}),
        ("call_B", {}),
    ]


# --------------------------------------------------------------------------------------------------
# Errors


@pytest.mark.parametrize(
    ("reply", "error", "retryable", "retry_after", "cause"),
    [
        (
            openai_error(429, "Rate limit reached", "requests", "rate_limit_exceeded", {"retry-after": "3"}),
            RateLimitError,
            True,
            3.0,
            "RateLimitError",
        ),
        (
            openai_error(429, "slow down", "tokens", None, {"retry-after-ms": "1500"}),
            RateLimitError,
            True,
            1.5,
            "RateLimitError",
        ),
        (
            openai_error(
                429,
                "You exceeded your current quota, please check your plan and billing details.",
                "insufficient_quota",
                "insufficient_quota",
            ),
            QuotaExceededError,
            False,
            None,
            "RateLimitError",
        ),
        (
            openai_error(429, "You exceeded your current quota.", "insufficient_quota", None),
            QuotaExceededError,
            False,
            None,
            "RateLimitError",
        ),
        (
            openai_error(429, "No credit left.", "insufficient_quota", "credit_balance_exhausted"),
            QuotaExceededError,
            False,
            None,
            "RateLimitError",
        ),
        (
            openai_error(500, "The server had an error", "server_error"),
            ServerError,
            True,
            None,
            "InternalServerError",
        ),
        (
            openai_error(503, "The engine is currently overloaded", "server_error"),
            ServerError,
            True,
            None,
            "InternalServerError",
        ),
        (
            openai_error(401, "Incorrect API key provided", "invalid_request_error", "invalid_api_key"),
            AuthenticationError,
            False,
            None,
            "AuthenticationError",
        ),
        (
            openai_error(
                400,
                "This model's maximum context length is 128000 tokens. However, your messages resulted in 130000 tokens.",
                "invalid_request_error",
                "context_length_exceeded",
            ),
            ContextTooLongError,
            False,
            None,
            "BadRequestError",
        ),
        (
            openai_error(400, "Invalid schema for function 'add'", "invalid_request_error"),
            BadRequestError,
            False,
            None,
            "BadRequestError",
        ),
        (
            openai_error(404, "The model `gpt-x` does not exist", "invalid_request_error", "model_not_found"),
            BadRequestError,
            False,
            None,
            "NotFoundError",
        ),
        (
            openai_error(422, "unprocessable", "invalid_request_error"),
            BadRequestError,
            False,
            None,
            "UnprocessableEntityError",
        ),
    ],
)
def test_http_errors_map_to_tethers_own(
    server: ProviderServer,
    model: OpenAIModel,
    reply: Reply,
    error: type[Exception],
    retryable: bool,
    retry_after: float | None,
    cause: str,
) -> None:
    server.reply(reply)
    exc = fails(model)
    assert type(exc) is error
    assert exc.retryable is retryable  # type: ignore[attr-defined]
    assert exc.retry_after == retry_after  # type: ignore[attr-defined]
    assert type(exc.__cause__).__name__ == cause
    assert isinstance(exc.__cause__, openai.APIStatusError)
    assert "Fix:" in str(exc)
    assert len(server.requests) == 1  # the SDK's own retries are off


def test_auth_error_names_the_key_variable(server: ProviderServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "bad")
    server.reply(openai_error(401, "Incorrect API key provided", "invalid_request_error", "invalid_api_key"))
    exc = fails(OpenAIModel("gpt-x", base_url=server.url + "/v1"))
    assert "Fix: check OPENAI_API_KEY" in str(exc)
    assert server.requests[0].headers["authorization"] == "Bearer bad"


def test_an_error_object_in_the_stream_is_mapped(server: ProviderServer, model: OpenAIModel) -> None:
    events = openai_stream(["Hel", "lo"])[:2]
    events.append(
        (None, {"error": {"message": "The server had an error", "type": "server_error", "code": None}})
    )
    server.reply(sse(events))
    texts: list[str] = []
    exc = fails(model, texts=texts)
    assert isinstance(exc, ServerError) and exc.retryable
    assert isinstance(exc.__cause__, openai.APIError)
    assert texts == ["Hel"]


def test_an_overloaded_error_in_the_stream_is_retryable(server: ProviderServer, model: OpenAIModel) -> None:
    server.reply(
        sse([(None, {"error": {"message": "Overloaded", "type": "overloaded_error", "code": None}})])
    )
    exc = fails(model)
    assert isinstance(exc, OverloadedError) and exc.retryable


def test_a_cut_stream_is_a_retryable_connection_error(server: ProviderServer, model: OpenAIModel) -> None:
    server.reply(sse(openai_stream(["Hel", "lo", " there"]), cut_after=3))
    exc = fails(model)
    assert isinstance(exc, ConnectionFailed) and exc.retryable
    assert isinstance(exc.__cause__, openai.APIConnectionError)


def test_a_stream_ending_before_it_finished_is_retryable(server: ProviderServer, model: OpenAIModel) -> None:
    server.reply(sse(openai_stream(["Hel", "lo"])[:3]))
    exc = fails(model)
    assert isinstance(exc, ConnectionFailed) and exc.retryable
    assert "finish_reason" in str(exc)


def test_a_stream_ending_with_done_but_no_finish_reason_is_a_finished_reply(
    server: ProviderServer, model: OpenAIModel
) -> None:
    # an OpenAI-compatible gateway: tool call deltas, the usage chunk, data: [DONE], and never a finish_reason
    events = openai_stream(["Let me."], [("call_1", "add", ['{"a": 1,', ' "b": 2}'])], finish=False)
    assert not any(isinstance(d, dict) and any(c["finish_reason"] for c in d["choices"]) for _, d in events)
    server.reply(sse(events), sse(openai_stream(["Done."], finish=False)))
    reply = ask(model)
    assert reply.stop_reason == "tool_calls"  # inferred from what the reply holds
    assert reply.content[1] == {
        "type": "tool_call",
        "name": "add",
        "args": {"a": 1, "b": 2},
        "provider_call_id": "call_1",
    }
    text = ask(model)
    assert (text.stop_reason, text.content) == ("stop", [{"type": "text", "text": "Done."}])


def test_a_stream_with_a_finish_reason_but_no_done_is_a_finished_reply(
    server: ProviderServer, model: OpenAIModel
) -> None:
    server.reply(sse(openai_stream(["Hello"], done=False)))
    assert ask(model).content == [{"type": "text", "text": "Hello"}]


def test_no_server_is_a_retryable_connection_error() -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    exc = fails(OpenAIModel("gpt-x", base_url=f"http://127.0.0.1:{port}/v1", timeout=5))
    assert isinstance(exc, ConnectionFailed) and exc.retryable
    assert isinstance(exc.__cause__, openai.APIConnectionError)


@pytest.mark.parametrize(
    "reply",
    [
        Reply(raw=b"<html>Welcome to nginx</html>", content_type="text/html"),
        sse([(None, "{not json")]),
    ],
    ids=["html", "bad-chunk"],
)
def test_a_malformed_body_is_a_clear_error(server: ProviderServer, model: OpenAIModel, reply: Reply) -> None:
    server.reply(reply)
    exc = fails(model)
    assert isinstance(exc, InvalidResponseError) and not exc.retryable
    assert "Fix: check base_url" in str(exc)


def test_an_error_in_on_text_propagates_as_it_is(server: ProviderServer, model: Any) -> None:
    server.reply(sse(openai_stream(["Hel", "lo"])))

    def broken(text: str) -> None:
        raise BrokenPipeError("stdout is closed")  # an OSError, yet not the network's

    with pytest.raises(BrokenPipeError):
        asyncio.run(model.request(ModelRequest(0, "", [Message.user("hi")], []), broken))


# --------------------------------------------------------------------------------------------------
# Construction, model strings


def test_missing_api_key_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(ValueError) as info:
        OpenAIModel("gpt-x")
    assert str(info.value).startswith(
        "OPENAI_API_KEY is not set. Fix: export OPENAI_API_KEY=... or pass OpenAIModel(..., api_key=...)"
    )
    assert OpenAIModel("llama3", base_url="http://localhost:11434/v1")._api_key == "not-needed"


def test_resolve_model_strings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "from-env")
    made = resolve_model("openai:gpt-x")
    assert isinstance(made, OpenAIModel) and made.name == "gpt-x"
    monkeypatch.delenv("OPENAI_API_KEY")
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(ValueError, match="OPENAI_API_KEY is not set"):
        resolve_model("openai:gpt-x")
    with pytest.raises(
        ValueError, match="Fix: use 'anthropic:<model>', 'openai:<model>' or 'openai-responses:<model>'"
    ):
        resolve_model("openai")


def test_a_missing_sdk_names_the_pip_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "openai", None)
    monkeypatch.delitem(sys.modules, "tether.models.openai")
    with pytest.raises(ValueError) as info:
        resolve_model("openai:gpt-x")
    assert "Fix: pip install 'tether[openai]'" in str(info.value)


# --------------------------------------------------------------------------------------------------
# End to end: an Agent on an OpenAI-compatible server


def tool_turn(arguments: tuple[str, ...] = ('{"a": 2', ', "b": 3}')) -> Reply:
    return sse(openai_stream(["Let me add."], [("call_abc", "add", list(arguments))]))


def answer(*pieces: str) -> Reply:
    return sse(openai_stream(list(pieces) or ["2 + 3 = 5."]))


def test_agent_completes_a_tool_turn(server: ProviderServer, model: OpenAIModel, tmp_path: Path) -> None:
    server.reply(tool_turn(), answer("It is ", "5."))
    texts: list[str] = []
    agent = calc_agent(model, FileStore(tmp_path / "runs"), tmp_path / "side", on_text=texts.append)
    state = agent.run("What is 2 + 3?")
    assert state.status == "completed" and state.answer == "It is 5."
    assert "".join(texts) == "Let me add.It is 5."
    replied = [e for e in state.history if e.kind == "model_replied"]
    call = replied[0].content[1]
    assert call == {
        "type": "tool_call",
        "id": f"c{replied[0].seq}_0",
        "name": "add",
        "args": {"a": 2, "b": 3},
        "provider_call_id": "call_abc",
    }
    second = server.bodies[1]["messages"]
    assert second[2]["tool_calls"] == [
        {"id": "call_abc", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
    ]
    assert second[3] == {"role": "tool", "tool_call_id": "call_abc", "content": "5"}
    assert state.usage["input_tokens"] == 2 * 82


def test_agent_answers_bad_arguments_with_an_input_error(
    server: ProviderServer, model: OpenAIModel, tmp_path: Path
) -> None:
    server.reply(tool_turn(('{"a": 2, "b"',)), answer("Sorry."))
    state = calc_agent(model, FileStore(tmp_path / "runs"), tmp_path / "side").run("What is 2 + 3?")
    finished = next(e for e in state.history if e.kind == "tool_finished")
    assert finished.outcome == "input_error"
    tool_message = server.bodies[1]["messages"][3]
    assert (
        tool_message["tool_call_id"] == "call_abc" and "invalid arguments for add" in tool_message["content"]
    )
    assert server.bodies[1]["messages"][2]["tool_calls"][0]["function"]["arguments"] == '{"a": 2, "b"'


def test_agent_retries_a_rate_limit_then_a_server_error(
    server: ProviderServer, model: OpenAIModel, tmp_path: Path
) -> None:
    server.reply(
        openai_error(429, "Rate limit reached", "requests", "rate_limit_exceeded", {"retry-after": "0"}),
        openai_error(500, "The server had an error", "server_error"),
        answer(),
    )
    state = calc_agent(model, FileStore(tmp_path / "runs"), tmp_path / "side").run("hi")
    assert kinds(state)[-4:] == ["model_failed", "model_failed", "model_replied", "run_stopped"]
    failed = [e for e in state.history if e.kind == "model_failed"]
    assert [(e.error_type, e.retryable) for e in failed] == [("RateLimitError", True), ("ServerError", True)]
    assert state.status == "completed" and len(server.requests) == 3


def test_agent_stops_failed_on_an_auth_error(
    server: ProviderServer, model: OpenAIModel, tmp_path: Path
) -> None:
    server.reply(openai_error(401, "Incorrect API key provided", "invalid_request_error", "invalid_api_key"))
    store = FileStore(tmp_path / "runs")
    with pytest.raises(AuthenticationError) as info:
        calc_agent(model, store, tmp_path / "side").run("hi", id="auth")
    assert isinstance(info.value.__cause__, openai.AuthenticationError)
    state = store.load("auth")
    assert kinds(state)[-2:] == ["model_failed", "run_stopped"]
    assert getattr(state.history[-2], "retryable", None) is False
    assert state.status == "failed" and len(server.requests) == 1


def test_agent_runs_the_tool_of_a_stream_without_finish_reason_once(
    server: ProviderServer, model: OpenAIModel, tmp_path: Path
) -> None:
    server.reply(
        sse(openai_stream([], [("call_abc", "add", ['{"a": 2', ', "b": 3}'])], finish=False)),
        sse(openai_stream(["2 + 3 = 5."], finish=False)),
    )
    state = calc_agent(model, FileStore(tmp_path / "runs"), tmp_path / "side").run("What is 2 + 3?")
    assert state.status == "completed" and state.answer == "2 + 3 = 5."
    assert "model_failed" not in kinds(state) and len(server.requests) == 2
    assert [(r["a"], r["b"]) for r in ExecutionLog(tmp_path / "side").records()] == [(2, 3)]


def test_agent_stops_at_once_on_an_exhausted_quota(
    server: ProviderServer, model: OpenAIModel, tmp_path: Path
) -> None:
    server.reply(
        openai_error(
            429,
            "You exceeded your current quota, please check your plan and billing details.",
            "insufficient_quota",
            "insufficient_quota",
        ),
        answer(),  # never asked
    )
    store = FileStore(tmp_path / "runs")
    with pytest.raises(QuotaExceededError) as info:
        calc_agent(model, store, tmp_path / "side").run("hi", id="quota")
    message = str(info.value)
    assert "Fix: add credits" in message and "another API key" in message and "does not retry" in message
    assert "tether retries" not in message
    assert isinstance(info.value.__cause__, openai.RateLimitError)
    state = store.load("quota")
    assert kinds(state)[-2:] == ["model_failed", "run_stopped"]
    assert getattr(state.history[-2], "retryable", None) is False
    assert state.status == "failed" and len(server.requests) == 1


def test_cached_tokens_are_charged_once_as_openai_bills_them(server: ProviderServer, tmp_path: Path) -> None:
    from genai_prices import Usage, calc_price

    # each request: 2,000 prompt tokens of which 1,500 were read from the cache, 100 completion tokens
    def turn(*args: Any) -> Reply:
        return sse(openai_stream(*args, prompt_tokens=2000, completion_tokens=100, cached_tokens=1500))

    server.reply(turn([], [("call_abc", "add", ['{"a": 2, "b": 3}'])]), turn(["5."]))
    model = OpenAIModel("gpt-4o-mini", base_url=server.url + "/v1", api_key="k")
    # gpt-4o-mini at $0.15 (input), $0.075 (cached input) and $0.60 (output) per million tokens. OpenAI bills a
    # request 500 x 0.15 + 1,500 x 0.075 + 100 x 0.60 = 75 + 112.5 + 60 = $247.5 per million = $0.0002475;
    # charging the cached tokens twice (as input and as cache reads) made it $0.0004725. With max_cost
    # $0.0003 the second request must still be asked ($0.0002475 spent), which the double count refused.
    agent = calc_agent(model, FileStore(tmp_path / "runs"), tmp_path / "side", max_cost=0.0003)
    state = agent.run("What is 2 + 3?")
    assert state.status == "completed" and len(server.requests) == 2
    assert state.usage == {"input_tokens": 1000, "output_tokens": 200, "cache_read_input_tokens": 3000}
    published = calc_price(
        Usage(input_tokens=2000, cache_read_tokens=1500, output_tokens=100),
        "gpt-4o-mini",
        provider_id="openai",
    )
    price = agent.price
    assert price is not None
    assert (price.input, price.cache_read, price.output) == (0.15, 0.075, 0.6)
    assert cost_of(state.usage, price) == pytest.approx(2 * float(published.total_price))
    assert cost_of(state.usage, price) == pytest.approx(2 * 0.0002475)


def test_crash_and_resume_sends_the_journaled_results(
    server: ProviderServer, model: OpenAIModel, tmp_path: Path
) -> None:
    server.reply(tool_turn())
    tests = Path(__file__).parent
    env = {**os.environ, "TETHER_FAILPOINT": "after_append:tool_finished", "PYTHONPATH": str(tests)}
    side = tmp_path / "side"
    proc = subprocess.run(
        [
            sys.executable,
            str(tests / "_provider_server.py"),
            "openai",
            server.url,
            str(tmp_path / "runs"),
            "r1",
            str(side),
        ],
        env=env,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == -9, proc.stderr.decode()
    server.reply(answer("5."))
    state = calc_agent(model, FileStore(tmp_path / "runs"), side).resume("r1")
    assert state.status == "completed" and state.answer == "5."
    assert len(ExecutionLog(side).records()) == 1
    resumed = server.bodies[1]["messages"]
    assert [m["role"] for m in resumed] == ["system", "user", "assistant", "tool"]
    assert resumed[2]["tool_calls"][0]["id"] == resumed[3]["tool_call_id"] == "call_abc"
    assert json.loads(resumed[2]["tool_calls"][0]["function"]["arguments"]) == {"a": 2, "b": 3}
    assert resumed[3]["content"] == "5"
