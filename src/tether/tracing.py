"""OpenTelemetry tracing: one trace per run, across crashes and processes (DESIGN 15; extra ``otel``).

Turn it on for one agent with ``Agent(instrument=True)`` (the global tracer provider) or
``Agent(instrument=InstrumentSettings(...))``, or for every agent of the process with
``tether.instrument()``; an agent's own setting wins, and ``Agent(instrument=False)`` keeps an agent dark
whatever the process says. Without either, tether emits no spans, even when a tracer provider is set.

What a run looks like (names and attributes follow the OpenTelemetry GenAI semantic conventions, spelled
here as tether's own constants):

- ``invoke_agent {agent}`` for each drive of a run (each time a process takes the run and drives it to its
  next stop); the events on it are the journaled decisions (``tether.recovered``,
  ``tether.approval.requested``, ``tether.approval.decided``, ``tether.inbox.consumed``,
  ``tether.run.stopped``);
- ``chat {model}`` for each model request, under the drive's span;
- ``execute_tool {tool}`` for each attempt of a tool call, under the drive's span; a subagent's own
  ``invoke_agent`` span nests under the ``execute_tool`` span of its call.

``run_started`` records the run's W3C ``traceparent`` (the caller's active span when the run was created,
else the span of the run's first drive, a new root), and every later drive of the run, in any process,
starts its span in that trace; the resuming caller's own active span is attached as a link. Message
content, tool arguments and results are recorded only with ``include_content=True``.

This module imports no OpenTelemetry package: ``import tether`` stays cheap, and OpenTelemetry is
imported by the driver only once a drive is instrumented.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = [
    "InstrumentSettings",
    "instrument",
    "settings_for",
    "uninstrument",
]

# --------------------------------------------------------------------------------------------------
# Names (the contract, DESIGN 15): span names, attributes and events, defined once

INSTRUMENTATION_NAME = "tether"
"""The instrumentation scope of tether's tracer and meter."""

OP_INVOKE_AGENT = "invoke_agent"
OP_CHAT = "chat"
OP_EXECUTE_TOOL = "execute_tool"
"""``gen_ai.operation.name`` of the three spans; each span is named ``{operation} {agent, model or tool}``."""

# GenAI semantic conventions
GEN_AI_OPERATION_NAME = "gen_ai.operation.name"
GEN_AI_PROVIDER_NAME = "gen_ai.provider.name"
GEN_AI_AGENT_NAME = "gen_ai.agent.name"
GEN_AI_AGENT_DESCRIPTION = "gen_ai.agent.description"
GEN_AI_CONVERSATION_ID = "gen_ai.conversation.id"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
GEN_AI_RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
GEN_AI_USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
GEN_AI_TOOL_NAME = "gen_ai.tool.name"
GEN_AI_TOOL_CALL_ID = "gen_ai.tool.call.id"
GEN_AI_TOOL_TYPE = "gen_ai.tool.type"
GEN_AI_TOOL_DESCRIPTION = "gen_ai.tool.description"
GEN_AI_TOKEN_TYPE = "gen_ai.token.type"
ERROR_TYPE = "error.type"
# content, recorded only with include_content=True
GEN_AI_SYSTEM_INSTRUCTIONS = "gen_ai.system_instructions"
GEN_AI_INPUT_MESSAGES = "gen_ai.input.messages"
GEN_AI_OUTPUT_MESSAGES = "gen_ai.output.messages"
GEN_AI_TOOL_CALL_ARGUMENTS = "gen_ai.tool.call.arguments"
GEN_AI_TOOL_CALL_RESULT = "gen_ai.tool.call.result"

# tether's own
TETHER_RUN_ID = "tether.run.id"
TETHER_RUN_PARENT_ID = "tether.run.parent_id"
TETHER_RUN_ROOT_ID = "tether.run.root_id"
TETHER_RUN_STATUS = "tether.run.status"
TETHER_RUN_REASON = "tether.run.reason"
TETHER_RUN_ANSWER = "tether.run.answer"  # content
TETHER_DRIVE_START_SEQ = "tether.drive.start_seq"
TETHER_REQUEST_INDEX = "tether.request.index"
TETHER_REQUEST_PURPOSE = "tether.request.purpose"
TETHER_REQUEST_RETRYABLE = "tether.request.retryable"
TETHER_REQUEST_CANCELLED = "tether.request.cancelled"
TETHER_TOOL_EFFECT = "tether.tool.effect"
TETHER_TOOL_ATTEMPT = "tether.tool.attempt"
TETHER_TOOL_MAX_ATTEMPTS = "tether.tool.max_attempts"
TETHER_TOOL_IDEMPOTENCY_KEY = "tether.tool.idempotency_key"
TETHER_TOOL_OUTCOME = "tether.tool.outcome"
TETHER_CALL_ID = "tether.call.id"
TETHER_TOOL_NAME = "tether.tool.name"
TETHER_RECOVERY_ACTION = "tether.recovery.action"
TETHER_RECOVERY_REASON = "tether.recovery.reason"
TETHER_APPROVAL_ROUND = "tether.approval.round"
TETHER_APPROVAL_APPROVED = "tether.approval.approved"
TETHER_APPROVAL_BY = "tether.approval.by"
TETHER_APPROVAL_REASON = "tether.approval.reason"  # content
TETHER_INBOX_SEQ = "tether.inbox.seq"
TETHER_INBOX_TYPE = "tether.inbox.type"
TETHER_ENTRY_SEQ = "tether.entry.seq"

