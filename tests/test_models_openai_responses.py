"""Tests for tether.models.openai_responses against a fake Responses API server on 127.0.0.1 (no network).

The fake server (tests/_provider_server.py) speaks the wire format of OpenAI's Responses API reference:
named server-sent events (``response.created``, ``response.output_item.added``, ``response.output_text.delta``,
``response.function_call_arguments.delta``, ``response.reasoning_summary_text.delta``,
``response.output_item.done``, ``response.completed`` with the usage), and the whole ``response`` object.
"""

from __future__ import annotations

import asyncio
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
    calc_agent,
    json_reply,
    openai_error,
    r_call,
    r_message,
    r_reasoning,
    responses_body,
    responses_stream,
    sse,
)
from tether import FileStore, Message  # noqa: E402
from tether.models import ModelReply, ModelRequest, resolve_model  # noqa: E402
from tether.models._http_errors import (  # noqa: E402
    ConnectionFailed,
    ContextTooLongError,
    QuotaExceededError,
    RateLimitError,
    ServerError,
)
from tether.models.openai_responses import OpenAIResponsesModel  # noqa: E402
from tether.testing import ExecutionLog  # noqa: E402

ADD_SCHEMA = {
    "name": "add",
    "description": "Add two numbers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
}
SECRET = "gAAAAABo-encrypted-reasoning-0123456789"
REASONING = {
    "id": "rs_6820f383d7c08191846711c5df8233bc",
    "type": "reasoning",
    "summary": [{"type": "summary_text", "text": "The user wants a sum; call add."}],
    "encrypted_content": SECRET,
}


@pytest.fixture
def server() -> Iterator[ProviderServer]:
    made = ProviderServer()
    yield made
    made.close()


@pytest.fixture
def model(server: ProviderServer) -> OpenAIResponsesModel:
    return OpenAIResponsesModel("o4-mini", base_url=server.url + "/v1", api_key="k")


def ask(
    model: OpenAIResponsesModel,
    messages: list[Message] | None = None,
    *,
    tools: list[dict[str, Any]] | None = None,
    texts: list[str] | None = None,
    index: int = 0,
) -> ModelReply:
    request = ModelRequest(index, "Be brief.", messages or [Message.user("hi")], tools or [])
    return asyncio.run(model.request(request, texts.append if texts is not None else None))


def fails(model: OpenAIResponsesModel) -> Exception:
    with pytest.raises(Exception) as info:
        ask(model)
    return info.value


def tool_turn() -> Any:
    return sse(
        responses_stream(
            r_reasoning(REASONING["id"], ["The user wants a sum; ", "call add."], SECRET),
            r_call("fc_67ca09c6bedc8190a7abfec07b1a1332", "call_abc", "add", '{"a": 2', ', "b": 3}'),
            input_tokens=320,
            output_tokens=48,
            reasoning_tokens=32,
        )
    )


def answer(*pieces: str) -> Any:
    return sse(responses_stream(r_message("msg_2", *(pieces or ("5.",)))))


# --------------------------------------------------------------------------------------------------
# The request


def test_request_has_instructions_tools_and_stateless_reasoning(
    server: ProviderServer, model: OpenAIResponsesModel
) -> None:
    server.reply(answer())
    ask(model, [Message.user("What is 2 + 3?")], tools=[ADD_SCHEMA])
    (sent,) = server.requests
    assert sent.path == "/v1/responses"
    assert sent.headers["authorization"] == "Bearer k"
    assert sent.body == {
        "model": "o4-mini",
        "stream": True,
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "instructions": "Be brief.",
        "input": [{"role": "user", "content": "What is 2 + 3?"}],
        "tools": [{"type": "function", **ADD_SCHEMA, "strict": False}],
    }


