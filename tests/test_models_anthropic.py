"""Tests for tether.models.anthropic against a fake Messages API on 127.0.0.1 (no network).

The fake server (tests/_provider_server.py) speaks the wire format of Anthropic's API reference: JSON, and
server-sent events with ``ping``, partial JSON in ``input_json_delta``, thinking and signature deltas, usage
in ``message_delta``. What the adapter sent is read from the server's records.
"""

from __future__ import annotations

import asyncio
import base64
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

anthropic = pytest.importorskip("anthropic")

from _provider_server import (  # noqa: E402
    ProviderServer,
    Reply,
    anthropic_error,
    anthropic_message,
    anthropic_stream,
    calc_agent,
    json_reply,
    redacted_thinking_block,
    sse,
    text_block,
    thinking_block,
    tool_use_block,
)
from tether import FileStore, Message, State  # noqa: E402
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
from tether.models.anthropic import AnthropicModel  # noqa: E402
from tether.testing import ExecutionLog  # noqa: E402

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\nfake").decode()
ADD_SCHEMA = {
    "name": "add",
    "description": "Add two numbers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
}
EPHEMERAL = {"type": "ephemeral"}


@pytest.fixture
def server() -> Iterator[ProviderServer]:
    made = ProviderServer()
    yield made
    made.close()


@pytest.fixture
def model(server: ProviderServer) -> AnthropicModel:
    return AnthropicModel("claude-x", base_url=server.url, api_key="k")


def ask(
    model: AnthropicModel,
    messages: list[Message] | None = None,
    *,
    instructions: str = "Be brief.",
    tools: list[dict[str, Any]] | None = None,
    index: int = 0,
    texts: list[str] | None = None,
) -> ModelReply:
    request = ModelRequest(index, instructions, messages or [Message.user("hi")], tools or [])
    return asyncio.run(model.request(request, texts.append if texts is not None else None))


def fails(model: AnthropicModel, **kwargs: Any) -> Exception:
    with pytest.raises(Exception) as info:
        ask(model, **kwargs)
    return info.value


def key_sent(headers: dict[str, str]) -> str | None:
    """The API key as the SDK sends it (``x-api-key``, or a bearer token in newer SDKs)."""
    if "x-api-key" in headers:
        return headers["x-api-key"]
    auth = headers.get("authorization", "")
    return auth.removeprefix("Bearer ") if auth.startswith("Bearer ") else None


def kinds(state: State) -> list[str]:
    return [entry.kind for entry in state.history]


# --------------------------------------------------------------------------------------------------
# The request


def test_request_has_system_tools_and_cache_breakpoints(
    server: ProviderServer, model: AnthropicModel
) -> None:
    server.reply(sse(anthropic_stream(text_block("ok"))))
    ask(model, [Message.user("What is 2 + 3?")], tools=[ADD_SCHEMA])
    (sent,) = server.requests
    assert sent.path == "/v1/messages"
    assert key_sent(sent.headers) == "k"
    assert sent.headers["anthropic-version"]
    body = sent.body
    assert body["model"] == "claude-x" and body["max_tokens"] == 4096 and body["stream"] is True
    assert body["system"] == [{"type": "text", "text": "Be brief.", "cache_control": EPHEMERAL}]
    assert body["tools"] == [
        {
            "name": "add",
            "description": "Add two numbers.",
            "input_schema": ADD_SCHEMA["parameters"],
            "cache_control": EPHEMERAL,
        }
    ]
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "What is 2 + 3?", "cache_control": EPHEMERAL}]}
    ]
    assert "thinking" not in body