# span events on the drive's span
EVENT_RECOVERED = "tether.recovered"
EVENT_APPROVAL_REQUESTED = "tether.approval.requested"
EVENT_APPROVAL_DECIDED = "tether.approval.decided"
EVENT_INBOX_CONSUMED = "tether.inbox.consumed"
EVENT_RUN_STOPPED = "tether.run.stopped"

RECOVERY_ACTIONS: tuple[str, ...] = ("run", "retry", "abort", "ask", "wait")
"""The values of ``tether.recovery.action``: what the taker does with an open call it found."""

ERROR_OUTCOMES = frozenset({"error", "input_error", "aborted"})
"""The ``tool_finished`` outcomes of a started call that set its ``execute_tool`` span's status to error."""

# GenAI client metrics (recorded with a meter provider; histograms)
METRIC_TOKEN_USAGE = "gen_ai.client.token.usage"
METRIC_OPERATION_DURATION = "gen_ai.client.operation.duration"


# --------------------------------------------------------------------------------------------------
# Settings


@dataclass(frozen=True, slots=True, eq=False)
class InstrumentSettings:
    """How an agent's runs are traced.

    Args:
        include_content: record message content, tool arguments and tool results in spans. Off by
            default: journals hold private data, and traces leave the machine.
        tracer_provider: the OpenTelemetry ``TracerProvider`` to use; None uses the global one
            (``opentelemetry.trace.set_tracer_provider``).
        meter_provider: the ``MeterProvider`` for the GenAI client metrics
            (``gen_ai.client.token.usage``, ``gen_ai.client.operation.duration``); None uses the global
            one, which records nothing until an SDK is set.
    """

    include_content: bool = False
    tracer_provider: Any = None
    meter_provider: Any = None


_PROCESS: InstrumentSettings | None = None


def instrument(
    tracer_provider: Any = None, include_content: bool = False, *, meter_provider: Any = None
) -> None:
    """Trace the runs of every agent in this process (an agent's own ``instrument=`` setting wins).

    Args:
        tracer_provider: the ``TracerProvider`` to use; None uses the global one.
        include_content: record message content, tool arguments and results (off by default).
        meter_provider: the ``MeterProvider`` for the GenAI metrics; None uses the global one.

    Raises:
        ImportError: the ``otel`` extra is not installed.
    """
    _require_api()
    global _PROCESS
    _PROCESS = InstrumentSettings(
        include_content=include_content, tracer_provider=tracer_provider, meter_provider=meter_provider
    )


def uninstrument() -> None:
    """Undo ``instrument()``: agents without a setting of their own emit no spans again."""
    global _PROCESS
    _PROCESS = None


def settings_for(
    own: bool | InstrumentSettings | None, inherited: InstrumentSettings | None = None
) -> InstrumentSettings | None:
    """The settings a drive traces with, or None when it is not traced.

    Args:
        own: the agent's ``instrument=`` setting: True (defaults), settings, False (never), None (not set).
        inherited: the settings of the parent run's drive, for a subagent without a setting of its own.
    """
    if own is None:
        return inherited if inherited is not None else _PROCESS
    if own is True:
        return _DEFAULT
    if own is False:
        return None
    return own


_DEFAULT = InstrumentSettings()


def check_setting(value: object) -> bool | InstrumentSettings | None:
    """Validate an ``Agent(instrument=...)`` value.

    Raises:
        TypeError: neither a bool, None nor InstrumentSettings.
        ImportError: tracing is asked for and the ``otel`` extra is not installed.
    """
    if value is None or value is False:
        return value
    if value is True or isinstance(value, InstrumentSettings):
        _require_api()
        return value
    raise TypeError(
        f"instrument={value!r} is not a setting. Fix: pass True, False, or "
        "tether.tracing.InstrumentSettings(include_content=..., tracer_provider=...)"
    )


def _require_api() -> None:
    import importlib.util

    if (
        importlib.util.find_spec("opentelemetry") is None
        or importlib.util.find_spec("opentelemetry.trace") is None
    ):
        raise ImportError(
            "tracing needs the OpenTelemetry API, which is not installed. Fix: pip install 'tether[otel]'"
        )