def test_a_model_without_reasoning_asks_for_no_encrypted_content(server: ProviderServer) -> None:
    server.reply(answer())
    ask(OpenAIResponsesModel("gpt-4.1-mini", base_url=server.url + "/v1", api_key="k"))
    assert "include" not in server.bodies[0]
    server.reply(answer())
    options = {"reasoning": {"effort": "low"}, "max_output_tokens": 500, "extra_body": {"temperature": 0.2}}
    ask(OpenAIResponsesModel("gpt-4.1-mini", base_url=server.url + "/v1", api_key="k", **options))
    body = server.bodies[1]
    assert body["reasoning"] == {"effort": "low"} and body["include"] == ["reasoning.encrypted_content"]
    assert body["max_output_tokens"] == 500 and body["temperature"] == 0.2


def test_history_sends_reasoning_items_back_with_the_items_that_followed_them(
    server: ProviderServer, model: OpenAIResponsesModel
) -> None:
    server.reply(tool_turn())
    first = ask(model, tools=[ADD_SCHEMA])
    history = [
        Message.user("What is 2 + 3?"),
        Message.assistant(
            [
                {"type": "thinking", "thinking": "Anthropic's", "signature": "SIG"},  # another provider's
                *first.content,
            ]
        ),
        Message(
            "tool",
            (
                {
                    "type": "tool_result",
                    "call_id": "c2_0",
                    "name": "add",
                    "provider_call_id": "call_abc",
                    "outcome": "done",
                    "content": [{"type": "text", "text": "5"}],
                },
            ),
        ),
    ]
    server.reply(answer())
    ask(model, history, tools=[ADD_SCHEMA])
    assert server.bodies[1]["input"] == [
        {"role": "user", "content": "What is 2 + 3?"},
        REASONING,
        {
            "type": "function_call",
            "call_id": "call_abc",
            "name": "add",
            "arguments": '{"a": 2, "b": 3}',
            "id": "fc_67ca09c6bedc8190a7abfec07b1a1332",
            "status": "completed",
        },
        {"type": "function_call_output", "call_id": "call_abc", "output": "5"},
    ]


def test_an_assistant_text_goes_back_as_its_message_item(
    server: ProviderServer, model: OpenAIResponsesModel
) -> None:
    server.reply(answer("Hello", " there."))
    said = ask(model)
    server.reply(answer())
    ask(model, [Message.user("hi"), Message.assistant(said.content), Message.user("and?")])
    assert server.bodies[1]["input"][1:] == [
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Hello there.", "annotations": []}],
            "id": "msg_2",
            "status": "completed",
        },
        {"role": "user", "content": "and?"},
    ]
    # a plain assistant message (another provider's reply, or a scripted one) has no item id
    server.reply(answer())
    ask(model, [Message.user("hi"), Message.assistant("Hi."), Message.user("and?")])
    assert server.bodies[2]["input"][1] == {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "Hi.", "annotations": []}],
    }


# --------------------------------------------------------------------------------------------------
# The reply


def test_text_deltas_stream_and_usage_counts_cached_tokens_once(
    server: ProviderServer, model: OpenAIResponsesModel
) -> None:
    server.reply(
        sse(
            responses_stream(
                r_message("msg_1", "The ", "answer ", "is 5."),
                input_tokens=2000,
                output_tokens=100,
                cached_tokens=1500,
                reasoning_tokens=64,
            )
        )
    )
    texts: list[str] = []
    reply = ask(model, texts=texts)
    assert texts == ["The ", "answer ", "is 5."]
    assert reply == ModelReply(
        [
            {"type": "provider", "provider": "openai-responses", "item": {"type": "message", "id": "msg_1"}},
            {"type": "text", "text": "The answer is 5."},
        ],
        "stop",
        # input_tokens 2000 includes the 1500 cached: 500 are uncached; the 64 reasoning tokens are output
        {"input_tokens": 500, "output_tokens": 100, "cache_read_input_tokens": 1500},
        "gpt-x-2025-01-01",
    )


