"""Agents for the reliability suite (``test_harness_scenarios.py``), each a factory ``crash_test`` imports.

Every child process of the harness builds its agent from one of these functions (same name, instructions
and tools in every process), so a resume never sees ``agent_changed``. The tools are quick; in the parallel
scenario their results finish a little apart, so each lands in an append of its own and every result is a
boundary of its own.
"""

from __future__ import annotations

import time
from typing import Any

from tether import Agent, ModelError, ModelRequest, ToolContext, tool
from tether._harness.crash.crash_test import record_execution
from tether.testing import ScriptedModel, call


@tool(effect="read_only")
def lookup(query: str) -> str:
    """Look something up (read only)."""
    return f"found {query}"


@tool(effect="idempotent")
def sync_db(table: str, ctx: ToolContext) -> str:
    """Sync a table (idempotent: the key makes a retry take effect once)."""
    time.sleep(0.05)
    return f"synced {table} with key {ctx.idempotency_key}"


@tool
def charge(amount: int) -> str:
    """Charge a card (unsafe)."""
    time.sleep(0.1)
    return f"charged {amount}"


@tool
def explode(reason: str) -> str:
    """A tool that always fails."""
    raise RuntimeError(f"exploded: {reason}")


@tool(approval=True)
def deploy(version: str) -> str:
    """Deploy a version (a person must approve)."""
    return f"deployed {version}"


@tool
async def add(a: int, b: int) -> int:
    """Add two numbers (an async tool)."""
    return a + b


TOOLS = [lookup, sync_db, charge, explode, deploy, add]


def results(request: ModelRequest) -> str:
    """The last tool message's results, as ``outcome:text`` joined by `` | ``."""
    for message in reversed(list(request.messages)):
        if message.role == "tool":
            parts = []
            for result in message.content:
                body = "".join(b.get("text", "") for b in result["content"] if b.get("type") == "text")
                parts.append(f"{result['outcome']}:{body}")
            return " | ".join(parts)
    return "no results"


def answer(request: ModelRequest) -> str:
    return "answer: " + results(request)


def _agent(name: str, script: list[Any]) -> Agent:
    return Agent(
        ScriptedModel(script),
        name=name,
        instructions=f"reliability suite: {name}",
        tools=TOOLS,
        poll_interval=0.05,
        retry_delay=0.01,
    )


def parallel() -> Agent:
    """One reply with three calls of different effects, then an answer."""
    return _agent(
        "parallel",
        [[call("lookup", query="weather"), call("sync_db", table="users"), call("charge", amount=5)], answer],
    )


def failing_tool() -> Agent:
    """A tool that raises: its result is an ``error`` the model sees; then an answer."""
    return _agent("failing", [call("explode", reason="boom"), answer])


def model_error() -> Agent:
    """A retryable model error once (``model_failed``, retried after 0.01 s), then a call and an answer."""
    return _agent(
        "model_error",
        [ModelError("overloaded", retryable=True), call("lookup", query="status"), answer],
    )


def approval() -> Agent:
    """A read-only call runs while a call that needs approval waits: the run ends ``waiting``."""
    return _agent("approval", [[call("lookup", query="release notes"), call("deploy", version="1.2")]])


def multi_turn() -> Agent:
    """Three turns of tools (async, unsafe, idempotent), then an answer."""
    return _agent(
        "multi_turn",
        [call("add", a=2, b=3), call("charge", amount=7), call("sync_db", table="orders"), answer],
    )


# --------------------------------------------------------------------------------------------------
# For the harness's own tests (tests/test_crashtest.py), not scenarios of the suite


def tiny() -> Agent:
    """One read-only call, then an answer: four boundaries."""
    return _agent("tiny", [call("lookup", query="x"), answer])


@tool
def pay_twice(amount: int, ctx: ToolContext) -> str:
    """An unsafe tool whose work (say, a job it hands over) reports two executions: a real double charge."""
    record_execution(ctx, "unsafe", amount=amount)
    record_execution(ctx, "unsafe", amount=amount)
    return f"paid {amount}"


def double_charge() -> Agent:
    """An agent whose tool takes effect twice per call: every case must report a violation."""
    return Agent(
        ScriptedModel([call("pay_twice", amount=3), answer]),
        name="double",
        tools=[pay_twice],
        poll_interval=0.05,
    )


NOT_AN_AGENT = 42


# --------------------------------------------------------------------------------------------------
# A subagent


def subagent() -> Agent:
    """The parent hands a task to a subagent (a run of its own) that charges a card, then answers."""
    researcher = Agent(
        ScriptedModel([[call("lookup", query="prices"), call("charge", amount=2)], answer]),
        name="researcher",
        description="Looks prices up and pays for them.",
        instructions="reliability suite: the subagent",
        tools=[lookup, charge],
        poll_interval=0.05,
    )
    return Agent(
        ScriptedModel([call("researcher", prompt="find and pay"), answer]),
        name="delegating",
        instructions="reliability suite: subagent",
        tools=[researcher],
        poll_interval=0.05,
        retry_delay=0.01,
    )


def double_charge_in_subagent() -> Agent:
    """For the harness's own tests: the double charge happens inside a subagent's run."""
    payer = Agent(
        ScriptedModel([call("pay_twice", amount=4), "paid"]),
        name="payer",
        description="Pays.",
        tools=[pay_twice],
        poll_interval=0.05,
    )
    return Agent(
        ScriptedModel([call("payer", prompt="pay 4"), answer]), name="boss", tools=[payer], poll_interval=0.05
    )
