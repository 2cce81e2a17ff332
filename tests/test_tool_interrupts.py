"""A tool that raises ``SystemExit`` or ``KeyboardInterrupt`` interrupts its run as Ctrl+C does (DESIGN 5.4).

The run is closed (the unsafe call in flight ``aborted``, the idempotent one left open, ``run_released``),
the lease released, the exception raised to the caller, and the thread's runner works for the next run.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from tether import Agent, FileStore, tool
from tether.testing import ScriptedModel, call


def _agent(store: FileStore, raised: BaseException, is_async: bool) -> Agent:
    running = threading.Event()

    def boom_sync() -> str:
        """Stop the program (unsafe)."""
        assert running.wait(10)  # the other call is in flight too
        raise raised

    async def boom_async() -> str:
        """Stop the program (unsafe)."""
        assert running.wait(10)
        raise raised

    boom = tool(name="boom")(boom_async if is_async else boom_sync)

    @tool(effect="idempotent")
    def other() -> str:
        """Run beside it until told to stop."""
        running.set()
        return "other done"

    model = ScriptedModel([[call("boom"), call("other")], "Done."])
    return Agent(model, name="a", tools=[boom, other], store=store, poll_interval=0.05)


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("raised", [SystemExit(3), KeyboardInterrupt()], ids=["SystemExit", "Ctrl+C"])
def test_a_tool_raising_systemexit_or_keyboardinterrupt_closes_the_run_as_ctrl_c_does(
    tmp_path: Path, raised: BaseException, is_async: bool
) -> None:
    store = FileStore(tmp_path / "runs")
    agent = _agent(store, raised, is_async)
    with pytest.raises(type(raised)):
        agent.run("go", id="r1")
    state = store.load("r1")
    assert state.history[-1].kind == "run_released"
    outcomes = {e.call_id: e.outcome for e in state.history if e.kind == "tool_finished"}
    boom_id = next(e.call_id for e in state.history if e.kind == "tool_started" and e.tool == "boom")
    assert outcomes.get(boom_id) == "aborted"  # the unsafe call in flight: may or may not have run
    assert store.holder("r1") is None
    resumed = agent.resume("r1")  # same process, same thread: not busy
    assert resumed.status == "completed" and resumed.answer == "Done."
    again = Agent(ScriptedModel(["Fine."]), name="a", store=store).run("next", id="r2")
    assert again.status == "completed"  # the thread's runner does not raise the old exception
