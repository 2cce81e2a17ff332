"""The ``tether`` command: demo, ls, show, cancel, and its one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tether import Agent, FileStore, Owner, open_store, tool
from tether import journal as j
from tether._timeline import format_args, format_time, next_step, summarize, timeline_lines, truncate
from tether.cli import DEFAULT_STORE, app
from tether.testing import ScriptedModel, call

runner = CliRunner()


@pytest.fixture(autouse=True)
def _no_env_store(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TETHER_STORE", raising=False)
    monkeypatch.delenv("TETHER_FAILPOINT", raising=False)


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"file:{tmp_path / 'runs'}"


@tool(effect="read_only")
def get_weather(city: str) -> str:
    """Get the current weather for a city.

    Args:
        city: The city to look up.
    """
    return f"Sunny, 22C in {city}"


def weather_agent(url: str) -> Agent:
    model = ScriptedModel([call("get_weather", city="London"), "It is sunny and 22C in London."])
    return Agent(model, name="weather", tools=[get_weather], store=open_store(url))


def completed_run(url: str, run_id: str) -> str:
    state = weather_agent(url).run("What is the weather in London?", id=run_id)
    assert state.status == "completed"
    return state.id


def crashed_run(url: str, run_id: str, tmp_path: Path, failpoint: str) -> None:
    """Start the demo's agent in a child process that the store kills at ``failpoint``."""
    env = {k: v for k, v in os.environ.items() if k != "TETHER_FAILPOINT"}
    env["TETHER_FAILPOINT"] = failpoint
    argv = [sys.executable, "-m", "tether._demo", "start", url, run_id, str(tmp_path / "side.log")]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == -9, done.stderr


