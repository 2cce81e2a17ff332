"""A real process that drives one run, for the crash tests.

    python tests/crash/_scenario.py start|resume|add_message STORE_DIR RUN_ID SIDE_FILE [SCENARIO]

``start`` creates the run (``agent.run(prompt, id=RUN_ID)``), ``resume`` continues it (``agent.resume``),
``add_message`` loads it, adds a message and saves it (a short-lived taker). The agent is the same in every
mode and scenario (same name, instructions and tools), so a resume never sees ``agent_changed``; the scenario
picks the model's script.

Tools record each execution in the side file (``ExecutionLog``: event, tool, run id, call id, attempt,
idempotency key, pid); "ran once" is judged there. When the process ends normally it writes
``SIDE_FILE.out.json``: status, answer, history length and every model request it made (index and messages).
Files next to the side file steer the tools: ``.release`` lets ``hold`` tools return, ``.model_marker``
records the model request that killed the process.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import orjson

from tether import Agent, FileStore, ModelRequest, ToolContext, handle_sigterm, tool
from tether.testing import ExecutionLog, ScriptedModel, call

INBOX_TOTAL = int(os.environ.get("TETHER_INBOX_TOTAL", "1600"))


class Scene:
    """Where this process writes: the side file and the files next to it."""

    def __init__(self, side: str) -> None:
        self.side = Path(side)
        self.log = ExecutionLog(self.side)
        self.release = Path(side + ".release")
        self.marker = Path(side + ".model_marker")
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

    def runs_of(self, call_id: str) -> int:
        return sum(1 for r in self.log.records() if r.get("event") == "start" and r.get("call_id") == call_id)

    def wait_release(self, limit: float = 30.0) -> bool:
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            if self.release.exists():
                return True
            time.sleep(0.01)
        return False


def seed_stop(signum: int, frame: object) -> None:
    """The seed document's SIGTERM recipe: turn the signal into SystemExit with the usual code."""
    raise SystemExit(128 + signum)


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def build_tools(scene: Scene, store_dir: str) -> list[Any]:
    @tool
    def add(a: int, b: int, ctx: ToolContext) -> int:
        """Add two numbers."""
        scene.record("start", ctx)
        return a + b

    @tool
    def charge(amount: int, ctx: ToolContext) -> str:
        """Charge a card (unsafe); the process dies inside the first execution."""
        scene.record("start", ctx)
        if scene.runs_of(ctx.call_id) == 1:
            die()
        return f"charged {amount}"

    @tool(effect="idempotent")
    def sync_db(ctx: ToolContext) -> str:
        """Sync (idempotent); the process dies inside the first attempt."""
        scene.record("start", ctx)
        if ctx.attempt == 1:
            die()
        return f"synced on attempt {ctx.attempt}"

    @tool(effect="idempotent", max_attempts=3)
    def always_dies(ctx: ToolContext) -> str:
        """Kills the process every time it runs."""
        scene.record("start", ctx)
        die()
        return "unreachable"

    @tool
    def fast(ctx: ToolContext) -> str:
        """Returns at once."""
        scene.record("start", ctx)
        return "fast done"

    @tool
    def slow(ctx: ToolContext) -> str:
        """Waits until the fast call's result is in the journal file, then kills the process."""
        scene.record("start", ctx)
        journal = Path(store_dir) / f"{ctx.run_id}.jsonl"
        fast_id = ctx.call_id.rsplit("_", 1)[0] + "_0"
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            for line in journal.read_bytes().split(b"\n")[:-1]:
                obj = orjson.loads(line)
                if obj.get("kind") == "tool_finished" and obj.get("call_id") == fast_id:
                    die()
            time.sleep(0.01)
        return "slow gave up waiting"

    @tool
    def hold(ctx: ToolContext) -> str:
        """Blocks until the release file exists (unsafe)."""
        scene.record("start", ctx)
        released = scene.wait_release()
        scene.record("end", ctx, released=released)
        return "held"

    @tool(effect="idempotent")
    def hold_idem(ctx: ToolContext) -> str:
        """Blocks until the release file exists (idempotent)."""
        scene.record("start", ctx)
        released = scene.wait_release()
        scene.record("end", ctx, released=released)
        return f"held on attempt {ctx.attempt}"

    @tool
    def nap(ctx: ToolContext) -> str:
        """A sync unsafe tool that finishes a second after it starts."""
        scene.record("start", ctx)
        time.sleep(1.0)
        scene.record("end", ctx)
        return "napped"

    @tool(effect="read_only")
    def wait_tool(ctx: ToolContext) -> str:
        """Takes a moment, so inbox items arrive while it runs."""
        scene.record("start", ctx)
        time.sleep(0.2)
        return "waited"

    return [add, charge, sync_db, always_dies, fast, slow, hold, hold_idem, nap, wait_tool]


