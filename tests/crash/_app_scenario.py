"""A real process for the application-integration crash tests (DESIGN 18).

    python tests/crash/_app_scenario.py MODE STORE_URL RUN_ID SIDE_FILE SCENARIO [ARG]

Modes: ``start`` (``agent.run(PROMPT, id=RUN_ID, deps=..., metadata=...)``), ``resume``
(``agent.resume(RUN_ID, deps=...)``), ``race`` (waits for ``SIDE_FILE.go``, then
``agent.run(PROMPT, id=RUN_ID, if_exists="resume", deps=...)``) and ``approve`` (loads the run, approves
its pending call as alice, with ARG as the edited arguments when given (a JSON object), and saves: a
short-lived taker without the agent). ``ARG`` is the deps token for the driving modes: tools record the token they see in
``ctx.deps``, so a test can tell which process's deps a call got, and grep the store for it.

Tools and approval conditions record each execution and each evaluation in the side file
(``ExecutionLog``). When the process ends normally it writes ``SIDE_FILE.<pid>.out.json``: status, answer,
the requests its model got and the type of ``state.output``.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from tether import Agent, ModelRequest, ToolContext, open_store
from tether.testing import ExecutionLog, ScriptedModel, call

PROMPT = "refund order o1"


@dataclass
class Deps:
    """What a web app would hand its tools: here only a token naming the process that gave it."""

    token: str


def build_agent(store_url: str, side: str, scenario: str) -> Agent[Deps]:
    log = ExecutionLog(Path(side))

    def over_100(args: dict[str, Any]) -> bool:
        log.record(event="condition", amount=args["amount"], currency=args["currency"])
        return bool(args["amount"] > 100)

    agent: Agent[Deps] = Agent(
        ScriptedModel(_script(scenario)),
        name="app",
        instructions="app crash tests",
        store=open_store(store_url),
        poll_interval=0.05,
        retry_delay=0.01,
        deps_type=Deps,
    )

    @agent.tool(effect="idempotent", approval=over_100)
    def refund(amount: int, ctx: ToolContext[Deps], currency: str = "EUR") -> str:
        """Refund an amount to the customer."""
        log.record(event="start", tool="refund", call_id=ctx.call_id, amount=amount, token=ctx.deps.token,
                   attempt=ctx.attempt, user=ctx.metadata.get("user"))  # fmt: skip
        return f"refunded {amount} {currency}"

    @agent.tool(effect="read_only")
    def lookup(order: str, ctx: ToolContext[Deps]) -> str:
        """Look an order up."""
        log.record(event="start", tool="lookup", call_id=ctx.call_id, order=order, token=ctx.deps.token,
                   user=ctx.metadata.get("user"))  # fmt: skip
        if scenario == "race":
            time.sleep(0.5)  # the other process tries to start the run meanwhile
        return f"order {order} is paid"

    return agent


def _answer(request: ModelRequest) -> str:
    """The texts of the last tool message, so a test sees what the model saw."""
    for message in reversed(list(request.messages)):
        if message.role == "tool":
            return " | ".join(
                f"{r['outcome']}:"
                + "".join(b.get("text", "") for b in r["content"] if b.get("type") == "text")
                for r in message.content
            )
    return "no tool result"


def _script(scenario: str) -> list[Any]:
    return {
        "deps": [call("lookup", order="o1"), call("lookup", order="o2"), _answer],
        "conditions": [[call("refund", amount=50), call("refund", amount=500)], _answer],
        "edit": [call("refund", amount=500), _answer],
        "race": [call("lookup", order="o1"), _answer],
    }[scenario]


def main(argv: list[str]) -> int:
    mode, url, run_id, side, scenario = argv[:5]
    arg = argv[5] if len(argv) > 5 else ""
    agent = build_agent(url, side, scenario)
    assert agent.store is not None
    if mode == "approve":
        state = agent.store.load(run_id)
        (pending,) = state.pending_approvals
        edited = orjson.loads(arg) if arg else None
        state.approve(pending.call_id, by="alice", reason="the customer paid 90", args=edited)
        agent.store.save(state)
        return 0
    deps = Deps(arg)
    if mode == "start":
        state = agent.run(PROMPT, id=run_id, deps=deps, metadata={"user": "u42"})
    elif mode == "race":
        go = Path(side + ".go")
        while not go.exists():
            time.sleep(0.005)
        state = agent.run(PROMPT, id=run_id, deps=deps, metadata={"user": "u42"}, if_exists="resume")
    else:
        state = agent.resume(run_id, deps=deps)
    model = agent.model
    assert isinstance(model, ScriptedModel)
    report = {
        "id": state.id,
        "status": state.status,
        "answer": state.answer,
        "requests": [r.index for r in model.requests],
        "pending": [p.call_id for p in state.pending_approvals],
    }
    Path(f"{side}.{os.getpid()}.out.json").write_bytes(orjson.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
