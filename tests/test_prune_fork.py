"""Pruning and forking with real agent runs (DESIGN 8.2): what prune keeps, and forks that resume."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from tether import Agent, Owner, Store, open_store, tool
from tether import journal as j
from tether.testing import ExecutionLog, ScriptedModel, call

SOON = timedelta(seconds=-60)
"""A cutoff a minute from now: every run is "older" than it, so the other rules decide."""


@pytest.fixture(params=["sqlite", "file"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    url = f"sqlite:///{tmp_path / 'runs.db'}" if request.param == "sqlite" else f"file:{tmp_path / 'runs'}"
    made = open_store(url)
    yield made
    made.close()


def weather_agent(store: Store, log: ExecutionLog, replies: list[object] | None = None) -> Agent:
    @tool(effect="unsafe")
    def get_weather(city: str) -> str:
        """Get the weather.

        Args:
            city: The city.
        """
        log.record(tool="get_weather", city=city)
        return f"Sunny in {city}"

    script = replies or [call("get_weather", city="London"), "Sunny in London."]
    return Agent(ScriptedModel(script), name="weather", tools=[get_weather], store=store)


@tool(approval=True)
def send_email(to: str) -> str:
    """Send an email.

    Args:
        to: The address.
    """
    return "sent"


def test_prune_keeps_waiting_running_and_held_runs(store: Store, tmp_path: Path) -> None:
    log = ExecutionLog(tmp_path / "log")
    done = weather_agent(store, log).run("Weather?", id="done")
    assert done.status == "completed"
    mailer = Agent(ScriptedModel([call("send_email", to="bob@example.com"), "ok"]), name="mailer",
                   tools=[send_email], store=store)  # fmt: skip
    assert mailer.run("email bob", id="waiting").status == "waiting"
    weather_agent(store, log).submit("Weather tomorrow?", id="submitted")
    busy = weather_agent(store, log).run("Weather in Oslo?", id="busy")
    assert busy.status == "completed"
    lease = store.claim("busy", Owner.here())
    assert store.prune(SOON, dry_run=True) == ["done"]
    assert store.prune(SOON) == ["done"]
    assert {info.id for info in store.list()} == {"waiting", "submitted", "busy"}
    store.abandon(lease)
    assert store.prune(SOON) == ["busy"]
    assert store.prune(timedelta(days=1)) == []


def test_a_fork_at_a_tool_result_resumes_without_running_the_tool_again(store: Store, tmp_path: Path) -> None:
    log = ExecutionLog(tmp_path / "log")
    source = weather_agent(store, log).run("Weather in London?", id="src")
    assert source.status == "completed" and log.count(tool="get_weather") == 1
    kinds = [e.kind for e in source.history]
    finished = kinds.index("tool_finished")
    fork_id = store.fork("src", at_seq=finished, new_id="branch")
    forked = store.load(fork_id)
    started = forked.history[0]
    assert isinstance(started, j.RunStarted) and started.forked_from == {"id": "src", "seq": finished}
    assert [e.kind for e in forked.history] == kinds[: finished + 1]
    assert forked.status == "running" and store.holder(fork_id) is None
    resumed = weather_agent(store, log).resume(fork_id)  # asks the model again; the result is inherited
    assert resumed.status == "completed" and resumed.answer == "Sunny in London."
    assert log.count(tool="get_weather") == 1
    assert store.load("src").history == source.history  # the source is untouched


def test_a_fork_inside_a_call_is_rounded_down_and_runs_the_call_again(store: Store, tmp_path: Path) -> None:
    log = ExecutionLog(tmp_path / "log")
    weather_agent(store, log).run("Weather in London?", id="src")
    kinds = [e.kind for e in store.load("src").history]
    fork_id = store.fork("src", at_seq=kinds.index("tool_started"))
    forked = store.load(fork_id)
    assert [e.kind for e in forked.history] == ["run_started", "message"]
    assert weather_agent(store, log).resume(fork_id).status == "completed"
    assert log.count(tool="get_weather") == 2  # the fork asked again and ran its own call


def test_a_fork_of_a_completed_run_continues_the_conversation(store: Store, tmp_path: Path) -> None:
    log = ExecutionLog(tmp_path / "log")
    replies: list[object] = [call("get_weather", city="London"), "Sunny in London.", "Rain in Paris."]
    weather_agent(store, log, replies).run("Weather in London?", id="src")
    fork = store.load(store.fork("src"))
    assert fork.status == "completed"
    fork.add_message("And in Paris?")
    state = weather_agent(store, log, replies).run(fork)
    assert state.status == "completed" and state.answer == "Rain in Paris."
    assert store.load("src").answer == "Sunny in London."