def tool_texts(request: ModelRequest) -> str:
    """The results of the last tool message, as ``outcome:text`` joined by `` | ``."""
    for message in reversed(list(request.messages)):
        if message.role == "tool":
            parts = []
            for result in message.content:
                body = "".join(b.get("text", "") for b in result["content"] if b.get("type") == "text")
                parts.append(f"{result['outcome']}:{body}")
            return " | ".join(parts)
    return "no tool result"


def answer(request: ModelRequest) -> str:
    return "answer: " + tool_texts(request)


def script_for(scenario: str, scene: Scene) -> list[Any]:
    def model_killer(request: ModelRequest) -> Any:
        if not scene.marker.exists():
            scene.marker.write_bytes(orjson.dumps({"index": request.index, "pid": os.getpid()}))
            die()
        return answer(request)

    async def model_hang(request: ModelRequest) -> Any:
        if not scene.marker.exists():
            scene.marker.write_bytes(orjson.dumps({"index": request.index, "pid": os.getpid()}))
            await asyncio.sleep(30)
            return "the hung request answered"
        return answer(request)

    def until_all_in(request: ModelRequest) -> Any:
        items = sum(1 for m in request.messages if m.role == "user" and m.text.startswith("item "))
        return f"all {items} in" if items >= INBOX_TOTAL else call("wait_tool")

    scripts: dict[str, list[Any]] = {
        "basic": [call("add", a=2, b=3), answer],
        "unsafe_kill": [call("charge", amount=5), answer],
        "idem_once": [call("sync_db"), answer],
        "idem_always": [call("always_dies"), answer],
        "model_kill": [call("add", a=1, b=2), model_killer],
        "model_hang": [call("add", a=1, b=2), model_hang],
        "parallel": [[call("fast"), call("slow")], answer],
        "hold": [call("hold"), answer],
        "sigterm": [[call("hold"), call("hold_idem")], answer],
        "seed_sigterm": [[call("hold"), call("hold_idem")], answer],
        "sigint": [call("nap"), answer],
        "inbox": [until_all_in] * 5000,
        "chat": ["first answer", "second answer"],
    }
    return scripts[scenario]


def dump(scene: Scene, model: ScriptedModel, state: Any, **more: Any) -> None:
    requests = [
        {"index": r.index, "messages": [{"role": m.role, "content": list(m.content)} for m in r.messages]}
        for r in model.requests
    ]
    out = {
        "status": getattr(state, "status", None),
        "answer": getattr(state, "answer", None),
        "history_len": len(state.history) if state is not None else None,
        "requests": requests,
        "pid": os.getpid(),
        **more,
    }
    scene.out.write_bytes(orjson.dumps(out))


def main(argv: list[str]) -> int:
    mode, store_dir, run_id, side = argv[:4]
    scenario = argv[4] if len(argv) > 4 else "basic"
    scene = Scene(side)
    store = FileStore(store_dir)
    model = ScriptedModel(script_for(scenario, scene))
    agent = Agent(
        model,
        name="crash",
        instructions="crash tests",
        tools=build_tools(scene, store_dir),
        store=store,
        poll_interval=0.05,
        retry_delay=0.01,
    )
    if scenario in ("sigterm", "model_hang"):
        handle_sigterm()
    if scenario == "seed_sigterm":  # the seed's recipe, not handle_sigterm
        signal.signal(signal.SIGTERM, seed_stop)
    if mode == "add_message":
        state = store.load(run_id)
        state.add_message("one more thing")
        store.save(state)
        dump(scene, model, state)
        return 0
    try:
        state = agent.run("please work", id=run_id) if mode == "start" else agent.resume(run_id)
    except KeyboardInterrupt:
        # Ctrl+C: the drive closed its steps. Stay alive until the interrupted tool has finished, so a late
        # result had every chance to be written, then report.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not any(r.get("event") == "end" for r in scene.log.records()):
            time.sleep(0.01)
        time.sleep(0.3)
        dump(scene, model, None, interrupted=True)
        return 130
    except Exception as exc:
        dump(scene, model, None, error=type(exc).__name__, message=str(exc))
        return 3
    dump(scene, model, state)
    return 0


# --------------------------------------------------------------------------------------------------
# For multiprocessing (spawned posters)


def post_items(store_dir: str, run_id: str, poster: int, count: int, barrier: Any) -> None:
    """Post ``count`` messages to the run's inbox once every poster is ready."""
    store = FileStore(store_dir)
    barrier.wait(60)
    for i in range(count):
        store.post(
            run_id,
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "text", "text": f"item {poster}-{i}"}],
                "seen_seq": 0,
            },
        )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
