"""The crash harness itself (``tether._harness.crash.crash_test``, re-exported by ``tether.testing``): its pieces in
process, then whole crash tests on small scenarios, including ones built to break an invariant."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tether import Agent, FileStore, Message, Tool, ToolContext, tool
from tether import journal as j
from tether._harness.crash.crash_test import (
    LOG_ENV,
    CrashCase,
    CrashReport,
    InvariantViolation,
    _instrument,
    calls_without_result,
    crash_test,
    judge,
    load_agent,
    record_execution,
)
from tether.testing import ExecutionLog, ScriptedModel, call

AGENTS = str(Path(__file__).parent / "crash" / "_harness_agents.py")


def ctx(call_id: str = "c3_0", attempt: int = 1, run_id: str = "r") -> ToolContext:
    return ToolContext(run_id, call_id, attempt, f"tether:{run_id}:{call_id}", "pay")


# --------------------------------------------------------------------------------------------------
# Pieces


def test_import_tether_testing_loads_no_harness_and_no_pytest() -> None:
    """ScriptedModel and ExecutionLog load with tether.testing; the harness and the conformance suite on use."""
    code = (
        "import sys, tether.testing as t\n"
        "names = ('pytest', 'tether._harness.crash', 'tether._harness.conformance')\n"
        "print(sorted(m for m in names if m in sys.modules))\n"
        "t.crash_test, t.record_execution, t.CrashReport\n"
        "print(sorted(m for m in names if m in sys.modules))\n"
        "t.StoreConformance\n"
        "print(sorted(m for m in names if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "[]",
        "['tether._harness.crash']",
        "['pytest', 'tether._harness.conformance', 'tether._harness.crash']",
    ]


def test_tether_testing_re_exports_the_harness() -> None:
    import tether.testing
    from tether._harness.execution_log import ExecutionLog as Moved

    assert ExecutionLog is Moved
    assert tether.testing.crash_test is crash_test and tether.testing.record_execution is record_execution
    assert {"StoreConformance", "crash_test", "ExecutionLog"} <= set(dir(tether.testing))
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        tether.testing.nothing  # noqa: B018


def test_calls_without_result_finds_calls_no_later_result_answers() -> None:
    asked = Message("assistant", ({"type": "tool_call", "id": "c3_0"}, {"type": "tool_call", "id": "c3_1"}))
    answered = Message("tool", ({"type": "tool_result", "call_id": "c3_0"},))
    later = Message("assistant", ({"type": "tool_call", "id": "c9_0"},))
    assert calls_without_result([Message.user("hi"), asked, answered]) == ["c3_1"]
    assert calls_without_result([Message.user("hi"), asked, answered, later]) == ["c3_1", "c9_0"]
    both = Message(
        "tool", ({"type": "tool_result", "call_id": "c3_0"}, {"type": "tool_result", "call_id": "c3_1"})
    )
    assert calls_without_result([asked, both, Message.user("more")]) == []
    assert calls_without_result([both, asked]) == ["c3_0", "c3_1"], "a result must come after its call"


def started(call_id: str, attempt: int, key: str, seq: int, effect: str = "unsafe") -> j.Entry:
    return j.ToolStarted(
        seq=seq, at="t", call_id=call_id, tool="pay", effect=effect, idempotency_key=key, attempt=attempt
    )


def execution(
    call_id: str, attempt: int, key: str, effect: str, pid: int, event: str = "start"
) -> dict[str, Any]:
    return {"event": event, "call_id": call_id, "attempt": attempt, "key": key, "effect": effect, "pid": pid,
            "tool": "pay", "run_id": "r"}  # fmt: skip


def test_judge_passes_a_clean_history_and_names_each_broken_invariant() -> None:
    key = "tether:r:c3_0"
    history = [started("c3_0", 1, key, 4, "idempotent"), started("c3_0", 2, key, 6, "idempotent")]
    clean = [execution("c3_0", 1, key, "idempotent", 10), execution("c3_0", 2, key, "idempotent", 11)]
    assert judge("r", history, clean) == []

    twice = [execution("c3_0", 1, key, "unsafe", 10), execution("c3_0", 1, key, "unsafe", 11)]
    (problem,) = judge("r", [started("c3_0", 1, key, 4)], twice)
    assert problem == "unsafe call c3_0 (pay) executed 2 times, by the tool (pids 10, 11)"

    keys = [execution("c3_0", 1, key, "idempotent", 10), execution("c3_0", 2, "other", "idempotent", 11)]
    problems = judge("r", history, keys)
    assert "idempotent call c3_0 (pay) saw 2 idempotency keys: other, tether:r:c3_0" in problems
    assert (
        f"idempotent call c3_0 (pay) attempt 2 executed with key other; its tool_started says {key}"
        in problems
    )

    early = [execution("c3_0", 3, key, "idempotent", 10)]
    assert judge("r", history, early) == [
        "idempotent call c3_0 (pay) attempt 3 executed without a durable tool_started, by the tool"
    ]
    again = [execution("c3_0", 1, key, "read_only", 10), execution("c3_0", 1, key, "read_only", 11)]
    assert judge("r", history, again) == [
        "read_only call c3_0 (pay): an attempt executed twice, by the tool (attempts [1, 1])"
    ]
    forked = [execution("c3_0", 1, key, "unsafe", 10, "execution")] * 2
    assert judge("r", [started("c3_0", 1, key, 4)], forked) == [
        "unsafe call c3_0 (pay) executed 2 times, by record_execution (pids 10, 10)"
    ]
    request = {"event": "request", "index": 2, "missing": ["c3_0"], "pid": 12, "run_id": "r"}
    assert judge("r", history, [request]) == ["model request 2 carried calls without a result: c3_0 (pid 12)"]


def test_record_execution_is_a_no_op_outside_the_harness(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "side.jsonl"
    monkeypatch.delenv(LOG_ENV, raising=False)
    record_execution(ctx(), "unsafe")
    assert not log.exists()
    monkeypatch.setenv(LOG_ENV, str(log))
    record_execution(ctx(), "unsafe", amount=3)
    (record,) = ExecutionLog(log).records()
    assert {k: record[k] for k in ("event", "source", "run_id", "call_id", "attempt", "key", "effect", "amount")} == {
        "event": "execution", "source": "tool", "run_id": "r", "call_id": "c3_0", "attempt": 1,
        "key": "tether:r:c3_0", "effect": "unsafe", "amount": 3,
    }  # fmt: skip
    with pytest.raises(ValueError, match=r"effect 'risky' is not known\. Fix:"):
        record_execution(ctx(), "risky")


@tool(effect="idempotent")
def sync_rows(table: str, ctx: ToolContext) -> str:
    """Sync a table."""
    return f"synced {table} ({ctx.attempt})"


@tool
async def shout(text: str) -> str:
    """Shout (an async tool without a context)."""
    return text.upper()


class CountingTool(Tool):
    """A user's own Tool subclass: the harness records it too."""

    calls = 0

    def invoke_sync(self, kwargs: dict[str, Any], ctx: ToolContext) -> Any:
        CountingTool.calls += 1
        return super().invoke_sync(kwargs, ctx)


