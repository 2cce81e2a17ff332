"""The live event stream and ``store.follow`` (DESIGN 10, issue 5).

``agent.stream`` drives a run and yields an EntryEvent for each entry only after its append returned, text
deltas with (request, index), and a Reset before a request asked again. ``store.follow`` replays then tails
a run driven elsewhere (another task, thread or process) with neither gaps nor duplicates.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

from tether import (
    Agent,
    EntryEvent,
    FileStore,
    ModelError,
    ModelReply,
    ModelRequest,
    Reset,
    Store,
    TextDelta,
    ToolContext,
    tool,
)
from tether.events import Retrying
from tether.testing import ScriptedModel, call

SRC = str(Path(__file__).resolve().parent.parent / "src")


@tool(effect="read_only")
def ping(ctx: ToolContext) -> str:
    """Ping."""
    return "pong"


async def collect(agent: Agent, prompt: str, run_id: str, store: Store) -> list[Any]:
    """Every event of a stream; for each entry event, whether the store already held that entry."""
    events: list[Any] = []
    async for event in agent.stream(prompt, id=run_id):
        if isinstance(event, EntryEvent):
            stored = store.read(run_id, event.entry.seq - 1)  # at once: no await between yield and check
            durable = bool(stored) and stored[0].seq == event.entry.seq and stored[0].h == event.entry.h
            events.append((event, durable))
        else:
            events.append(event)
    return events


def entry_events(events: list[Any]) -> list[Any]:
    return [e[0].entry for e in events if isinstance(e, tuple)]


def test_entry_events_come_after_their_append_in_seq_order(store: Store) -> None:
    agent = Agent(
        ScriptedModel([call("ping"), [call("ping"), call("ping")], "done"]), tools=[ping], store=store
    )
    events = asyncio.run(collect(agent, "go", "r", store))
    assert all(e[1] for e in events if isinstance(e, tuple)), "an entry was yielded before it was durable"
    entries = entry_events(events)
    journal = store.read("r")
    seqs = [e.seq for e in entries]
    assert seqs == list(range(seqs[0], len(journal))), "consecutive, no gaps or duplicates"
    assert [(e.seq, e.kind, e.h) for e in entries] == [(e.seq, e.kind, e.h) for e in journal[seqs[0] :]]
    assert entries[-1].kind == "run_stopped" and entries[-1].answer == "done"


def test_text_deltas_carry_request_and_delta_index_in_order(store: Store) -> None:
    thinking = ModelReply(
        [
            {"type": "text", "text": "let me check"},
            {"type": "tool_call", "name": "ping", "args": {}, "provider_id": "t1"},
        ],
        "tool_use",
        {"input_tokens": 10, "output_tokens": 5},
    )
    model = ScriptedModel([thinking, "hello world!"], stream_chunk=3)
    agent = Agent(model, tools=[ping], store=store)
    events = asyncio.run(collect(agent, "go", "r", store))
    deltas = [e for e in events if isinstance(e, TextDelta)]
    assert [(d.request, d.index, d.text) for d in deltas] == [
        (0, 0, "let"),
        (0, 1, " me"),
        (0, 2, " ch"),
        (0, 3, "eck"),
        (1, 0, "hel"),
        (1, 1, "lo "),
        (1, 2, "wor"),
        (1, 3, "ld!"),
    ]
    # each request's deltas come before its model_replied entry
    order = [
        ("delta", e.request) if isinstance(e, TextDelta) else (e[0].entry.kind, e[0].entry.seq)
        for e in events
        if isinstance(e, TextDelta | tuple)
    ]
    replies = [i for i, o in enumerate(order) if o[0] == "model_replied"]
    last_delta = {r: max(i for i, o in enumerate(order) if o == ("delta", r)) for r in (0, 1)}
    assert last_delta[0] < replies[0] < order.index(("delta", 1)) and last_delta[1] < replies[1]


def test_a_reset_comes_before_a_request_asked_again(store: Store) -> None:
    model = ScriptedModel([ModelError("overloaded", retryable=True), "hello world!"], stream_chunk=3)
    agent = Agent(model, store=store, retry_delay=0.01)
    events = asyncio.run(collect(agent, "go", "r", store))
    shown = [
        ("reset", e.request)
        if isinstance(e, Reset)
        else ("delta", e.request)
        if isinstance(e, TextDelta)
        else ("retrying", e.request, e.attempt, e.attempts, e.error_type, e.error)
        if isinstance(e, Retrying)
        else (e[0].entry.kind,)
        for e in events
    ]
    assert shown == [
        ("run_started",),
        ("message",),
        ("run_resumed",),
        ("model_failed",),
        ("retrying", 1, 2, 5, "ModelError", "overloaded"),  # said before the wait
        ("reset", 1),
        ("delta", 1),
        ("delta", 1),
        ("delta", 1),
        ("delta", 1),
        ("model_replied",),
        ("run_stopped",),
    ]


class StreamsThenFails:
    """Streams part of a reply, then fails with a retryable error; the second request answers."""

    name = "flaky"

    def __init__(self) -> None:
        self.requests: list[ModelRequest] = []

    async def request(self, request: ModelRequest, on_text: Any = None) -> ModelReply:
        self.requests.append(request)
        if len(self.requests) == 1:
            if on_text is not None:
                on_text("partial ")
                on_text("text")
            raise ModelError("stream cut", retryable=True)
        if on_text is not None:
            on_text("whole answer")
        return ModelReply([{"type": "text", "text": "whole answer"}], "end_turn", {"input_tokens": 1})


def test_deltas_of_a_failed_request_are_followed_by_a_reset(store: Store) -> None:
    agent = Agent(StreamsThenFails(), store=store, retry_delay=0.01)
    events = asyncio.run(collect(agent, "go", "r", store))
    visible = [e for e in events if isinstance(e, TextDelta | Reset)]
    assert [type(e).__name__ for e in visible] == ["TextDelta", "TextDelta", "Reset", "TextDelta"]
    failed, reset, again = visible[0], visible[2], visible[3]
    assert (failed.request, failed.index) == (0, 0) and visible[1].index == 1
    assert reset.request == again.request == 1 and again.index == 0 and again.text == "whole answer"
    assert store.load("r").answer == "whole answer"


# --------------------------------------------------------------------------------------------------
# A consumer that stops iterating


def _gated_agent(store: Store) -> tuple[Agent, threading.Event, list[int]]:
    gate = threading.Event()
    attempts: list[int] = []

    @tool(effect="read_only")
    def slow(ctx: ToolContext) -> str:
        """Waits for the gate."""
        attempts.append(ctx.attempt)
        gate.wait(20)
        return f"slow done on attempt {ctx.attempt}"

    agent = Agent(ScriptedModel([call("slow"), "finished"]), tools=[slow], store=store, poll_interval=0.02)
    return agent, gate, attempts


def test_a_consumer_that_stops_early_cancels_the_run_as_ctrl_c_does(store: Store) -> None:
    agent, gate, attempts = _gated_agent(store)

    async def consume() -> None:
        async with contextlib.aclosing(agent.stream("go", id="r")) as events:
            async for event in events:
                if isinstance(event, EntryEvent) and event.entry.kind == "tool_started":
                    break

    try:
        asyncio.run(consume())
        state = store.load("r")
        assert [e.kind for e in state.history][-1] == "run_released"
        assert "run_stopped" not in [e.kind for e in state.history]
        (open_call,) = state.open_calls
        assert open_call.action == "retry", "a read_only call cut off is left open for a resume"
        assert store.holder("r") is None
    finally:
        gate.set()
    done = agent.resume("r")
    assert done.status == "completed" and done.answer == "finished"
    assert attempts == [1, 2]


def test_a_consumer_that_breaks_without_closing_still_releases_the_run(store: Store) -> None:
    agent, gate, _ = _gated_agent(store)

    async def consume() -> None:
        async for event in agent.stream("go", id="r"):
            if isinstance(event, EntryEvent) and event.entry.kind == "tool_started":
                break
        # the generator is finalized by the loop; wait until the drive wrote its release
        for _ in range(1000):
            if store.read("r")[-1].kind == "run_released" and store.holder("r") is None:
                return
            await asyncio.sleep(0.01)

    try:
        asyncio.run(consume())
        assert store.read("r")[-1].kind == "run_released"
    finally:
        gate.set()
    assert agent.resume("r").status == "completed"


# --------------------------------------------------------------------------------------------------
# store.follow


async def follow_all(
    store: Store, run_id: str, after_seq: int = -1, seen: threading.Event | None = None
) -> list[Any]:
    out = []
    async for entry in store.follow(run_id, after_seq, poll_interval=0.01):
        out.append(entry)
        if seen is not None and entry.kind == "tool_started":
            seen.set()
    return out


def _follow_agent(store: Store, seen: threading.Event) -> Agent:
    @tool(effect="read_only")
    def wait_seen(ctx: ToolContext) -> str:
        """Returns once the follower saw this call start: the follower is tailing, not replaying."""
        seen.wait(20)
        return "seen"

    model = ScriptedModel([call("wait_seen"), [call("ping"), call("ping")], "all done"])
    return Agent(model, name="f", tools=[wait_seen, ping], store=store, poll_interval=0.02)


def _assert_whole(followed: list[Any], store: Store, run_id: str, first: int = 0) -> None:
    journal = store.read(run_id)
    assert [e.seq for e in followed] == list(range(first, len(journal))), "no gaps, no duplicates"
    assert [(e.kind, e.h) for e in followed] == [(e.kind, e.h) for e in journal[first:]]
    assert followed[-1].kind == "run_stopped"


def test_follow_tails_a_run_driven_in_another_thread(store: Store) -> None:
    seen = threading.Event()
    agent = _follow_agent(store, seen)
    agent.submit("go", id="r")
    result: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: result.setdefault("state", agent.resume("r")))

    async def main() -> list[Any]:
        follower = asyncio.ensure_future(follow_all(store, "r", -1, seen))
        await asyncio.sleep(0)
        thread.start()
        return await asyncio.wait_for(follower, 30)

    try:
        followed = asyncio.run(main())
    finally:
        seen.set()
        if thread.is_alive() or thread.ident is not None:
            thread.join(30)
    assert result["state"].status == "completed"
    _assert_whole(followed, store, "r")
    later = asyncio.run(asyncio.wait_for(follow_all(store, "r", 4), 30))
    _assert_whole(later, store, "r", first=5)


def test_follow_tails_a_run_driven_in_another_task(store: Store) -> None:
    seen = threading.Event()
    agent = _follow_agent(store, seen)
    agent.submit("go", id="r")

    async def main() -> tuple[list[Any], Any]:
        follower = asyncio.ensure_future(follow_all(store, "r", 1, seen))
        state = await agent.aresume("r")
        return await asyncio.wait_for(follower, 30), state

    try:
        followed, state = asyncio.run(main())
    finally:
        seen.set()
    assert state.status == "completed"
    _assert_whole(followed, store, "r", first=2)


def _stopped_run_with_an_entry_after_run_stopped(store: Store) -> None:
    agent = Agent(ScriptedModel(["done"]), store=store)
    agent.run("go", id="r")
    store.cancel("r", by="late")  # journaled inbox_skipped("run already completed") after run_stopped
    assert [e.kind for e in store.read("r")][-2:] == ["run_stopped", "inbox_skipped"]
    assert store.load("r").status == "completed"


async def follow_stopped(store: Store, run_id: str, after_seq: int = -1) -> list[Any]:
    """Follow a run that has stopped; fail (instead of hanging) when follow keeps polling with nothing new."""
    read = store.read
    empty = 0

    def counting_read(rid: str, after: int = -1) -> list[Any]:
        nonlocal empty
        got = read(rid, after)
        empty = 0 if got else empty + 1
        if empty > 20:
            raise AssertionError(f"follow read nothing new {empty} times and still did not end")
        return got

    store.read = counting_read  # type: ignore[method-assign]
    try:
        return [entry async for entry in store.follow(run_id, after_seq, poll_interval=0)]
    finally:
        del store.read


def test_follow_ends_for_a_stopped_run_whose_last_entry_is_not_run_stopped(store: Store) -> None:
    _stopped_run_with_an_entry_after_run_stopped(store)
    followed = asyncio.run(follow_stopped(store, "r"))
    assert [e.seq for e in followed] == list(range(len(store.read("r"))))


def test_follow_from_the_end_of_a_stopped_run_ends(store: Store) -> None:
    Agent(ScriptedModel(["done"]), store=store).run("go", id="r")
    last = len(store.read("r")) - 1
    assert asyncio.run(follow_stopped(store, "r", last)) == []


def test_follow_of_a_stopped_run_replays_and_ends(store: Store) -> None:
    Agent(ScriptedModel([call("ping"), "done"]), tools=[ping], store=store).run("go", id="r")
    _assert_whole(asyncio.run(follow_stopped(store, "r")), store, "r")
    _assert_whole(asyncio.run(follow_stopped(store, "r", 3)), store, "r", first=4)


# --------------------------------------------------------------------------------------------------
# A follower across a crash (real processes, FileStore)

DRIVER = textwrap.dedent(
    '''
    import sys
    from tether import Agent, FileStore, ToolContext, tool
    from tether.testing import ScriptedModel, call

    @tool(effect="read_only")
    def ping(ctx: ToolContext) -> str:
        """Ping."""
        return "pong"

    store = FileStore(sys.argv[1])
    agent = Agent(ScriptedModel([call("ping"), call("ping"), call("ping"), "done"]), name="f", tools=[ping],
                  store=store)
    if sys.argv[2] == "submit":
        agent.submit("go", id="r")
    else:
        agent.resume("r")
    '''
)


def _drive(runs: Path, mode: str, **env: str) -> subprocess.CompletedProcess[bytes]:
    import os

    full = {k: v for k, v in os.environ.items() if k != "TETHER_FAILPOINT"}
    full.update(PYTHONPATH=SRC, **env)
    return subprocess.run(
        [sys.executable, "-c", DRIVER, str(runs), mode],
        env=full,
        capture_output=True,
        timeout=60,
        check=False,
    )


def test_followers_before_and_after_a_crash_see_every_entry_once(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    assert _drive(runs, "submit").returncode == 0
    store = FileStore(runs)
    before: list[Any] = []
    done = threading.Event()

    def follower() -> None:
        async def main() -> None:
            async for entry in store.follow("r", -1, poll_interval=0.01):
                before.append(entry)
                if done.is_set() and entry.kind == "run_stopped":
                    return

        asyncio.run(asyncio.wait_for(main(), 60))

    thread = threading.Thread(target=follower)
    thread.start()
    try:
        crashed = _drive(runs, "resume", TETHER_FAILPOINT="after_append:tool_finished#2")
        assert crashed.returncode == -9, crashed.stderr.decode()[-3000:]
        assert [e.kind for e in store.read("r")][-1] == "tool_finished"
        after = asyncio.run(asyncio.wait_for(_replay_until(store, "tool_finished", 2), 30))
        resumed = _drive(runs, "resume")
        assert resumed.returncode == 0, resumed.stderr.decode()[-3000:]
    finally:
        done.set()
        thread.join(60)
    assert not thread.is_alive()
    _assert_whole(before, store, "r")
    journal = store.read("r")
    assert [e.kind for e in journal].count("run_resumed") == 2
    # a follower attached after the crash, from where it left off
    rest = asyncio.run(asyncio.wait_for(follow_all(store, "r", after[-1].seq), 30))
    _assert_whole(after + rest, store, "r")


async def _replay_until(store: Store, kind: str, count: int) -> list[Any]:
    out: list[Any] = []
    async for entry in store.follow("r", -1, poll_interval=0.01):
        out.append(entry)
        if [e.kind for e in out].count(kind) == count:
            return out
    return out