def test_without_cache_no_breakpoints_and_options_pass_through(server: ProviderServer) -> None:
    model = AnthropicModel(
        "claude-x",
        base_url=server.url,
        api_key="k",
        cache=False,
        max_tokens=100,
        thinking=2048,
        extra_headers={"anthropic-beta": "b1"},
        extra_body={"temperature": 0.5},
    )
    server.reply(sse(anthropic_stream(text_block("ok"))))
    ask(model, tools=[ADD_SCHEMA])
    body = server.bodies[0]
    assert body["system"] == "Be brief."
    assert "cache_control" not in body["tools"][0]
    assert body["messages"][0]["content"] == [{"type": "text", "text": "hi"}]
    assert body["max_tokens"] == 100 and body["temperature"] == 0.5
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    assert server.requests[0].headers["anthropic-beta"] == "b1"


def test_messages_alternate_and_tool_results_use_provider_call_ids(
    server: ProviderServer, model: AnthropicModel
) -> None:
    thinking = {"type": "thinking", "thinking": "Add them.", "signature": "EqQBCgIYAhIM1gbcDa9GJwZA2b3h"}
    redacted = {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4a"}
    messages = [
        Message.user("What is 2 + 3, and 1 + 1?"),
        Message.user([{"type": "image", "media_type": "image/png", "data": PNG}]),
        Message.assistant(
            [
                thinking,
                redacted,
                {"type": "text", "text": "Let me add."},
                {
                    "type": "tool_call",
                    "id": "c3_0",
                    "name": "add",
                    "args": {"a": 2, "b": 3},
                    "provider_call_id": "toolu_A",
                },
                {
                    "type": "tool_call",
                    "id": "c3_1",
                    "name": "add",
                    "args": {"a": 1, "b": 1},
                    "provider_call_id": "toolu_B",
                },
            ]
        ),
        Message(
            "tool",
            (
                {
                    "type": "tool_result",
                    "call_id": "c3_0",
                    "name": "add",
                    "provider_call_id": "toolu_A",
                    "outcome": "done",
                    "content": [
                        {"type": "text", "text": "5"},
                        {"type": "image", "media_type": "image/png", "data": PNG},
                    ],
                },
                {
                    "type": "tool_result",
                    "call_id": "c3_1",
                    "name": "add",
                    "provider_call_id": "toolu_B",
                    "outcome": "error",
                    "content": [{"type": "text", "text": "ValueError: no"}],
                },
            ),
        ),
        Message.user("and show your work"),
    ]
    server.reply(sse(anthropic_stream(text_block("ok"))))
    ask(model, messages)
    wire = server.bodies[0]["messages"]
    assert [m["role"] for m in wire] == ["user", "assistant", "user"]  # consecutive user messages merged
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}
    assert wire[0]["content"] == [{"type": "text", "text": "What is 2 + 3, and 1 + 1?"}, image]
    assert wire[1]["content"] == [
        thinking,  # sent back unchanged, signature and all
        redacted,
        {"type": "text", "text": "Let me add."},
        {"type": "tool_use", "id": "toolu_A", "name": "add", "input": {"a": 2, "b": 3}},
        {"type": "tool_use", "id": "toolu_B", "name": "add", "input": {"a": 1, "b": 1}},
    ]
    assert wire[2]["content"] == [
        {"type": "tool_result", "tool_use_id": "toolu_A", "content": [{"type": "text", "text": "5"}, image]},
        {
            "type": "tool_result",
            "tool_use_id": "toolu_B",
            "content": [{"type": "text", "text": "ValueError: no"}],
            "is_error": True,
        },
        {"type": "text", "text": "and show your work", "cache_control": EPHEMERAL},
    ]


def test_another_providers_raw_items_are_left_out(server: ProviderServer, model: AnthropicModel) -> None:
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "x"}
    messages = [
        Message.user("hi"),
        Message.assistant(
            [
                {"type": "provider", "provider": "openai-responses", "item": reasoning},
                {"type": "thinking", "thinking": "mine", "signature": "SIG"},
                {"type": "text", "text": "Hello."},
            ]
        ),
        Message.user("again"),
    ]
    server.reply(sse(anthropic_stream(text_block("ok"))))
    ask(model, messages)
    assert server.bodies[0]["messages"][1]["content"] == [
        {"type": "thinking", "thinking": "mine", "signature": "SIG"},
        {"type": "text", "text": "Hello."},
    ]