def invoke(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    result = runner.invoke(app, list(args), env=env)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


def assert_clean_error(code: int, output: str) -> None:
    assert code == 2, output
    assert "Fix:" in output
    assert "Traceback" not in output
    assert len([line for line in output.splitlines() if line.strip()]) == 1, output


# --------------------------------------------------------------------------------------------------
# demo


def test_demo_kills_resumes_and_the_tool_ran_once() -> None:
    code, output = invoke("demo")
    assert code == 0, output
    assert "SIGKILL (returncode -9)" in output
    assert "ran 1 time" in output
    assert "completed" in output
    assert "running (no owner)" in output  # the journal as the killed process left it
    for kind in (
        "run_started",
        "model_replied",
        "tool_started",
        "tool_finished",
        "run_resumed",
        "run_stopped",
    ):
        assert kind in output
    assert "It is sunny and 22C in London." in output
    assert "Traceback" not in output


def test_demo_keeps_its_run_in_a_given_store(url: str) -> None:
    code, output = invoke("demo", "--store", url)
    assert code == 0, output
    [info] = open_store(url).list()
    assert info.status == "completed" and info.agent == "weather" and info.id.startswith("demo-")


def test_demo_fails_when_the_crash_does_not_happen(monkeypatch: pytest.MonkeyPatch) -> None:
    from tether import _demo

    monkeypatch.setattr(_demo, "FAILPOINT", "after_append:approval_requested")  # never fires here
    lines: list[tuple[str, str]] = []
    code = _demo.run_demo(None, lambda line, style="": lines.append((line, style)))
    assert code == 1
    assert ("   FAILED: the first child exited with code 0", "error") in lines


def test_demo_refuses_a_memory_store() -> None:
    assert_clean_error(*invoke("demo", "--store", "memory:"))


# --------------------------------------------------------------------------------------------------
# ls


def test_ls_shows_runs_in_a_table(url: str) -> None:
    completed_run(url, "first-run")
    completed_run(url, "second-run")
    code, output = invoke("ls", "--store", url)
    assert code == 0, output
    header, *rows = [line for line in output.splitlines() if line.strip()]
    assert header.split()[:4] == ["id", "agent", "status", "turn"]
    assert [row.split()[0] for row in rows] == ["second-run", "first-run"]
    assert all("weather" in row and "completed" in row and "What is the weather" in row for row in rows)


def test_ls_json_parses_and_filters(url: str) -> None:
    completed_run(url, "done-run")
    weather_agent(url).submit("and tomorrow?", id="idle-run")
    code, output = invoke("ls", "--store", url, "--json")
    assert code == 0, output
    runs = {run["id"]: run for run in json.loads(output)}
    assert set(runs) == {"done-run", "idle-run"}
    assert runs["done-run"]["status"] == "completed"
    assert runs["idle-run"]["display_status"] == "running (no owner)"
    code, output = invoke("ls", "--store", url, "--json", "--status", "completed", "--limit", "5")
    assert [run["id"] for run in json.loads(output)] == ["done-run"]


def test_ls_shows_unowned_running_runs(url: str) -> None:
    weather_agent(url).submit("What is the weather in Paris?", id="idle-run")
    code, output = invoke("ls", "--store", url)
    assert code == 0 and "running (no owner)" in output, output


def test_ls_reads_the_store_from_the_environment(url: str) -> None:
    completed_run(url, "env-run")
    code, output = invoke("ls", env={"TETHER_STORE": url})
    assert code == 0 and "env-run" in output, output


def test_ls_on_an_empty_store_says_so(url: str, tmp_path: Path) -> None:
    code, output = invoke("ls", "--store", url)
    assert code == 0 and "no runs" in output and "does not exist yet" in output, output
    assert not (tmp_path / "runs").exists()  # looking creates nothing
    assert invoke("ls", "--store", url, "--json") == (0, "[]\n")
    (tmp_path / "runs").mkdir()
    code, output = invoke("ls", "--store", url, "--status", "failed")
    assert code == 0 and "no failed runs" in output, output


def test_show_in_a_missing_store_folder_is_a_clean_error(url: str, tmp_path: Path) -> None:
    assert_clean_error(*invoke("show", "some-run", "--store", url))
    assert not (tmp_path / "runs").exists()
    (tmp_path / "file").write_text("")
    assert_clean_error(*invoke("ls", "--store", f"file:{tmp_path / 'file'}"))


def test_ls_refuses_an_unknown_status(url: str) -> None:
    assert_clean_error(*invoke("ls", "--store", url, "--status", "done"))


def test_default_store_is_one_constant() -> None:
    assert DEFAULT_STORE == "file:.tether/runs"


# --------------------------------------------------------------------------------------------------
# show


def test_show_prints_the_timeline(url: str) -> None:
    completed_run(url, "shown-run")
    code, output = invoke("show", "shown-run", "--store", url)
    assert code == 0, output
    for text in (
        "run_started",
        "message",
        "model_replied",
        "tool_started",
        "tool_finished",
        "run_stopped",
        'get_weather(city="London")',
        "Sunny, 22C in London",
        "completed",
        "It is sunny and 22C in London.",
    ):
        assert text in output
    seqs = [line.split()[0] for line in output.splitlines() if line.strip()[:1].isdigit()]
    assert seqs == [str(n) for n in range(len(seqs))] and len(seqs) >= 6


def test_show_a_crashed_run_names_the_open_call_and_its_action(url: str, tmp_path: Path) -> None:
    crashed_run(url, "crashed-run", tmp_path, "after_append:tool_started")
    code, output = invoke("show", "crashed-run", "--store", url)
    assert code == 0, output
    assert "running (no owner)" in output
    [call] = open_store(url).load("crashed-run").open_calls
    [open_line] = [line for line in output.splitlines() if line.strip().startswith(f"{call.call_id} ")]
    assert 'get_weather(city="London")' in open_line
    assert "abort" in open_line and "may or may not have run" in open_line  # get_weather is unsafe there
    assert f"a resume will: close {call.call_id} aborted, then ask the model" in output


@tool(approval=True)
def send_email(to: str) -> str:
    """Send an email.

    Args:
        to: The address.
    """
    return "sent"


def test_show_a_waiting_run_lists_pending_approvals(url: str) -> None:
    model = ScriptedModel([call("send_email", to="bob@example.com"), "done"])
    agent = Agent(model, name="mailer", tools=[send_email], store=open_store(url))
    assert agent.run("email bob", id="waiting-run").status == "waiting"
    code, output = invoke("show", "waiting-run", "--store", url)
    assert code == 0, output
    assert "approval_requested" in output and "status: waiting" in output
    pending = output[output.index("pending approvals:") :].splitlines()
    assert 'send_email(to="bob@example.com")' in pending[1] and "asked" in pending[1]
    assert "a resume will: nothing until the pending approvals are decided" in output


def test_show_json(url: str, tmp_path: Path) -> None:
    crashed_run(url, "crashed-run", tmp_path, "after_append:tool_started")
    code, output = invoke("show", "crashed-run", "--store", url, "--json")
    assert code == 0, output
    data = json.loads(output)
    assert data["status"] == "running" and data["display_status"] == "running (no owner)"
    assert [e["kind"] for e in data["entries"]][:2] == ["run_started", "message"]
    assert data["entries"][-1]["kind"] == "tool_started"
    [call] = data["open_calls"]
    assert call["tool"] == "get_weather" and call["action"] == "abort" and call["args"] == {"city": "London"}
    assert data["pending_approvals"] == []


def test_show_after_a_crash_past_the_tool_result(url: str, tmp_path: Path) -> None:
    crashed_run(url, "cut-run", tmp_path, "after_append:tool_finished")
    code, output = invoke("show", "cut-run", "--store", url)
    assert code == 0, output
    assert "open calls: none" in output
    assert "ask the model for its next reply" in output


def test_show_unknown_run_is_a_clean_error(url: str) -> None:
    completed_run(url, "some-run")
    assert_clean_error(*invoke("show", "no-such-run", "--store", url))


def test_show_invalid_run_id_is_a_clean_error(url: str) -> None:
    assert_clean_error(*invoke("show", "../etc", "--store", url))


def test_bad_store_url_is_a_clean_error() -> None:
    for command in (["ls"], ["show", "x"], ["cancel", "x"]):
        assert_clean_error(*invoke(*command, "--store", "bogus://somewhere"))


def test_corrupt_journal_is_a_clean_error(url: str, tmp_path: Path) -> None:
    completed_run(url, "broken-run")
    journal = tmp_path / "runs" / "broken-run.jsonl"
    data = journal.read_bytes()
    journal.write_bytes(data.replace(b"London", b"Londom", 1))
    code, output = invoke("show", "broken-run", "--store", url)
    assert_clean_error(code, output)
    assert "broken-run" in output


# --------------------------------------------------------------------------------------------------
# cancel


def test_cancel_an_idle_run(url: str) -> None:
    weather_agent(url).submit("What is the weather in Oslo?", id="idle-run")
    code, output = invoke("cancel", "idle-run", "--store", url, "--by", "alice")
    assert code == 0, output
    assert "cancelled" in output and "journaled" in output
    state = open_store(url).load("idle-run")
    assert state.status == "cancelled"
    [request] = [e for e in state.history if e.kind == "cancel_requested"]
    assert isinstance(request, j.CancelRequested) and request.by == "alice"


def test_cancel_a_crashed_run(url: str, tmp_path: Path) -> None:
    crashed_run(url, "crashed-run", tmp_path, "after_append:tool_started")
    code, output = invoke("cancel", "crashed-run", "--store", url)
    assert code == 0, output
    assert open_store(url).load("crashed-run").status == "cancelled"


def test_cancel_a_held_run_posts_it(url: str) -> None:
    weather_agent(url).submit("What is the weather in Rome?", id="held-run")
    holder = FileStore(url.removeprefix("file:"))
    lease = holder.claim("held-run", Owner.here())
    try:
        code, output = invoke("cancel", "held-run", "--store", url)
        assert code == 0, output
        assert "posted" in output and f"pid {os.getpid()}" in output
        assert open_store(url).load("held-run").status == "running"
        assert holder.inbox_length("held-run") == 1
    finally:
        holder.abandon(lease)


def test_cancel_unknown_run_is_a_clean_error(url: str) -> None:
    completed_run(url, "some-run")
    assert_clean_error(*invoke("cancel", "nope", "--store", url))


# --------------------------------------------------------------------------------------------------
# the timeline renderer and import cost


def test_timeline_summaries() -> None:
    entries: list[j.Entry] = [
        j.RunStarted(
            seq=0, at="2025-01-31T12:04:59.031234Z", agent="weather", fingerprint={"model": "scripted"}
        ),
        j.MessageAdded(
            seq=1, at="2025-01-31T12:04:59.031234Z", content=[{"type": "text", "text": "hi\nthere"}]
        ),
        j.ModelReplied(
            seq=2,
            at="2025-01-31T12:04:59.5Z",
            content=[{"type": "tool_call", "id": "c2_0", "name": "get_weather", "args": {"city": "London"}}],
        ),
        j.ToolStarted(
            seq=3, at="2025-01-31T12:05:00Z", call_id="c2_0", tool="get_weather", effect="read_only"
        ),
        j.ToolFinished(
            seq=4, at="2025-01-31T12:05:00Z", call_id="c2_0", content=[{"type": "text", "text": "Sunny"}]
        ),
        j.RunStopped(seq=5, at="2025-01-31T12:05:01Z", status="completed", answer="Sunny."),
    ]
    lines = timeline_lines(entries)
    assert lines[0].split() == ["seq", "time", "kind", "summary"]
    assert (
        len({line.index(entry.kind) for line, entry in zip(lines[1:], entries, strict=True)}) == 1
    )  # aligned
    assert "agent weather, model scripted" in lines[1]
    assert 'user: "hi there"' in lines[2]
    assert 'c2_0 get_weather(city="London")' in lines[3]
    assert "c2_0 get_weather (read_only, attempt 1)" in lines[4]
    assert 'c2_0 get_weather done: "Sunny"' in lines[5]
    assert 'completed: "Sunny."' in lines[6]
    assert format_time("2025-01-31T12:04:59.031234Z") == "12:04:59.031"
    assert format_time("2025-01-31T12:04:59Z") == "12:04:59.000"
    assert format_args({"a": 1, "b": [1, 2]}) == "a=1, b=[1, 2]"
    assert truncate("x" * 100, 10) == "x" * 9 + "…"
    assert summarize(j.CancelRequested(seq=9, at="", by="bob")) == "by bob"


def test_next_step_of_a_completed_run(url: str) -> None:
    completed_run(url, "next-run")
    assert next_step(open_store(url).load("next-run")).startswith("return it as it is (completed)")


def test_import_tether_loads_no_cli_libraries() -> None:
    code = "import sys, tether; print(sorted(m for m in ('typer', 'rich', 'tether.cli') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_console_script_runs() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tether.cli", "--help"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    for command in ("demo", "ls", "show", "cancel"):
        assert command in done.stdout
