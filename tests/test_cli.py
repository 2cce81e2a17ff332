"""The ``tether`` command: demo, ls, show, cancel, and its one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tether import Agent, FileStore, Owner, State, open_store, tool
from tether import journal as j
from tether._cli.app import DEFAULT_STORE, app
from tether._harness.conformance.support import writer_of
from tether._timeline import format_args, format_time, next_step, summarize, timeline_lines, truncate
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
    argv = [sys.executable, "-m", "tether._cli.demo", "start", url, run_id, str(tmp_path / "side.log")]
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
    assert "store  sqlite:////" in output  # a SQLite file in a fresh temporary folder
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
    from tether._cli import demo as _demo

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


def test_default_store_is_a_sqlite_file_under_the_current_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert DEFAULT_STORE == "sqlite:///.tether/runs.db"
    monkeypatch.chdir(tmp_path)
    code, output = invoke("ls")
    assert code == 0 and "no runs in sqlite:///.tether/runs.db (it does not exist yet)" in output, output
    assert not (tmp_path / ".tether").exists()  # looking creates nothing
    assert_clean_error(*invoke("show", "some-run"))
    completed_run(f"sqlite:///{tmp_path / '.tether' / 'runs.db'}", "here-run")
    code, output = invoke("ls")
    assert code == 0 and "here-run" in output, output


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
    seqs = [line.split()[0] for line in output.splitlines() if line.split() and line.split()[0].isdigit()]
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
    assert 'c3_0  send_email(to="bob@example.com")' in pending[1] and "asked" in pending[2]
    assert pending[3].split() == ["approve:", "tether", "approve", "waiting-run", "c3_0", "--store", url]
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
    lines = timeline_lines(entries, dates=False)
    assert lines[0].split() == ["seq", "time", "kind", "summary"]
    assert timeline_lines(entries)[1].split() == ["2025-01-31", "UTC"]  # the date and the zone
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
    code = "import sys, tether; print(sorted(m for m in ('typer', 'rich', 'tether.cli', 'tether._cli.app') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_console_script_runs() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tether.cli", "--help"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    for command in (
        "demo",
        "ls",
        "show",
        "cancel",
        "rm",
        "prune",
        "fork",
        "approve",
        "deny",
        "resume",
        "run",
    ):
        assert command in done.stdout


# --------------------------------------------------------------------------------------------------
# On SQLite: ls filters, rm, prune, fork


@pytest.fixture
def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'runs.db'}"


def age_run(url: str, run_id: str, days: float) -> None:
    """Make a SQLite run look last updated ``days`` ago."""
    from datetime import UTC, datetime, timedelta

    from tether.stores.sqlite import SQLiteStore

    store = open_store(url)
    assert isinstance(store, SQLiteStore)
    at = (datetime.now(UTC) - timedelta(days=days)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    store._conn().execute("UPDATE runs SET updated_at = ? WHERE id = ?", (at, run_id))
    store.close()


def make_tree(url: str, root: str = "root", child: str = "kid", *, pending: bool = False) -> None:
    """A root waiting on a subagent run (``pending``: the child waits for a decision on c2_0)."""
    store = open_store(url)
    parent = State(id=root)
    writer_of(parent).add(j.RunStarted, agent="boss", root_id=root)
    writer_of(parent).add(j.MessageAdded, role="user", content=[{"type": "text", "text": "delegate"}])
    writer_of(parent).add(
        j.ModelReplied, content=[{"type": "tool_call", "id": "c2_0", "name": "helper", "args": {}}]
    )
    writer_of(parent).add(
        j.ToolStarted, call_id="c2_0", tool="helper", effect="resumable", idempotency_key="k"
    )
    writer_of(parent).add(j.ChildWaiting, call_id="c2_0", child_id=child)
    store.create(root, writer_of(parent).next_batch(), parent.info())
    kid = State(id=child)
    writer_of(kid).add(j.RunStarted, agent="helper", parent_id=root, root_id=root, parent_call_id="c2_0")
    writer_of(kid).add(j.MessageAdded, role="user", content=[{"type": "text", "text": "help"}])
    if pending:
        writer_of(kid).add(
            j.ModelReplied, content=[{"type": "tool_call", "id": "c2_0", "name": "send_email", "args": {}}]
        )
        writer_of(kid).add(j.ApprovalRequested, call_id="c2_0", tool="send_email", args={})
    store.create(child, writer_of(kid).next_batch(), kid.info())
    store.close()


def test_ls_filters_by_agent_parent_and_limit_on_sqlite(db: str) -> None:
    completed_run(db, "w1")
    completed_run(db, "w2")
    make_tree(db)
    code, output = invoke("ls", "--store", db, "--json", "--agent", "weather")
    assert code == 0, output
    assert [run["id"] for run in json.loads(output)] == ["w2", "w1"]
    code, output = invoke("ls", "--store", db, "--json", "--parent", "root")
    assert [run["id"] for run in json.loads(output)] == ["kid"]
    code, output = invoke("ls", "--store", db, "--limit", "2", "--json")  # two trees: root (with kid), w2
    assert [run["id"] for run in json.loads(output)] == ["root", "kid", "w2"]
    code, output = invoke("ls", "--store", db, "-n", "1", "--roots", "--json")
    assert [run["id"] for run in json.loads(output)] == ["root"]
    code, output = invoke("ls", "--store", db)
    header, *rows = [line for line in output.splitlines() if line.strip()]
    assert header.split()[:5] == ["id", "agent", "status", "turn", "updated"]
    assert header.index("status") == rows[0].index("waiting") == rows[1].index("running (no owner)")
    assert [row.split()[0] for row in rows] == ["root", "└", "w2", "w1"]
    assert rows[1].split()[:3] == ["└", "kid", "helper"]  # the child, under its root
    assert_clean_error(*invoke("ls", "--store", db, "--parent", "../x"))


def test_rm_deletes_refuses_held_runs_and_trees_need_children(db: str) -> None:
    completed_run(db, "gone")
    code, output = invoke("rm", "gone", "--store", db)
    assert code == 0 and "deleted run gone" in output, output
    assert not open_store(db).exists("gone")
    weather_agent(db).submit("Weather?", id="held")
    holder = open_store(db)
    lease = holder.claim("held", Owner.here())
    code, output = invoke("rm", "held", "--store", db)
    assert_clean_error(code, output)
    assert "driven by pid" in output and "Fix: wait for it, or tether cancel held" in output
    holder.abandon(lease)
    make_tree(db)
    code, output = invoke("rm", "root", "--store", db)
    assert_clean_error(code, output)
    assert "run root has 1 subagent run. Fix: tether rm root --children" in output
    code, output = invoke("rm", "kid", "--store", db)  # through its root only
    assert_clean_error(code, output)
    assert "Fix: tether rm root --children" in output
    code, output = invoke("rm", "root", "--children", "--store", db)
    assert code == 0 and "deleted run root and its 1 subagent run" in output, output
    assert {info.id for info in open_store(db).list()} == {"held"}
    assert_clean_error(*invoke("rm", "nope", "--store", db))


def test_prune_by_age_and_status_with_a_dry_run(db: str) -> None:
    for run_id in ("old-done", "old-failed", "new-done"):
        completed_run(db, run_id)
    weather_agent(db).submit("Weather?", id="old-running")
    store = open_store(db)
    store._conn().execute("UPDATE runs SET status = 'failed' WHERE id = 'old-failed'")  # type: ignore[attr-defined]
    for run_id in ("old-done", "old-failed", "old-running"):
        age_run(db, run_id, 31)
    code, output = invoke("prune", "--older-than", "30d", "--dry-run", "--store", db)
    assert code == 0, output
    assert "would delete 2 runs (dry run: nothing deleted)" in output
    assert "old-done" in output and "old-failed" in output and "old-running" not in output
    assert len(store.list()) == 4
    code, output = invoke("prune", "--older-than", "30d", "--status", "failed", "--store", db)
    assert code == 0 and "deleted 1 run:" in output and "old-failed" in output, output
    code, output = invoke("prune", "--older-than", "45d", "--store", db)
    assert code == 0 and "no runs to prune" in output, output
    code, output = invoke("prune", "--older-than", "720h", "--store", db)
    assert code == 0 and "deleted 1 run:" in output and "old-done" in output, output
    assert {info.id for info in store.list()} == {"new-done", "old-running"}
    for bad in (["--older-than", "soon"], ["--older-than", "30d", "--status", "running"]):
        assert_clean_error(*invoke("prune", *bad, "--store", db))


def test_prune_trees_need_children(db: str) -> None:
    make_tree(db)
    store = open_store(db)
    store._conn().execute("UPDATE runs SET status = 'completed'")  # type: ignore[attr-defined]
    for run_id in ("root", "kid"):
        age_run(db, run_id, 2)
    code, output = invoke("prune", "--older-than", "90m", "--store", db)
    assert code == 0 and "nothing pruned" in output and "1 have subagent runs: add --children" in output, (
        output
    )
    code, output = invoke("prune", "--older-than", "1d", "--children", "--store", db)
    assert code == 0 and "deleted 2 runs:" in output and "kid" in output, output
    assert store.list() == []


def test_fork_rounds_down_to_a_turn_and_names_the_new_run(db: str) -> None:
    completed_run(db, "src")
    kinds = [e.kind for e in open_store(db).load("src").history]
    started = kinds.index("tool_started")
    code, output = invoke("fork", "src", "--at", str(started), "--id", "branch", "--store", db)
    assert code == 0, output
    assert (
        f"forked run src at seq 1 as branch (seq {started} rounded down to the turn ending at seq 1)"
        in output
    )
    assert (
        f"Continue it: tether resume AGENT branch --store {db} (AGENT: module:attribute of the Agent named weather)"
        in output
    )
    fork = open_store(db).load("branch")
    assert [e.kind for e in fork.history] == ["run_started", "message"]
    code, output = invoke("fork", "src", "--store", db)
    assert code == 0 and f"at seq {len(kinds) - 1} as " in output and "it is completed" in output, output
    assert_clean_error(*invoke("fork", "src", "--id", "branch", "--store", db))
    assert_clean_error(*invoke("fork", "src", "--at", "99", "--store", db))


# --------------------------------------------------------------------------------------------------
# approve, deny, run, resume


AGENT_MODULE = '''
import os
from tether import Agent, open_store, tool
from tether.testing import ExecutionLog, ScriptedModel, call

LOG = ExecutionLog(os.path.join(os.path.dirname(__file__), "executions.log"))


@tool(approval=True)
def send_email(to: str) -> str:
    """Send an email.

    Args:
        to: The address.
    """
    LOG.record(tool="send_email", to=to)
    return f"sent to {to}"


@tool(effect="read_only")
def get_weather(city: str) -> str:
    """Get the weather.

    Args:
        city: The city.
    """
    LOG.record(tool="get_weather", city=city)
    return f"Sunny in {city}"


agent = Agent(
    ScriptedModel([call("send_email", to="bob@example.com"), "I emailed Bob."]),
    name="mailer",
    tools=[send_email],
    store=open_store(os.environ["AGENT_STORE"]) if os.environ.get("AGENT_STORE") else None,
)


def make_weather():
    return Agent(
        ScriptedModel([call("get_weather", city="Paris"), "It is sunny in Paris."]),
        name="weather",
        tools=[get_weather],
    )


not_an_agent = 42
'''


@pytest.fixture
def agent_file(tmp_path: Path) -> Path:
    path = tmp_path / "agents" / "mailer_agent.py"
    path.parent.mkdir()
    path.write_text(AGENT_MODULE)
    return path


def executions(agent_file: Path) -> list[dict[str, object]]:
    from tether.testing import ExecutionLog

    return ExecutionLog(agent_file.parent / "executions.log").records()


def waiting_run(db: str, run_id: str = "mail-1") -> None:
    model = ScriptedModel([call("send_email", to="bob@example.com"), "I emailed Bob."])
    agent = Agent(model, name="mailer", tools=[send_email], store=open_store(db))
    assert agent.run("email bob", id=run_id).status == "waiting"


def test_approve_journals_now_and_a_second_decision_is_refused(db: str) -> None:
    waiting_run(db)
    code, output = invoke("approve", "mail-1", "c3_0", "--by", "alice", "--reason", "fine", "--store", db)
    assert code == 0, output
    assert "call c3_0 of run mail-1 approved by alice: journaled at seq" in output
    assert (
        f"run mail-1 is not being driven. Fix: tether resume AGENT mail-1 --store {db} (AGENT: module:attribute of "
        in output
    )
    state = open_store(db).load("mail-1")
    decided = [e for e in state.history if isinstance(e, j.ApprovalDecided)]
    assert [(e.call_id, e.approved, e.by, e.reason) for e in decided] == [("c3_0", True, "alice", "fine")]
    assert state.status == "running" and open_store(db).holder("mail-1") is None
    code, output = invoke("approve", "mail-1", "c3_0", "--by", "bob", "--store", db)
    assert_clean_error(code, output)
    assert f"error: call c3_0 was already approved by alice at {decided[0].at}" in output
    code, output = invoke("deny", "mail-1", "c3_0", "--by", "bob", "--store", db)
    assert_clean_error(code, output)
    assert "already approved by alice" in output
    code, output = invoke("approve", "mail-1", "c9_9", "--by", "bob", "--store", db)
    assert_clean_error(code, output)
    assert "Fix: tether show mail-1 lists the calls that wait" in output
    assert_clean_error(*invoke("approve", "nope", "c3_0", "--by", "bob", "--store", db))


def test_deny_journals_the_denial_and_the_model_is_asked_again(db: str) -> None:
    waiting_run(db)
    code, output = invoke("deny", "mail-1", "c3_0", "--by", "bob", "--reason", "not today", "--store", db)
    assert code == 0, output
    assert "call c3_0 of run mail-1 denied by bob: journaled at seq" in output
    assert "is not being driven" in output
    state = open_store(db).load("mail-1")
    finished = [e for e in state.history if isinstance(e, j.ToolFinished)]
    assert [(e.call_id, e.outcome) for e in finished] == [("c3_0", "denied")]
    assert "not today" in finished[0].content[0]["text"]


def test_approve_a_held_run_posts_to_its_inbox(db: str) -> None:
    waiting_run(db)
    holder = open_store(db)
    lease = holder.claim("mail-1", Owner.here())
    try:
        code, output = invoke("approve", "mail-1", "c3_0", "--by", "alice", "--store", db)
        assert code == 0, output
        assert "approved by alice: posted to the run's inbox" in output
        assert f"run mail-1 is driven by pid {os.getpid()}" in output and "within its poll interval" in output
        assert holder.inbox_length("mail-1") == 1
        assert holder.load("mail-1").status == "waiting"  # the holder journals it, not the poster
    finally:
        holder.abandon(lease)


def test_approve_a_subagent_call_posts_to_the_child_and_names_the_root(db: str) -> None:
    make_tree(db, pending=True)
    before = open_store(db).read("kid")
    code, output = invoke("approve", "root", "c2_0", "--run", "kid", "--by", "alice", "--store", db)
    assert code == 0, output
    assert "call c2_0 of run kid approved by alice: posted to the run's inbox" in output
    assert (
        f"run root is not being driven. Fix: tether resume AGENT root --store {db} (AGENT: module:attribute of "
        in output
    )
    store = open_store(db)
    assert store.read("kid") == before and store.inbox_length("kid") == 1  # a child is never taken
    [item] = store.read_inbox("kid")
    assert item.body["call_id"] == "c2_0" and item.body["approved"] is True
    completed_run(db, "other-root")
    code, output = invoke("approve", "other-root", "c2_0", "--run", "kid", "--by", "alice", "--store", db)
    assert_clean_error(code, output)
    assert "run kid is not in the tree of other-root" in output


def test_run_then_approve_then_resume_with_an_agent_file(db: str, agent_file: Path) -> None:
    spec = f"{agent_file}:agent"
    code, output = invoke("run", spec, "email bob", "--id", "mail-2", "--store", db)
    assert code == 0, output
    assert '-> c3_0 send_email(to="bob@example.com")' in output
    assert "c3_0 send_email" in output and "waits for a decision" in output
    assert "run mail-2 is waiting" in output and "approve: tether approve mail-2 c3_0" in output
    assert f"then continue: tether resume {spec} mail-2" in output
    assert executions(agent_file) == []
    code, output = invoke("approve", "mail-2", "c3_0", "--by", "alice", "--store", db)
    assert code == 0, output
    code, output = invoke("resume", spec, "mail-2", "--store", db)
    assert code == 0, output
    assert "I emailed Bob." in output and output.count("I emailed Bob.") == 1  # the answer, once
    assert output.splitlines()[-1] == "run mail-2 is completed"
    assert [r["tool"] for r in executions(agent_file)] == ["send_email"]
    code, output = invoke("resume", spec, "mail-2", "--store", db)  # nothing left to do
    assert code == 0 and "run mail-2 is completed: I emailed Bob." in output, output
    assert len(executions(agent_file)) == 1


def test_run_streams_text_and_calls_with_a_factory_in_a_module(
    db: str, agent_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(agent_file.parent)
    monkeypatch.syspath_prepend(str(agent_file.parent))
    code, output = invoke(
        "run", "mailer_agent:make_weather", "Weather in Paris?", "--id", "w-1", "--store", db
    )
    assert code == 0, output
    lines = output.splitlines()
    assert '-> c3_0 get_weather(city="Paris")' in lines
    assert any("c3_0 get_weather done" in line and "Sunny in Paris" in line for line in lines)
    assert "It is sunny in Paris." in lines  # the streamed answer, on its own line
    assert output.count("It is sunny in Paris.") == 1
    assert lines[0] == "run w-1 started (agent weather)" and lines[-1] == "run w-1 is completed"
    assert open_store(db).load("w-1").answer == "It is sunny in Paris."
    code, output = invoke("run", "mailer_agent:make_weather", "again?", "--id", "w-1", "--store", db)
    assert_clean_error(code, output)
    assert "already exists" in output


def test_run_uses_the_agents_own_store(
    tmp_path: Path, agent_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    own = f"sqlite:///{tmp_path / 'own.db'}"
    monkeypatch.setenv("AGENT_STORE", own)
    code, output = invoke("run", f"{agent_file}:agent", "email bob", "--id", "own-1")
    assert code == 0, output
    assert open_store(own).load("own-1").status == "waiting"


def test_bad_agent_specs_are_clean_errors(db: str, agent_file: Path, tmp_path: Path) -> None:
    for spec in ("no-colon", f"{tmp_path / 'missing.py'}:agent", f"{agent_file}:nothing",
                 f"{agent_file}:not_an_agent", "no_such_module_xyz:agent", ":agent"):  # fmt: skip
        code, output = invoke("resume", spec, "r1", "--store", db)
        assert_clean_error(code, output)
        assert "--agent" not in output


def test_cancel_a_subagent_run_posts_it_and_names_the_root(db: str) -> None:
    make_tree(db, pending=True)
    before = open_store(db).read("kid")
    code, output = invoke("cancel", "kid", "--store", db, "--by", "alice")
    assert code == 0, output
    assert "run kid is a subagent run of root: the cancel was posted to its inbox" in output
    assert (
        f"run root is not being driven. Fix: tether resume AGENT root --store {db} (AGENT: module:attribute of "
        in output
    )
    store = open_store(db)
    assert store.read("kid") == before and store.inbox_length("kid") == 1  # a poster never takes a child