def echo(text: str) -> str:
    """Echo the text."""
    return text


def test_instrument_records_every_tool_execution_and_model_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "side.jsonl"
    monkeypatch.setenv(LOG_ENV, str(log))
    model = ScriptedModel(
        [[call("sync_rows", table="a"), call("shout", text="hi"), call("echo", text="x")], "done"]
    )
    own = CountingTool(echo, effect="read_only")
    agent = Agent(model, tools=[sync_rows, shout, own], poll_interval=0.05)
    plain = Agent(ScriptedModel([]), tools=[sync_rows, shout, own])
    _instrument(agent)
    assert agent.fingerprint() == plain.fingerprint(), "the wrapped agent is the same agent to the journal"
    state = agent.run("go")
    assert state.status == "completed"
    assert [r["content"][0]["text"] for r in state.messages[2].content] == ["synced a (1)", "HI", "x"]
    assert CountingTool.calls == 1 and isinstance(own, CountingTool), "its own behaviour is kept"
    records = ExecutionLog(log).records()
    starts = {r["tool"]: r for r in records if r["event"] == "start"}
    assert starts["sync_rows"]["effect"] == "idempotent" and starts["shout"]["effect"] == "unsafe"
    assert starts["sync_rows"]["key"] == f"tether:{state.id}:c3_0" and starts["shout"]["call_id"] == "c3_1"
    assert starts["echo"]["effect"] == "read_only"
    assert sorted(r["outcome"] for r in records if r["event"] == "end") == ["done", "done", "done"]
    requests = [(r["index"], r["missing"]) for r in records if r["event"] == "request"]
    assert requests == [(0, []), (1, [])]
    assert len(model.requests) == 2, "the wrapped model still answers"