def test_empty_text_is_left_out_and_odd_ids_are_made_wire_safe(
    server: ProviderServer, model: AnthropicModel
) -> None:
    messages = [
        Message.user("go"),
        Message.assistant(
            [
                {
                    "type": "tool_call",
                    "id": "c1_0",
                    "name": "add",
                    "args": "{oops",
                    "provider_call_id": "call:1",
                }
            ]
        ),
        Message(
            "tool",
            (
                {
                    "type": "tool_result",
                    "call_id": "c1_0",
                    "name": "add",
                    "provider_call_id": "call:1",
                    "outcome": "input_error",
                    "content": [{"type": "text", "text": ""}],
                },
            ),
        ),
    ]
    server.reply(sse(anthropic_stream(text_block("ok"))))
    ask(model, messages, instructions="")
    body = server.bodies[0]
    assert "system" not in body
    assert body["messages"][1]["content"] == [
        {"type": "tool_use", "id": "call_1", "name": "add", "input": {}}
    ]
    assert body["messages"][2]["content"] == [
        {"type": "tool_result", "tool_use_id": "call_1", "is_error": True, "cache_control": EPHEMERAL}
    ]


# --------------------------------------------------------------------------------------------------
# The reply


def test_text_deltas_reach_on_text_in_order(server: ProviderServer, model: AnthropicModel) -> None:
    server.reply(
        sse(
            anthropic_stream(
                text_block("The ", "answer ", "is ", "5."),
                input_tokens=12,
                output_tokens=7,
                cache_read=100,
                cache_write=20,
            )
        )
    )
    texts: list[str] = []
    reply = ask(model, texts=texts)
    assert texts == ["The ", "answer ", "is ", "5."]
    assert reply == ModelReply(
        [{"type": "text", "text": "The answer is 5."}],
        "end_turn",
        {
            "input_tokens": 12,
            "output_tokens": 7,
            "cache_read_input_tokens": 100,
            "cache_creation_input_tokens": 20,
        },
        "claude-x-20250101",
    )