def test_reasoning_and_function_calls_are_kept_in_order(
    server: ProviderServer, model: OpenAIResponsesModel
) -> None:
    server.reply(tool_turn())
    reply = ask(model, tools=[ADD_SCHEMA])
    assert reply.content == [
        {"type": "provider", "provider": "openai-responses", "item": REASONING},
        {
            "type": "provider",
            "provider": "openai-responses",
            "item": {
                "type": "function_call",
                "id": "fc_67ca09c6bedc8190a7abfec07b1a1332",
                "call_id": "call_abc",
            },
        },
        {"type": "tool_call", "name": "add", "args": {"a": 2, "b": 3}, "provider_call_id": "call_abc"},
    ]
    assert reply.stop_reason == "tool_calls"
    assert reply.usage == {"input_tokens": 320, "output_tokens": 48, "cache_read_input_tokens": 0}


def test_streamed_and_whole_replies_are_equal(server: ProviderServer) -> None:
    items = (
        r_reasoning("rs_1", ["Think."], SECRET),
        r_message("msg_1", "Let ", "me."),
        r_call("fc_1", "call_1", "add", '{"a": 1, "b": 2}'),
    )
    server.reply(
        sse(responses_stream(*items, cached_tokens=64)), json_reply(responses_body(*items, cached_tokens=64))
    )
    url = server.url + "/v1"
    streamed_texts: list[str] = []
    whole_texts: list[str] = []
    streamed = ask(OpenAIResponsesModel("o4-mini", base_url=url, api_key="k"), texts=streamed_texts)
    whole = ask(OpenAIResponsesModel("o4-mini", base_url=url, api_key="k", stream=False), texts=whole_texts)
    assert streamed == whole
    assert "".join(streamed_texts) == "".join(whole_texts) == "Let me."
    assert not server.bodies[1].get("stream")


def test_an_incomplete_response_says_why(server: ProviderServer, model: OpenAIResponsesModel) -> None:
    server.reply(
        sse(
            responses_stream(
                r_message("msg_1", "Partial"), status="incomplete", incomplete="max_output_tokens"
            )
        )
    )
    reply = ask(model)
    assert reply.stop_reason == "max_output_tokens"
    assert reply.content[-1] == {"type": "text", "text": "Partial"}


def test_missing_and_repeated_call_ids_are_made_up(
    server: ProviderServer, model: OpenAIResponsesModel
) -> None:
    server.reply(
        sse(responses_stream(r_call("fc_1", "call_0", "add", "{}"), r_call("fc_2", "call_0", "add", "")))
    )
    reply = ask(model, index=3)
    calls = [block for block in reply.content if block["type"] == "tool_call"]
    assert [(c["provider_call_id"], c["args"]) for c in calls] == [("call_0", {}), ("call_3_1", {})]


# --------------------------------------------------------------------------------------------------
# Errors


def test_an_error_event_and_a_failed_response_are_mapped(
    server: ProviderServer, model: OpenAIResponsesModel
) -> None:
    server.reply(
        sse(
            [
                (
                    "error",
                    {"type": "error", "code": "rate_limit_exceeded", "message": "Slow down", "param": None},
                )
            ]
        ),
        sse(
            [
                (
                    "response.failed",
                    {
                        "type": "response.failed",
                        "response": {
                            **responses_body(usage=False),
                            "status": "failed",
                            "error": {"code": "server_error", "message": "The server had an error"},
                        },
                    },
                )
            ]
        ),
    )
    limited = fails(model)
    assert isinstance(limited, RateLimitError) and limited.retryable
    failed = fails(model)
    assert isinstance(failed, ServerError) and failed.retryable
    assert "The server had an error" in str(failed)