def test_load_agent_from_a_file_a_module_or_an_agent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_agent(f"{AGENTS}:tiny").name == "tiny"
    (tmp_path / "my_agents.py").write_text(
        textwrap.dedent(
            """
            from tether import Agent
            from tether.testing import ScriptedModel

            built = Agent(ScriptedModel(["hi"]), name="built")

            def make(greeting="hello"):
                return Agent(ScriptedModel([greeting]), name="made")

            def needs(store):
                return built
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert load_agent("my_agents:built").name == "built"
    assert load_agent("my_agents:make").name == "made"
    for spec, problem in [
        ("my_agents", "is not module:attribute or path/file.py:attribute"),
        ("my_agents:missing", "has no attribute missing"),
        ("my_agents:needs", "not an Agent or a function without arguments"),
        ("no_such_module_here:x", "module no_such_module_here not found"),
        (f"{tmp_path}/nope.py:x", "no file"),
        (f"{AGENTS}:NOT_AN_AGENT", "is a int, not an Agent"),
        (f"{AGENTS}:lookup", "is a Tool, not an Agent"),
    ]:
        with pytest.raises(ValueError, match="Fix:") as caught:
            load_agent(spec)
        assert problem in str(caught.value)


def test_the_report_table_and_counts() -> None:
    rows = [
        CrashCase("before_append", 2, "run_resumed", True, 1, "completed", [], "x-2b"),
        CrashCase("after_append", 2, "run_resumed", False, 0, "completed", [], "x-2a"),
        CrashCase(
            "before_append", 3, "tool_finished", True, 1, "completed", ["unsafe call c3_0 ran twice"], "x-3b"
        ),
    ]
    base = CrashCase("none", -1, "no crash", False, 0, "completed", [], "x-base")
    report = CrashReport(rows, boundaries=2, baseline=base, agent="a:b", store_url="file:/r")
    assert report.violations == 1 and report.exercised == 1 and report.not_reached == [rows[1]]
    text = str(report)
    assert text.splitlines()[0].startswith(
        "crash test of a:b on file:/r: 2 boundaries, 3 cases, 1 boundaries ex"
    )
    assert "  before_append     3  tool_finished  yes         1  completed  1" in text
    assert "  before_append at seq 3 (run x-3b): unsafe call c3_0 ran twice" in text
    assert "not reached: 1 cases" in text
    assert str(report) in str(InvariantViolation(report))


# --------------------------------------------------------------------------------------------------
# Whole crash tests


@pytest.mark.crash
def test_a_crash_test_kills_every_boundary_and_resumes_in_new_processes(tmp_path: Path) -> None:
    seen: list[CrashCase] = []
    report = crash_test(f"{AGENTS}:tiny", "go", store_url=f"file:{tmp_path / 'runs'}", on_case=seen.append)
    assert report.violations == 0 and report.boundaries == 4 and report.exercised == 4
    assert [(r.point, r.seq, r.kind) for r in report.rows[:4]] == [
        ("before_append", 2, "run_resumed"),
        ("after_append", 2, "run_resumed"),
        ("torn_append", 2, "run_resumed"),
        ("before_append", 3, "model_replied+tool_started"),
    ]
    assert sorted(c.run_id for c in seen) == sorted(r.run_id for r in report.rows)
    assert all(r.died and r.status == "completed" for r in report.rows)
    assert [r.resumes for r in report.rows if r.seq == 6] == [1, 0, 1], (
        "after the last append: nothing to resume"
    )
    store = FileStore(tmp_path / "runs")
    for row in report.rows:
        state = store.load(row.run_id)
        pids = {e.pid for e in state.history if isinstance(e, j.RunResumed)}
        acted = (row.seq > 2 or row.point == "after_append") + row.resumes  # processes that journaled
        assert len(pids) == acted
        assert state.answer == "answer: done:found x"


@pytest.mark.crash
def test_a_crash_test_on_sqlite_with_fresh_interpreters(tmp_path: Path) -> None:
    report = crash_test(
        f"{AGENTS}:tiny",
        "go",
        store_url=f"sqlite:///{tmp_path / 'runs.db'}",
        points=("torn_append",),
        fresh_interpreter=True,
        run_id_prefix="fresh",
    )
    assert report.violations == 0 and report.boundaries == 4
    assert [r.run_id.startswith("fresh-") and r.died for r in report.rows] == [True] * 4


@pytest.mark.crash
def test_a_broken_invariant_raises_with_the_report(tmp_path: Path) -> None:
    with pytest.raises(InvariantViolation) as caught:
        crash_test(f"{AGENTS}:double_charge", "go", store_url=f"file:{tmp_path}", points=("after_append",))
    report = caught.value.report
    assert report.baseline is not None
    assert report.baseline.violations[0].startswith(
        "unsafe call c3_0 (pay_twice) executed 2 times, by record_ex"
    )
    by_seq = {row.seq: row.violations for row in report.rows}
    assert by_seq[3] == [], "killed after the call's start was durable, before it ran: aborted, never run"
    assert all(len(v) == 1 for seq, v in by_seq.items() if seq != 3)
    assert report.violations == 1 + 3
    assert "executed 2 times" in str(caught.value)


@pytest.mark.crash
def test_a_subagents_runs_are_crashed_and_judged_too(tmp_path: Path) -> None:
    with pytest.raises(InvariantViolation) as caught:
        crash_test(
            f"{AGENTS}:double_charge_in_subagent",
            "go",
            store_url=f"file:{tmp_path}",
            points=["before_append"],
        )
    report = caught.value.report
    assert [row.where for row in report.rows] == ["root"] * 2 + ["subagent 1"] * 4 + ["root"] * 2
    assert [row.seq for row in report.rows] == [2, 3, 2, 3, 5, 6, 5, 6]
    assert all(row.died and row.status == "completed" for row in report.rows)
    assert report.baseline is not None
    (problem,) = report.baseline.violations
    assert problem.startswith(f"in subagent run {report.baseline.run_id}-") and "executed 2 times" in problem


@pytest.mark.crash
def test_a_crash_test_with_a_module_on_the_parents_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "shop_agents.py").write_text(
        textwrap.dedent(
            """
            from tether import Agent, tool
            from tether.testing import ScriptedModel, call

            @tool(effect="idempotent")
            def reserve(item: str) -> str:
                '''Reserve an item.'''
                return "reserved " + item

            def build():
                return Agent(ScriptedModel([call("reserve", item="book"), "done"]), name="shop", tools=[reserve])
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    report = crash_test(
        "shop_agents:build", "buy", store_url=f"file:{tmp_path / 'runs'}", points=["before_append"]
    )
    assert report.violations == 0 and report.boundaries == 4 and not report.not_reached


@pytest.mark.crash
def test_a_failpoint_the_run_never_reaches_is_reported_not_reached(tmp_path: Path) -> None:
    (tmp_path / "moody.py").write_text(
        textwrap.dedent(
            """
            import os
            from tether import Agent, tool
            from tether.testing import ScriptedModel, call

            @tool(effect="read_only")
            def look() -> str:
                '''Look.'''
                return "seen"

            def build():
                # a scenario that differs between processes: shorter whenever a failpoint is set
                short = bool(os.environ.get("TETHER_FAILPOINT"))
                return Agent(ScriptedModel(["done"] if short else [call("look"), "done"]), name="moody", tools=[look])
            """
        )
    )
    report = crash_test(
        f"{tmp_path}/moody.py:build", "go", store_url=f"file:{tmp_path / 'runs'}", points=["after_append"]
    )
    assert report.boundaries == 4 and report.violations == 0
    assert [(r.seq, r.died) for r in report.rows] == [(2, True), (3, True), (5, False), (6, False)]
    assert report.exercised == 2 and "not reached: 2 cases" in str(report)
    assert [r.status for r in report.not_reached] == ["completed", "completed"]


@pytest.mark.crash
@pytest.mark.slow
def test_a_child_that_hangs_is_killed_at_the_timeout_and_reported(tmp_path: Path) -> None:
    (tmp_path / "stuck.py").write_text(
        textwrap.dedent(
            """
            import os, time
            from tether import Agent, tool
            from tether.testing import ScriptedModel, call

            @tool(effect="read_only")
            def wait() -> str:
                '''Hangs in a process given a failpoint.'''
                if os.environ.get("TETHER_FAILPOINT"):
                    time.sleep(60)
                return "waited"

            def build():
                return Agent(ScriptedModel([call("wait"), "done"]), name="stuck", tools=[wait])
            """
        )
    )
    with pytest.raises(InvariantViolation) as caught:
        crash_test(
            f"{tmp_path}/stuck.py:build", "go", store_url=f"file:{tmp_path / 'runs'}", points=["before_append"],
            timeout=4,
        )  # fmt: skip
    rows = {row.seq: row for row in caught.value.report.rows}
    assert rows[2].violations == [] and rows[3].violations == [], "killed before the tool ran"
    (problem,) = rows[5].violations
    assert problem.startswith("the crashing child did not end within the timeout")
    assert rows[5].status == "running" and rows[5].resumes == 0


def test_bad_arguments_are_refused_before_any_process_starts(tmp_path: Path) -> None:
    url = f"file:{tmp_path}"
    for kwargs, problem in [
        ({"store_url": "memory:"}, "a memory: store lives in one process"),
        ({"store_url": url, "points": ["during_lunch"]}, "failpoints ['during_lunch'] are not known"),
        ({"store_url": url, "points": []}, "failpoints none are not known"),
        ({"store_url": url, "run_id_prefix": "no/slashes"}, "is not valid"),
        ({"store_url": url, "max_resumes": 0}, "max_resumes must be at least 1"),
    ]:
        with pytest.raises(ValueError, match="Fix:") as caught:
            crash_test(f"{AGENTS}:tiny", "go", **kwargs)
        assert problem in str(caught.value)
    with pytest.raises(ValueError, match="is not module:attribute"):
        crash_test("tiny", "go", store_url=url)
    assert not any(tmp_path.iterdir()), "nothing was written"


@pytest.mark.crash
def test_a_scenario_that_does_not_run_once_is_refused_with_the_childs_error(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="Fix: make the agent run the prompt to its end") as caught:
        crash_test(f"{AGENTS}:NOT_AN_AGENT", "go", store_url=f"file:{tmp_path}")
    assert "is a int, not an Agent" in str(caught.value)


# --------------------------------------------------------------------------------------------------
# The command line (`tether crashtest`)


def crashtest(*args: str) -> tuple[int, str, str]:
    """``tether crashtest ARGS`` through typer's runner: (exit code, stdout, stderr)."""
    from typer.testing import CliRunner

    from tether._cli.app import app

    result = CliRunner().invoke(app, ["crashtest", *args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.crash
def test_crashtest_prints_the_report_and_exits_by_the_result(tmp_path: Path) -> None:
    url = f"file:{tmp_path / 'runs'}"
    code, out, err = crashtest(
        f"{AGENTS}:tiny", "go", "--store", url, "--points", "before_append,torn_append"
    )
    assert code == 0, err
    assert "4 boundaries, 8 cases, 4 boundaries exercised, 0 violations" in out
    assert "after_append" not in out and err.count(": completed, ok") == 8
    code, out, _ = crashtest(f"{AGENTS}:double_charge", "go", "-s", url, "-p", "after_append")
    assert code == 1
    assert "violations:" in out and "executed 2 times" in out
    code, _, err = crashtest(f"{AGENTS}:tiny", "go", "--store", url, "--points", "sideways")
    assert (
        code == 2
        and err
        == "error: failpoints ['sideways'] are not known. Fix: use some of before_append, after_append, torn_append\n"
    )
    assert crashtest(f"{AGENTS}:tiny", "go", "--store", "memory:")[0] == 2
    code, _, err = crashtest(f"{AGENTS}:tiny", "go", "--approve", "some")
    assert code == 2 and "Fix: pass --approve all" in err


@pytest.mark.crash
def test_crashtest_uses_a_temporary_store_unless_told(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TETHER_STORE", f"file:{tmp_path / 'mine'}")
    code, _, err = crashtest(f"{AGENTS}:tiny", "go", "--points", "after_append")
    assert code == 0, err
    assert "(a temporary store; --store URL keeps the runs)" in err
    temporary = re.search(r"runs in (sqlite:///\S+)", err)
    assert temporary is not None and not Path(temporary.group(1).removeprefix("sqlite:///")).exists()
    assert list(tmp_path.iterdir()) == [], "nothing in the user's default store, nor in the current folder"


APPROVAL_AGENT = """
from tether import Agent, tool
from tether.testing import ScriptedModel, call


@tool(approval=True)
def deploy(version: str) -> str:
    \"\"\"Deploy a version.

    Args:
        version: The version.
    \"\"\"
    return f"deployed {version}"


def agent():
    return Agent(
        ScriptedModel([call("deploy", version="1.2"), "Deployed."]), name="deployer", tools=[deploy],
        poll_interval=0.05,
    )
"""


@pytest.mark.crash
def test_crashtest_says_what_a_waiting_end_means_and_approve_all_goes_past_it(tmp_path: Path) -> None:
    (tmp_path / "deployer.py").write_text(APPROVAL_AGENT)
    spec = f"{tmp_path / 'deployer.py'}:agent"
    url = f"sqlite:///{tmp_path / 'ct.db'}"
    code, out, err = crashtest(spec, "go", "--store", url, "--points", "after_append")
    assert code == 0, err
    assert "without a crash the run ends waiting" in out
    assert "waiting: without a crash the run stops to wait for a decision on an approval" in out
    assert f"Fix: tether crashtest {spec} go --approve all" in out
    code, out, err = crashtest(spec, "go", "--store", url, "-p", "after_append", "--approve", "all")
    assert code == 0, err
    assert "without a crash the run ends completed" in out and "waiting" not in out
    assert "approval_decided" in out, "the boundaries after the approval were crash-tested"
    assert ": completed, ok" in err and "waiting" not in err


def test_the_crashtest_command_prints_the_report_and_exits_0_without_violations(tmp_path: Path) -> None:
    import subprocess
    import sys

    agents = Path(__file__).resolve().parent / "crash" / "_harness_agents.py"
    out = subprocess.run(
        [sys.executable, "-m", "tether.cli", "crashtest", f"{agents}:failing_tool", "go",
         "--store", f"sqlite:///{tmp_path}/ct.db", "--points", "after_append"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "0 violations" in out.stdout
    assert "tool_finished" in out.stdout and "completed" in out.stdout