def test_tool_use_thinking_and_partial_json(server: ProviderServer, model: AnthropicModel) -> None:
    server.reply(
        sse(
            anthropic_stream(
                thinking_block(["I should ", "add."], "EqQBCgIYAhIM1gbcDa9GJwZA2b3h"),
                redacted_thinking_block("EmwKAhgBEgy3va3pzix"),
                text_block("Adding."),
                tool_use_block("toolu_01T1x1fJ34qAmk2tNTrN7Up6", "add", '{"a"', ": 2, ", '"b": ', "3}"),
                tool_use_block("toolu_02", "add", '{"a": 1, "b": 1}'),
                stop_reason="tool_use",
            )
        )
    )
    texts: list[str] = []
    reply = ask(model, tools=[ADD_SCHEMA], texts=texts)
    assert texts == ["Adding."]  # thinking is not text
    assert reply.stop_reason == "tool_use"
    assert reply.content == [
        {"type": "thinking", "thinking": "I should add.", "signature": "EqQBCgIYAhIM1gbcDa9GJwZA2b3h"},
        {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix"},
        {"type": "text", "text": "Adding."},
        {
            "type": "tool_call",
            "name": "add",
            "args": {"a": 2, "b": 3},
            "provider_call_id": "toolu_01T1x1fJ34qAmk2tNTrN7Up6",
        },
        {"type": "tool_call", "name": "add", "args": {"a": 1, "b": 1}, "provider_call_id": "toolu_02"},
    ]


def test_streamed_and_whole_replies_are_equal(server: ProviderServer) -> None:
    blocks = (
        thinking_block(["Hmm."], "SIG"),
        text_block("Let ", "me."),
        tool_use_block("toolu_1", "add", '{"a": ', "1, ", '"b": 2}'),
    )
    options: dict[str, Any] = {
        "stop_reason": "tool_use",
        "input_tokens": 9,
        "output_tokens": 4,
        "cache_read": 3,
        "cache_write": 2,
    }
    server.reply(sse(anthropic_stream(*blocks, **options)), json_reply(anthropic_message(*blocks, **options)))
    streamed_texts: list[str] = []
    whole_texts: list[str] = []
    streamed = ask(AnthropicModel("claude-x", base_url=server.url, api_key="k"), texts=streamed_texts)
    whole = ask(AnthropicModel("claude-x", base_url=server.url, api_key="k", stream=False), texts=whole_texts)
    assert streamed == whole
    assert "".join(streamed_texts) == "".join(whole_texts) == "Let me."
    assert not server.bodies[1].get("stream")


def test_a_server_that_ignores_stream_true_is_read_as_a_whole_reply(
    server: ProviderServer, model: AnthropicModel
) -> None:
    server.reply(json_reply(anthropic_message(text_block("whole"))))
    texts: list[str] = []
    assert ask(model, texts=texts).content == [{"type": "text", "text": "whole"}]
    assert texts == ["whole"]


def test_arguments_that_are_not_json_are_kept_as_text(server: ProviderServer, model: AnthropicModel) -> None:
    server.reply(
        sse(anthropic_stream(tool_use_block("toolu_1", "add", '{"a": 2, "b'), stop_reason="max_tokens"))
    )
    reply = ask(model)
    assert reply.content == [
        {"type": "tool_call", "name": "add", "args": '{"a": 2, "b', "provider_call_id": "toolu_1"}
    ]
    assert reply.stop_reason == "max_tokens"


def test_missing_and_repeated_tool_ids_are_made_up(server: ProviderServer, model: AnthropicModel) -> None:
    server.reply(
        sse(
            anthropic_stream(
                tool_use_block("toolu_same", "add", "{}"),
                tool_use_block("toolu_same", "add", "{}"),
                tool_use_block(None, "add", "{}"),
                stop_reason="tool_use",
            )
        )
    )
    ids = [block["provider_call_id"] for block in ask(model, index=4).content]
    assert ids == ["toolu_same", "toolu_t4_1", "toolu_t4_2"]


# --------------------------------------------------------------------------------------------------
# Errors


@pytest.mark.parametrize(
    ("reply", "error", "retryable", "retry_after", "cause"),
    [
        (
            anthropic_error(429, "rate_limit_error", "Rate limited", {"retry-after": "7"}),
            RateLimitError,
            True,
            7.0,
            "RateLimitError",
        ),
        (
            anthropic_error(529, "overloaded_error", "Overloaded"),
            OverloadedError,
            True,
            None,
            "OverloadedError",
        ),
        (
            anthropic_error(500, "api_error", "Internal server error"),
            ServerError,
            True,
            None,
            "InternalServerError",
        ),
        (
            anthropic_error(503, "api_error", "Unavailable", {"retry-after": "2"}),
            ServerError,
            True,
            2.0,
            "ServiceUnavailableError",
        ),
        (
            anthropic_error(401, "authentication_error", "invalid x-api-key"),
            AuthenticationError,
            False,
            None,
            "AuthenticationError",
        ),
        (
            anthropic_error(403, "permission_error", "no access"),
            AuthenticationError,
            False,
            None,
            "PermissionDeniedError",
        ),
        (
            anthropic_error(
                400, "invalid_request_error", "prompt is too long: 210000 tokens > 200000 maximum"
            ),
            ContextTooLongError,
            False,
            None,
            "BadRequestError",
        ),
        (
            anthropic_error(400, "invalid_request_error", "tools.0.name: bad"),
            BadRequestError,
            False,
            None,
            "BadRequestError",
        ),
        (
            anthropic_error(404, "not_found_error", "model: claude-x"),
            BadRequestError,
            False,
            None,
            "NotFoundError",
        ),
        (
            anthropic_error(402, "billing_error", "Your account has a billing problem"),
            QuotaExceededError,
            False,
            None,
            "PaymentRequiredError",
        ),
        (
            anthropic_error(
                400,
                "invalid_request_error",
                "Your credit balance is too low to access the Anthropic API. Please go to Plans & Billing.",
            ),
            QuotaExceededError,
            False,
            None,
            "BadRequestError",
        ),
        (
            json_reply(
                {
                    "type": "error",
                    "error": {
                        "type": "rate_limit_error",
                        "message": "You have reached your specified API usage limits.",
                        "details": {"error_code": "enforced_spend_limit_reached"},
                    },
                },
                429,
            ),
            QuotaExceededError,
            False,
            None,
            # the SDK's class for this code where it has one (a RateLimitError)
            "EnforcedSpendLimitReachedError"
            if hasattr(anthropic, "EnforcedSpendLimitReachedError")
            else "RateLimitError",
        ),
    ],
)
def test_http_errors_map_to_tethers_own(
    server: ProviderServer,
    model: AnthropicModel,
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
    assert isinstance(exc.__cause__, anthropic.APIStatusError)
    assert "Fix:" in str(exc)
    assert len(server.requests) == 1  # the SDK's own retries are off


def test_auth_error_names_the_key_variable(server: ProviderServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "bad")
    server.reply(anthropic_error(401, "authentication_error", "invalid x-api-key"))
    exc = fails(AnthropicModel("claude-x", base_url=server.url))
    assert "Fix: check ANTHROPIC_API_KEY" in str(exc)
    assert key_sent(server.requests[0].headers) == "bad"


def test_retry_after_as_an_http_date(server: ProviderServer, model: AnthropicModel) -> None:
    server.reply(
        anthropic_error(429, "rate_limit_error", "slow", {"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"})
    )
    exc = fails(model)
    assert isinstance(exc, RateLimitError) and exc.retry_after == 0.0  # a date in the past: no wait


def test_an_error_event_in_the_stream_is_retryable_overload(
    server: ProviderServer, model: AnthropicModel
) -> None:
    events = anthropic_stream(text_block("Hel", "lo"))[:4]  # message_start, block start, ping, "Hel"
    events.append(
        ("error", {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
    )
    server.reply(sse(events))
    texts: list[str] = []
    exc = fails(model, texts=texts)
    assert isinstance(exc, OverloadedError) and exc.retryable
    assert isinstance(exc.__cause__, anthropic.APIStatusError)
    assert texts == ["Hel"]  # the driver yields a reset before asking again


def test_a_cut_stream_is_a_retryable_connection_error(server: ProviderServer, model: AnthropicModel) -> None:
    server.reply(sse(anthropic_stream(text_block("Hel", "lo", " there")), cut_after=5))
    exc = fails(model)
    assert isinstance(exc, ConnectionFailed) and exc.retryable
    assert exc.__cause__ is not None


def test_a_stream_ending_before_message_stop_is_retryable(
    server: ProviderServer, model: AnthropicModel
) -> None:
    server.reply(sse(anthropic_stream(text_block("Hel", "lo"))[:-1]))
    exc = fails(model)
    assert isinstance(exc, ConnectionFailed) and exc.retryable
    assert "message_stop" in str(exc)


def test_no_server_is_a_retryable_connection_error() -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    exc = fails(AnthropicModel("claude-x", base_url=f"http://127.0.0.1:{port}", api_key="k", timeout=5))
    assert isinstance(exc, ConnectionFailed) and exc.retryable
    assert isinstance(exc.__cause__, anthropic.APIConnectionError)


@pytest.mark.parametrize(
    "reply",
    [
        Reply(raw=b"<html>Welcome to nginx</html>", content_type="text/html"),
        sse([("message_start", "{not json")]),
    ],
    ids=["html", "bad-event"],
)
def test_a_malformed_body_is_a_clear_error(
    server: ProviderServer, model: AnthropicModel, reply: Reply
) -> None:
    server.reply(reply)
    exc = fails(model)
    assert isinstance(exc, InvalidResponseError) and not exc.retryable
    assert "Fix: check base_url" in str(exc)


def test_an_error_in_on_text_propagates_as_it_is(server: ProviderServer, model: Any) -> None:
    server.reply(sse(anthropic_stream(text_block("Hel", "lo"))))

    def broken(text: str) -> None:
        raise BrokenPipeError("stdout is closed")  # an OSError, yet not the network's

    with pytest.raises(BrokenPipeError):
        asyncio.run(model.request(ModelRequest(0, "", [Message.user("hi")], []), broken))


# --------------------------------------------------------------------------------------------------
# Construction, clients, model strings


def test_missing_api_key_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(ValueError) as info:
        AnthropicModel("claude-x")
    assert str(info.value) == (
        "ANTHROPIC_API_KEY is not set. Fix: export ANTHROPIC_API_KEY=... or pass AnthropicModel(..., api_key=...)"
    )


def test_resolve_model_strings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "from-env")
    made = resolve_model("anthropic:claude-x")
    assert isinstance(made, AnthropicModel) and made.name == "claude-x"
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    with pytest.raises(ValueError, match="ANTHROPIC_API_KEY is not set"):
        resolve_model("anthropic:claude-x")
    with pytest.raises(ValueError, match="Fix: use 'anthropic:<model>'"):
        resolve_model("nope:x")


def test_a_missing_sdk_names_the_pip_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "anthropic", None)  # import anthropic fails
    monkeypatch.delitem(sys.modules, "tether.models.anthropic")
    with pytest.raises(ValueError) as info:
        resolve_model("anthropic:claude-x")
    assert "Fix: pip install 'tether[anthropic]'" in str(info.value)


def test_import_tether_imports_no_sdk() -> None:
    code = "import sys, tether, tether.models; print('anthropic' in sys.modules, 'openai' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_one_sdk_client_per_event_loop(server: ProviderServer, model: AnthropicModel) -> None:
    server.reply(*(sse(anthropic_stream(text_block("ok"))) for _ in range(3)))

    async def twice() -> tuple[Any, Any]:
        request = ModelRequest(0, "", [Message.user("hi")], [])
        await model.request(request)
        first = model._clients.get()
        await model.request(request)
        return first, model._clients.get()

    first, second = asyncio.run(twice())
    assert first is second
    assert first.max_retries == 0

    async def client() -> Any:
        return model._clients.get()

    assert asyncio.run(client()) is not first


# --------------------------------------------------------------------------------------------------
# End to end: an Agent on the fake server


def tool_turn(text: str = "Let me add.") -> Reply:
    return sse(
        anthropic_stream(
            text_block(text),
            tool_use_block("toolu_01A", "add", '{"a": 2', ', "b": 3}'),
            stop_reason="tool_use",
        )
    )


def answer(text: str = "2 + 3 = 5.") -> Reply:
    return sse(anthropic_stream(text_block(*re.split(r"(?<= )", text))))


def test_agent_completes_a_tool_turn(server: ProviderServer, model: AnthropicModel, tmp_path: Path) -> None:
    server.reply(tool_turn(), answer("It is 5."))
    texts: list[str] = []
    agent = calc_agent(model, FileStore(tmp_path / "runs"), tmp_path / "side", on_text=texts.append)
    state = agent.run("What is 2 + 3?")
    assert state.status == "completed" and state.answer == "It is 5."
    assert "".join(texts) == "Let me add.It is 5."
    replied = [e for e in state.history if e.kind == "model_replied"]
    call = replied[0].content[1]
    assert call == {
        "type": "tool_call",
        "id": call["id"],
        "name": "add",
        "args": {"a": 2, "b": 3},
        "provider_call_id": "toolu_01A",
    }
    assert call["id"] == f"c{replied[0].seq}_0"  # tether's id in the journal, the provider's on the wire
    second = server.bodies[1]["messages"]
    assert second[1]["content"][-1] == {
        "type": "tool_use",
        "id": "toolu_01A",
        "name": "add",
        "input": {"a": 2, "b": 3},
    }
    assert second[2]["content"][0] == {
        "type": "tool_result",
        "tool_use_id": "toolu_01A",
        "content": [{"type": "text", "text": "5"}],
        "cache_control": EPHEMERAL,
    }
    assert replied[1].usage["input_tokens"] == 472
    assert state.usage["output_tokens"] == 2 * 89


def test_agent_retries_a_rate_limit(server: ProviderServer, model: AnthropicModel, tmp_path: Path) -> None:
    server.reply(anthropic_error(429, "rate_limit_error", "Rate limited", {"retry-after": "0"}), answer())
    state = calc_agent(model, FileStore(tmp_path / "runs"), tmp_path / "side").run("hi")
    assert kinds(state)[-3:] == ["model_failed", "model_replied", "run_stopped"]
    failed = next(e for e in state.history if e.kind == "model_failed")
    assert failed.retryable is True and failed.error_type == "RateLimitError"
    assert state.status == "completed" and len(server.requests) == 2


def test_agent_retries_a_cut_stream_and_the_stream_resets(
    server: ProviderServer, model: AnthropicModel, tmp_path: Path
) -> None:
    server.reply(sse(anthropic_stream(text_block("Hel", "lo")), cut_after=4), answer("Hello there"))
    agent = calc_agent(model, FileStore(tmp_path / "runs"), tmp_path / "side")

    async def collect() -> list[Any]:
        return [event async for event in agent.stream("hi")]

    events = asyncio.run(collect())
    shown = [(e.type, getattr(e, "text", None)) for e in events if e.type in ("text", "reset")]
    assert shown == [("text", "Hel"), ("reset", None), ("text", "Hello "), ("text", "there")]
    entries = [e.entry.kind for e in events if e.type == "entry"]
    assert entries[-3:] == ["model_failed", "model_replied", "run_stopped"]


def test_agent_stops_failed_on_an_auth_error(
    server: ProviderServer, model: AnthropicModel, tmp_path: Path
) -> None:
    server.reply(anthropic_error(401, "authentication_error", "invalid x-api-key"))
    store = FileStore(tmp_path / "runs")
    agent = calc_agent(model, store, tmp_path / "side")
    with pytest.raises(AuthenticationError) as info:
        agent.run("hi", id="auth")
    assert isinstance(info.value.__cause__, anthropic.AuthenticationError)
    state = store.load("auth")
    assert kinds(state)[-2:] == ["model_failed", "run_stopped"]
    assert getattr(state.history[-2], "retryable", None) is False
    assert state.status == "failed" and len(server.requests) == 1


def test_crash_and_resume_sends_the_journaled_results(
    server: ProviderServer, model: AnthropicModel, tmp_path: Path
) -> None:
    server.reply(tool_turn())
    tests = Path(__file__).parent
    env = {**os.environ, "TETHER_FAILPOINT": "after_append:tool_finished", "PYTHONPATH": str(tests)}
    side = tmp_path / "side"
    proc = subprocess.run(
        [
            sys.executable,
            str(tests / "_provider_server.py"),
            "anthropic",
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
    assert proc.returncode == -9, proc.stderr.decode()  # killed right after tool_finished was durable
    server.reply(answer("5."))
    state = calc_agent(model, FileStore(tmp_path / "runs"), side).resume("r1")
    assert state.status == "completed" and state.answer == "5."
    assert len(ExecutionLog(side).records()) == 1  # the tool never ran again
    resumed = server.bodies[1]["messages"]
    assert [m["role"] for m in resumed] == ["user", "assistant", "user"]
    assert resumed[1]["content"][-1]["id"] == "toolu_01A"
    assert resumed[2]["content"][0]["tool_use_id"] == "toolu_01A"
    assert resumed[2]["content"][0]["content"] == [{"type": "text", "text": "5"}]