@pytest.mark.parametrize(
    ("reply", "error", "retryable"),
    [
        (
            openai_error(
                429,
                "You exceeded your current quota, please check your plan and billing details.",
                "insufficient_quota",
                "insufficient_quota",
            ),
            QuotaExceededError,
            False,
        ),
        (
            openai_error(
                400,
                "Your input exceeds the context window of this model.",
                "invalid_request_error",
                "context_length_exceeded",
            ),
            ContextTooLongError,
            False,
        ),
        (openai_error(500, "The server had an error", "server_error"), ServerError, True),
    ],
)
def test_http_errors_map_to_tethers_own(
    server: ProviderServer, model: OpenAIResponsesModel, reply: Any, error: type[Exception], retryable: bool
) -> None:
    server.reply(reply)
    exc = fails(model)
    assert type(exc) is error and exc.retryable is retryable  # type: ignore[attr-defined]
    assert isinstance(exc.__cause__, openai.APIStatusError)
    assert len(server.requests) == 1


def test_a_cut_stream_and_a_stream_without_its_end_are_retryable(
    server: ProviderServer, model: OpenAIResponsesModel
) -> None:
    server.reply(sse(responses_stream(r_message("msg_1", "Hel", "lo")), cut_after=5))
    cut = fails(model)
    assert isinstance(cut, ConnectionFailed) and cut.retryable
    server.reply(sse(responses_stream(r_message("msg_1", "Hel", "lo"), terminal=False)))
    ended = fails(model)
    assert isinstance(ended, ConnectionFailed) and ended.retryable
    assert "response.completed" in str(ended)


# --------------------------------------------------------------------------------------------------
# Model strings


def test_the_model_string(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "from-env")
    made = resolve_model("openai-responses:o4-mini")
    assert isinstance(made, OpenAIResponsesModel) and made.name == "o4-mini" and made.encrypted_reasoning
    assert made._api_key == "from-env"


# --------------------------------------------------------------------------------------------------
# End to end


def test_agent_completes_a_tool_turn_and_journals_the_reasoning(
    server: ProviderServer, model: OpenAIResponsesModel, tmp_path: Path
) -> None:
    server.reply(tool_turn(), answer("It is ", "5."))
    store = FileStore(tmp_path / "runs")
    state = calc_agent(model, store, tmp_path / "side").run("What is 2 + 3?", id="r1")
    assert state.status == "completed" and state.answer == "It is 5."
    assert len(ExecutionLog(tmp_path / "side").records()) == 1
    replied = next(e for e in store.load("r1").history if e.kind == "model_replied")
    assert replied.content[0] == {"type": "provider", "provider": "openai-responses", "item": REASONING}
    second = server.bodies[1]["input"]
    assert [item.get("type", item.get("role")) for item in second] == [
        "user",
        "reasoning",
        "function_call",
        "function_call_output",
    ]
    assert second[1] == REASONING and second[3] == {
        "type": "function_call_output",
        "call_id": "call_abc",
        "output": "5",
    }


def test_crash_and_resume_sends_the_journaled_reasoning_back(server: ProviderServer, tmp_path: Path) -> None:
    server.reply(tool_turn())
    tests = Path(__file__).parent
    env = {**os.environ, "TETHER_FAILPOINT": "after_append:tool_finished", "PYTHONPATH": str(tests)}
    side = tmp_path / "side"
    argv = ["openai-responses", server.url, str(tmp_path / "runs"), "r1", str(side)]
    proc = subprocess.run(
        [sys.executable, str(tests / "_provider_server.py"), *argv],
        env=env,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == -9, proc.stderr.decode()
    server.reply(answer("5."))
    model = OpenAIResponsesModel("o4-mini", base_url=server.url + "/v1", api_key="k")
    state = calc_agent(model, FileStore(tmp_path / "runs"), side).resume("r1")
    assert state.status == "completed" and state.answer == "5."
    assert len(ExecutionLog(side).records()) == 1
    resumed = server.bodies[1]["input"]
    assert resumed[1] == REASONING  # from the journal: the killed process's reply, encrypted_content and all
    assert resumed[2]["id"] == "fc_67ca09c6bedc8190a7abfec07b1a1332" and resumed[2]["call_id"] == "call_abc"
    assert resumed[3] == {"type": "function_call_output", "call_id": "call_abc", "output": "5"}
