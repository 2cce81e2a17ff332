"""Tests for the turn loop's scheduling (issue 20): a model request awaited in the drive's own task while
the inbox is watched for a cancel, and results journaled without a task of their own. What a turn costs in
loop iterations, tasks and timers is measured by bench/turn_anatomy.py."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from tether import Agent, MemoryStore, State, tool
from tether.testing import ScriptedModel, call


def kinds(state: State) -> list[str]:
    return [e.kind for e in state.history]


def test_each_model_request_is_awaited_in_the_drives_own_task(store: Any) -> None:
    tasks: list[asyncio.Task[Any] | None] = []

    def seen(answer: Any) -> Any:
        async def reply(request: Any) -> Any:
            tasks.append(asyncio.current_task())
            await asyncio.sleep(0)  # a request that waits too
            return answer

        return reply

    @tool(effect="read_only")
    def look() -> str:
        """Look."""
        return "seen"

    async def drive() -> tuple[State, asyncio.Task[Any] | None]:
        model = ScriptedModel([seen(call("look")), seen("done")])
        state = await Agent(model, tools=[look], store=store).arun("go")
        return state, asyncio.current_task()

    state, driving = asyncio.run(drive())
    assert state.status == "completed"
    assert tasks == [driving, driving]


def test_a_request_that_swallows_the_cancel_and_answers_is_abandoned_all_the_same(store: Any) -> None:
    async def stubborn(request: Any) -> str:
        assert store.cancel(request.run_id, by="ops") is None, "the run is held: the cancel is posted"
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            pass  # a model that ignores cancellation and answers anyway
        return "answered anyway"

    state = Agent(ScriptedModel([stubborn]), store=store, poll_interval=0.01).run("hi")
    assert state.status == "cancelled"
    assert kinds(state)[-2:] == ["cancel_requested", "run_stopped"]
    assert "model_replied" not in kinds(state)


def test_a_request_that_turns_the_cancel_into_an_error_is_abandoned_without_model_failed(store: Any) -> None:
    async def converting(request: Any) -> str:
        store.cancel(request.run_id, by="ops")
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            raise RuntimeError("the SDK wrapped the cancel") from None
        return "never"

    state = Agent(ScriptedModel([converting]), store=store, poll_interval=0.01).run("hi")
    assert state.status == "cancelled"
    assert "model_failed" not in kinds(state) and "model_replied" not in kinds(state)


class _FailingInbox(MemoryStore):
    """A MemoryStore whose inbox cannot be read once ``broken`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.broken = threading.Event()

    def inbox_length(self, run_id: str) -> int:
        if self.broken.is_set():
            raise OSError("the inbox cannot be read")
        return super().inbox_length(run_id)


def test_an_inbox_that_cannot_be_read_during_a_request_raises_and_journals_no_model_failure() -> None:
    store = _FailingInbox()
    abandoned = threading.Event()

    async def slow(request: Any) -> str:
        store.broken.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            abandoned.set()
            raise
        return "too late"

    with pytest.raises(OSError, match="the inbox cannot be read"):
        Agent(ScriptedModel([slow]), store=store, poll_interval=0.01).run("hi", id="broken-inbox")
    assert abandoned.is_set()
    store.broken.clear()
    assert "model_failed" not in kinds(store.load("broken-inbox"))


def test_an_interrupt_during_a_watched_request_releases_the_run_and_writes_nothing_for_it(store: Any) -> None:
    waiting = asyncio.Event()

    async def slow(request: Any) -> str:
        waiting.set()
        await asyncio.sleep(30)
        return "too late"

    async def drive() -> None:
        agent = Agent(ScriptedModel([slow]), store=store, poll_interval=0.01)
        task = asyncio.ensure_future(agent.arun("hi", id="interrupted"))
        await waiting.wait()
        await asyncio.sleep(0.05)  # a few polls of the inbox go by
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(drive())
    state = store.load("interrupted")
    assert kinds(state)[-1] == "run_released"
    assert "model_replied" not in kinds(state) and "model_failed" not in kinds(state)


@pytest.mark.parametrize("what", ["turns it into an error", "swallows it"])
def test_an_interrupt_during_a_request_that_mishandles_cancellation_still_writes_nothing_for_it(
    store: Any, what: str
) -> None:
    waiting = asyncio.Event()

    async def sloppy(request: Any) -> str:
        waiting.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            if what == "swallows it":
                return "answered anyway"
            raise RuntimeError("the SDK wrapped the cancel") from None
        return "never"

    async def drive() -> None:
        agent = Agent(ScriptedModel([sloppy]), store=store, poll_interval=0.01)
        task = asyncio.ensure_future(agent.arun("hi", id="sloppy"))
        await waiting.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(drive())
    state = store.load("sloppy")
    assert kinds(state)[-1] == "run_released"
    assert "model_replied" not in kinds(state) and "model_failed" not in kinds(state)


def test_results_that_finish_together_are_journaled_and_each_call_runs_once(store: Any) -> None:
    ran: list[int] = []

    @tool(effect="read_only")
    def look(i: int) -> str:
        """Look.

        Args:
            i: The number.
        """
        ran.append(i)
        return f"result {i}"

    replies: list[Any] = [[call("look", i=0), call("look", i=1)], *[call("look", i=i) for i in range(2, 30)]]
    state = Agent(ScriptedModel([*replies, "done"]), tools=[look], store=store).run("go")
    assert state.status == "completed"
    assert sorted(ran) == list(range(30))
    finished = [e for e in state.history if e.kind == "tool_finished"]
    assert len(finished) == 30 and all(e.outcome == "done" for e in finished)


class _Renewing:
    """Stands in for a store's ``renew``: counts calls per run, fails for the runs in ``failing``."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}
        self.failing: set[str] = set()
        self.lock = threading.Lock()

    def renew(self, lease: Any) -> Any:
        with self.lock:
            self.calls[lease.run_id] = self.calls.get(lease.run_id, 0) + 1
        if lease.run_id in self.failing:
            raise OSError("the database is down")
        return lease


def _until(check: Any) -> None:
    for _ in range(2000):
        if check():
            return
        threading.Event().wait(0.005)
    raise AssertionError("not within 10 s")


def test_the_leases_of_many_drives_are_renewed_from_one_timing_thread() -> None:
    from tether._run.renewal import Renewer
    from tether.stores.base import Lease, Owner

    store = _Renewing()
    lost: list[str] = []
    renewers = [
        Renewer(store, Lease(f"r{i}", 1, Owner.here(), None, 0.08), 0.08, lambda i=i: lost.append(f"r{i}"))  # type: ignore[arg-type]
        for i in range(50)
    ]
    for renewer in renewers:
        renewer.start()
    _until(lambda: len(store.calls) == 50 and min(store.calls.values()) >= 2)
    timers = [t for t in threading.enumerate() if t.name == "tether-renewals"]
    assert len(timers) == 1
    assert not [t for t in threading.enumerate() if t.name.startswith("tether-renew-")], "no thread per drive"
    for renewer in renewers:
        renewer.stop()
    assert lost == [] and all(renewer.fresh() for renewer in renewers)


def test_a_drive_whose_renewals_fail_for_ttl_over_2_is_told_once_and_others_go_on() -> None:
    from tether._run.renewal import Renewer
    from tether.stores.base import Lease, Owner

    store = _Renewing()
    store.failing.add("down")
    lost: list[str] = []
    down = Renewer(store, Lease("down", 1, Owner.here(), None, 0.08), 0.08, lambda: lost.append("down"))  # type: ignore[arg-type]
    fine = Renewer(store, Lease("fine", 1, Owner.here(), None, 0.08), 0.08, lambda: lost.append("fine"))  # type: ignore[arg-type]
    down.start()
    fine.start()
    _until(lambda: lost == ["down"])
    calls = store.calls["down"]
    _until(lambda: store.calls["fine"] >= calls + 3)
    assert lost == ["down"] and store.calls["down"] == calls, "a lost lease is renewed no more"
    assert not down.fresh() and fine.fresh()
    fine.stop()
