"""A real process that drives a parent run with a subagent, for the subagent crash tests.

    python tests/crash/_subagent_scenario.py start|resume|approve|resume_child STORE_DIR RUN_ID SIDE [SCENARIO]

``start`` creates the parent run (``boss.run(prompt, id=RUN_ID)``), ``resume`` continues it
(``boss.resume``), ``approve`` loads it, approves every pending call (with its ``run_id``) and saves it (a
short-lived taker that never drives), ``resume_child`` tries to resume the child run RUN_ID directly. The
agents are the same in every mode and scenario (same names, instructions and tools); the scenario picks the
models' scripts.

Child tools record each execution in the side file (``ExecutionLog``: event, tool, run id, call id, attempt,
idempotency key, pid); "ran once" is judged there. When the process ends normally it writes
``SIDE_FILE.out.json``: status, answer, pending approvals, and every request each model made.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import orjson

from tether import Agent, FileStore, ModelRequest, ToolContext, tool
from tether.testing import ExecutionLog, ScriptedModel, call


class Scene:
    def __init__(self, side: str) -> None:
        self.log = ExecutionLog(side)
        self.out = Path(side + ".out.json")

    def record(self, event: str, ctx: ToolContext, **more: Any) -> None:
        self.log.record(
            event=event,
            tool=ctx.tool,
            run_id=ctx.run_id,
            call_id=ctx.call_id,
            attempt=ctx.attempt,
            key=ctx.idempotency_key,
            **more,
        )


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def child_tools(scene: Scene) -> list[Any]:
    @tool
    def step(n: int, ctx: ToolContext) -> str:
        """Do one step of the work (unsafe).

        Args:
            n: The step number.
        """
        scene.record("start", ctx)
        return f"step {n} done"

    @tool(effect="idempotent")
    def boom(ctx: ToolContext) -> str:
        """Idempotent work; the process dies inside the first attempt."""
        scene.record("start", ctx)
        if ctx.attempt == 1:
            die()
        return f"boom survived on attempt {ctx.attempt}"

    @tool(approval=True)
    def send(to: str, ctx: ToolContext) -> str:
        """Send a message (needs approval).

        Args:
            to: The recipient.
        """
        scene.record("start", ctx)
        return f"sent to {to}"

    return [step, boom, send]


def results(request: ModelRequest) -> str:
    """The last tool message of a request, as ``outcome:text`` joined by `` | ``."""
    for message in reversed(list(request.messages)):
        if message.role == "tool":
            return " | ".join(
                f"{r['outcome']}:" + "".join(b.get("text", "") for b in r["content"]) for r in message.content
            )
    return "no tool result"


def child_answer(request: ModelRequest) -> str:
    return "child: " + results(request)


def parent_answer(request: ModelRequest) -> str:
    return "parent: " + results(request)


SCRIPTS: dict[str, tuple[list[Any], list[Any]]] = {
    # (parent's replies, child's replies)
    "kill_in_child_tool": (
        [call("helper", prompt="do the work"), parent_answer],
        [call("step", n=1), call("boom"), child_answer],
    ),
    "child_approval": (
        [call("helper", prompt="tell ann"), parent_answer],
        [call("step", n=1), call("send", to="ann"), child_answer],
    ),
    "plain": (
        [call("helper", prompt="do the work"), parent_answer],
        [call("step", n=1), child_answer],
    ),
}


def requests_of(model: ScriptedModel) -> list[dict[str, Any]]:
    return [
        {"index": r.index, "run_id": r.run_id, "messages": [m.to_dict() for m in r.messages]}
        for r in model.requests
    ]


def main(argv: list[str]) -> int:
    mode, store_dir, run_id, side = argv[:4]
    scenario = argv[4] if len(argv) > 4 else "plain"
    scene = Scene(side)
    store = FileStore(store_dir)
    parent_script, child_script = SCRIPTS[scenario]
    child_model, parent_model = ScriptedModel(child_script), ScriptedModel(parent_script)
    child = Agent(
        child_model,
        name="helper",
        description="Does a part of the work.",
        instructions="subagent crash tests: child",
        tools=child_tools(scene),
        store=store,
        poll_interval=0.05,
        retry_delay=0.01,
    )
    parent = Agent(
        parent_model,
        name="boss",
        instructions="subagent crash tests: parent",
        tools=[child],
        store=store,
        poll_interval=0.05,
        retry_delay=0.01,
    )
    report: dict[str, Any] = {"pid": os.getpid()}
    try:
        if mode == "approve":
            state = store.load(run_id)
            pending = state.pending_approvals
            for p in pending:
                state.approve(p.call_id, run_id=p.run_id, by="alice", reason="ok")
            store.save(state)
            report["approved"] = [{"call_id": p.call_id, "run_id": p.run_id} for p in pending]
        elif mode == "start":
            state = parent.run("please work", id=run_id)
        elif mode == "resume":
            state = parent.resume(run_id)
        elif mode == "resume_child":
            state = child.resume(run_id)
        else:
            raise SystemExit(f"unknown mode {mode}")
    except Exception as exc:
        report.update(error=type(exc).__name__, message=str(exc))
        scene.out.write_bytes(orjson.dumps(report))
        return 3
    report.update(
        status=state.status,
        answer=state.answer,
        pending=[{"call_id": p.call_id, "run_id": p.run_id, "tool": p.tool} for p in state.pending_approvals],
        parent_requests=requests_of(parent_model),
        child_requests=requests_of(child_model),
    )
    scene.out.write_bytes(orjson.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
