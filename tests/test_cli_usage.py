"""The command line as people use it (issue 19): each item through the real CLI.

An 80-column ``ls`` of a run tree with a waiting child, short ids taken by every command, the printed
approve command executed as printed, one live view for ``run`` and ``resume``, retries and failures,
``prune``/``rm``/``cancel``, flags and defaults, errors that name a command, dated times in a zone,
``--json`` and ``follow``, and the README's command lines.
"""

from __future__ import annotations

import getpass
import json
import re
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tether import journal as j
from tether import open_store
from tether._cli.app import app
from tether.stores.sqlite import SQLiteStore

runner = CliRunner()
ROOT = Path(__file__).resolve().parent.parent

APP = '''
import os
import threading
from tether import Agent, tool
from tether.models import RateLimitError
from tether.testing import ScriptedModel, call

RELEASE = threading.Event()
STARTED = threading.Event()


@tool(approval=True)
def send_email(to: str) -> str:
    """Send an email.

    Args:
        to: The address.
    """
    with open(os.path.join(os.path.dirname(__file__), "sent.log"), "a") as log:
        log.write(to + "\\n")
    return f"sent to {to}"


@tool(effect="read_only")
def get_weather(city: str) -> str:
    """Get the weather.

    Args:
        city: The city.
    """
    return f"Sunny in {city}"


@tool(effect="read_only")
def slow_lookup(query: str) -> str:
    """Look something up, once the test lets it.

    Args:
        query: What to look up.
    """
    STARTED.set()
    RELEASE.wait(30)
    return f"found {query}"


def boss():
    helper = Agent(
        ScriptedModel([call("send_email", to="bob@example.com"), "Emailed Bob."]),
        name="helper",
        description="Sends emails.",
        tools=[send_email],
        poll_interval=0.05,
    )
    return Agent(
        ScriptedModel([call("helper", prompt="email bob the report"), "Bob has the report."]),
        name="boss",
        tools=[helper],
        poll_interval=0.05,
    )


def weather():
    return Agent(
        ScriptedModel([call("get_weather", city="Paris"), "It is sunny in Paris."]),
        name="weather",
        tools=[get_weather],
    )


def _limit():
    return RateLimitError(
        "openai rate limit (429, rate_limit_exceeded): slow down. Fix: nothing; tether retries "
        "(Agent(model_retries=...))",
        status_code=429,
        retry_after=0.01,
        provider="openai",
    )


def flaky():
    return Agent(ScriptedModel([_limit(), "Done after a retry."]), name="flaky", retry_delay=0.001)


def limited():
    return Agent(
        ScriptedModel([_limit(), _limit(), _limit(), "never"]), name="limited", retry_delay=0.001, model_retries=2
    )


def slow():
    return Agent(
        ScriptedModel([call("slow_lookup", query="x"), "Found it."]),
        name="slow",
        tools=[slow_lookup],
        poll_interval=0.05,
    )
'''


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TETHER_STORE", raising=False)
    monkeypatch.delenv("TETHER_FAILPOINT", raising=False)
    monkeypatch.delenv("COLUMNS", raising=False)


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder holding app.py, made the current folder (so ``app.py:boss`` names the agent)."""
    (tmp_path / "app.py").write_text(APP)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


@pytest.fixture
def db(here: Path) -> str:
    return f"sqlite:///{here / 'runs.db'}"


def tether(*args: str, env: dict[str, str] | None = None, input: str | None = None) -> tuple[int, str]:
    """Run ``tether ARGS`` through typer's runner: (exit code, stdout and stderr)."""
    result = runner.invoke(app, list(args), env=env, input=input)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


def ok(*args: str, env: dict[str, str] | None = None, input: str | None = None) -> str:
    code, output = tether(*args, env=env, input=input)
    assert code == 0, output
    return output


def clean_error(code: int, output: str) -> str:
    """The one line of an error, checked: exit 2, ``Fix:`` naming a command, no Python advice."""
    assert code == 2, output
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Fix:" in lines[0], output
    for python in ("state.", "store.", "=True", "run_id=", "()", "--agent", "Traceback"):
        assert python not in lines[0], lines[0]
    return lines[0]


def run_ids(db: str) -> dict[str, str]:
    """The runs of the store: agent name -> id (one run per agent in these tests)."""
    return {info.agent or "": info.id for info in open_store(db).list(limit=1000)}


def waiting_tree(db: str) -> tuple[str, str, str]:
    """``tether run app.py:boss``: a root waiting on its subagent run, which waits for an approval."""
    output = ok("run", "app.py:boss", "Send the report to Bob", "--store", db)
    found = run_ids(db)
    return found["boss"], found["helper"], output


# --------------------------------------------------------------------------------------------------
# 1. ls at 80 columns, children folded, short ids


def test_ls_at_80_columns_folds_the_waiting_child_under_its_root_and_keeps_every_status(db: str) -> None:
    ok("run", "app.py:weather", "Weather in Paris?", "--store", db)
    root, child, _ = waiting_tree(db)
    ok("submit", "app.py:weather", "and in Rome?", "--store", db)
    output = ok("ls", "--store", db, env={"COLUMNS": "80"})
    lines = output.splitlines()
    assert all(len(line) <= 80 for line in lines), output
    header, *rows = lines
    assert header.split()[:5] == ["id", "agent", "status", "turn", "updated"]
    statuses = [re.search(r"running \(no owner\)|waiting|completed", row) for row in rows]
    assert all(statuses) and [m.group(0) for m in statuses if m] == [
        "running (no owner)",
        "waiting",
        "waiting",
        "completed",
    ]
    assert all(m.start() == header.index("status") for m in statuses if m)  # one column, never cut
    root_row, child_row = rows[1], rows[2]
    short_root, short_child = root_row.split()[0], child_row.split()[1]
    assert child_row.startswith("└ ") and "helper" in child_row
    assert len(short_root) < len(root) and root.startswith(short_root)
    assert len(short_child) < len(child) and short_child.startswith(short_root + "-")
    assert "first message" in header and "Send the report" in root_row
    for short, full in ((short_root, root), (short_child, child)):  # the short forms name the runs
        assert json.loads(ok("show", short, "--json", "--store", db))["id"] == full
    narrow = ok("ls", "--store", db, env={"COLUMNS": "40"})
    assert all("waiting" in row or "running (no owner)" in row or "completed" in row
               for row in narrow.splitlines()[1:])  # fmt: skip


def test_ls_roots_leaves_the_children_out_and_json_lists_trees_in_order(db: str) -> None:
    root, child, _ = waiting_tree(db)
    assert child not in ok("ls", "--roots", "--store", db) and "└" not in ok("ls", "--roots", "--store", db)
    listed = json.loads(ok("ls", "--json", "--store", db))
    assert [(run["id"], run["parent_id"]) for run in listed] == [(root, None), (child, root)]
    assert [run["id"] for run in json.loads(ok("ls", "--parent", root[:12], "--json", "--store", db))] == [
        child
    ]


def test_every_command_takes_a_short_id_and_an_ambiguous_one_is_refused(db: str) -> None:
    root, child, _ = waiting_tree(db)
    ok("run", "app.py:weather", "Weather?", "--store", db)
    weather = run_ids(db)["weather"]
    common = next(n for n, (a, b) in enumerate(zip(root, weather, strict=False)) if a != b)
    short_root, short_weather = root[: common + 1], weather[: common + 1]
    short_child = f"{short_root}-{child.split('-')[1][:4]}"
    assert json.loads(ok("show", short_child, "--json", "--store", db))["id"] == child
    assert "following run" in ok("follow", short_weather, "--store", db)
    ok("fork", short_weather, "--id", "forked", "--store", db)
    ok("rm", "forked", "--store", db)
    ok("approve", short_child, "c3_0", "--store", db)
    ok("resume", "app.py:boss", short_root, "--store", db)
    assert open_store(db).load(root).status == "completed"
    ok("cancel", short_weather, "--store", db)
    ok("rm", short_root, "-r", "--store", db)
    ok("run", "app.py:boss", "again", "--store", db)
    line = clean_error(*tether("show", weather[:6], "--store", db))
    assert "could be any of 2 runs" in line and "type more of the id" in line
    line = clean_error(*tether("show", "ffff" + weather[4:12], "--store", db))
    assert "no run in" in line and "Fix: tether ls --store" in line


# --------------------------------------------------------------------------------------------------
# 2. the printed approve command works as printed; show says which run a pending call is in


def test_the_printed_approve_command_works_as_printed(db: str, here: Path) -> None:
    root, _, output = waiting_tree(db)
    [approve] = re.findall(r"approve: (tether approve .+)", output)
    [resume] = re.findall(r"then continue: (tether resume .+)", output)
    assert f"(in subagent run {approve.split()[2]})" in output
    argv = shlex.split(approve)[1:]
    assert argv[1].startswith(root[:7]) and argv[1].split("-")[0] != root  # a short form of the child
    assert argv[2:] == ["c3_0", "--store", db]  # the store it was run with: the command works as printed
    done = ok(*argv)
    assert f"call c3_0 of run {argv[1]} approved by {getpass.getuser()}: posted to the run's inbox" in done
    assert not (here / "sent.log").exists()
    resumed = ok(*shlex.split(resume)[1:])
    assert "c3_0 helper done" in resumed and "Bob has the report." in resumed
    assert (here / "sent.log").read_text() == "bob@example.com\n"
    assert open_store(db).load(root).status == "completed"


def test_show_names_the_subagent_run_that_holds_a_pending_call(db: str) -> None:
    root, child, _ = waiting_tree(db)
    output = ok("show", root, "--store", db, env={"COLUMNS": "80"})
    pending = output[output.index("pending approvals:") :].splitlines()
    assert pending[1].split() == ["c3_0", 'send_email(to="bob@example.com")']
    short_child = re.fullmatch(r"\s+in subagent run (\S+)", pending[2])
    assert short_child is not None and child.startswith(short_child.group(1).split("-")[0])
    assert pending[3].split()[0] == "asked"
    approve = ["approve:", "tether", "approve", short_child.group(1), "c3_0", "--store", db]
    assert pending[4].split() == approve
    assert "subagent runs:" in output and "helper  waiting" in output
    assert all(len(line) <= 80 for line in output.splitlines() if "--store" not in line), output
    data = json.loads(ok("show", root, "--json", "--store", db))
    assert [(p["call_id"], p["run_id"]) for p in data["pending_approvals"]] == [("c3_0", child)]
    ok("approve", root[:10], "c3_0", "--store", db)  # the root and the call id: the call is found
    assert open_store(db).inbox_length(child) == 1


# --------------------------------------------------------------------------------------------------
# 3. one live view; failures; retries; the answer once


def test_run_and_resume_print_one_live_view(db: str) -> None:
    output = ok("run", "app.py:weather", "Weather?", "--store", db, "--id", "w-1")
    assert output.splitlines() == [
        "run w-1 started (agent weather)",
        '-> c3_0 get_weather(city="Paris")',
        '   c3_0 get_weather done: "Sunny in Paris"',
        "It is sunny in Paris.",
        "run w-1 is completed",
    ]
    store = open_store(db)
    store.fork("w-1", at_seq=[e.kind for e in store.read("w-1")].index("tool_started") - 1, new_id="w-2")
    resumed = ok("resume", "app.py:weather", "w-2", "--store", db)
    assert '-> c3_0 get_weather(city="Paris")' in resumed  # the same lines as run's
    assert '   c3_0 get_weather done: "Sunny in Paris"' in resumed
    assert resumed.count("It is sunny in Paris.") == 1 and resumed.splitlines()[-1] == "run w-2 is completed"


def test_a_retry_says_why_how_long_and_which_attempt(db: str) -> None:
    output = ok("run", "app.py:flaky", "go", "--store", db, "--id", "f-1")
    assert re.search(r"^   rate limited \(429\), retrying in \d+\.\d+ s \(2/5\)$", output, re.M), output
    assert "(the model is asked again)" not in output
    assert output.count("Done after a retry.") == 1


def test_a_failed_run_shows_its_id_and_how_to_continue(db: str) -> None:
    code, output = tether("run", "app.py:limited", "go", "--store", db, "--id", "l-1")
    assert code == 1, output
    assert "rate limited (429), retrying in" in output and "(3/3)" in output
    assert "run l-1 failed: RateLimitError: openai rate limit (429, rate_limit_exceeded): slow down" in output
    assert "(after 3 attempts)" in output
    assert (
        output.splitlines()[-1]
        == f"Continue: tether resume app.py:limited l-1 --store {db} (it asks the model again)"
    )
    assert "Fix: nothing" not in output and "tether retries" not in output
    assert open_store(db).load("l-1").status == "failed"
    shown = ok("show", "l-1", "--store", db)
    assert "Fix: nothing" not in shown and "a resume will: ask the model again" in shown


# --------------------------------------------------------------------------------------------------
# 5. prune says what it skipped; rm takes several ids and filters; cancel of a completed run


def _age(db: str, days: float) -> None:
    from datetime import UTC, datetime, timedelta

    at = (datetime.now(UTC) - timedelta(days=days)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    SQLiteStore(db.removeprefix("sqlite:///"))._conn().execute("UPDATE runs SET updated_at = ?", (at,))


def test_prune_says_how_many_runs_it_skipped_and_why(db: str) -> None:
    root, child, _ = waiting_tree(db)
    ok("approve", child, "c3_0", "--store", db)
    ok("resume", "app.py:boss", root, "--store", db)  # a completed tree
    ok("run", "app.py:weather", "Weather?", "--store", db)
    output = ok("prune", "--older-than", "0s", "--store", db)
    assert "deleted 1 run:" in output
    assert "skipped 1 run that match:" in output
    assert "1 have subagent runs: add --children (-r) to delete each whole tree" in output
    output = ok("prune", "--older-than", "0s", "-r", "--store", db)
    assert "deleted 2 runs:" in output and "skipped" not in output
    assert ok("prune", "--older-than", "0s", "--store", db).startswith("no runs to prune")


def test_rm_takes_several_ids(db: str) -> None:
    for run_id in ("a-1", "a-2", "a-3"):
        ok("run", "app.py:weather", "Weather?", "--id", run_id, "--store", db)
    output = ok("rm", "a-1", "a-2", "--store", db)
    assert output.splitlines() == ["deleted run a-1", "deleted run a-2"]
    assert [info.id for info in open_store(db).list()] == ["a-3"]
    clean_error(*tether("rm", "a-3", "nope", "--store", db))
    assert open_store(db).exists("a-3"), "nothing is deleted when one id is bad"


def test_rm_with_filters_asks_first(db: str) -> None:
    for run_id in ("old-1", "old-2"):
        ok("run", "app.py:weather", "Weather?", "--id", run_id, "--store", db)
    _age(db, 10)
    ok("run", "app.py:weather", "Weather?", "--id", "new-1", "--store", db)
    waiting_tree(db)
    output = ok("rm", "--older-than", "7d", "--store", db, input="n\n")
    assert "deletes 2 runs:" in output and "old-1" in output and "old-2" in output and "new-1" not in output
    assert "Delete 2 runs? [y/N]" in output and output.splitlines()[-1] == "nothing deleted"
    assert len(open_store(db).list()) == 5
    code, output = tether("rm", "--older-than", "7d", "--store", db, input="")
    assert code == 1 and "nothing deleted" in output
    assert "dry run: nothing deleted" in ok("rm", "--older-than", "7d", "-n", "--store", db)
    output = ok("rm", "--older-than", "7d", "--store", db, input="y\n")
    assert output.splitlines()[-1] == "deleted 2 runs"
    output = ok("rm", "--status", "waiting", "--yes", "--store", db)
    assert "skipped 1 run that match:" in output and "add --children (-r)" in output
    output = ok("rm", "--status", "waiting", "-r", "-y", "--store", db)
    assert output.splitlines()[-1] == "deleted 2 runs"
    assert [info.id for info in open_store(db).list()] == ["new-1"]
    clean_error(*tether("rm", "--store", db))
    clean_error(*tether("rm", "new-1", "--status", "completed", "--store", db))


def test_cancel_of_a_completed_run_writes_nothing_and_says_so(db: str) -> None:
    ok("run", "app.py:weather", "Weather?", "--id", "done-1", "--store", db)
    before = open_store(db).read("done-1")
    output = ok("cancel", "done-1", "--store", db)
    assert output.strip() == "run done-1 is already completed: nothing to cancel, nothing written"
    store = open_store(db)
    assert store.read("done-1") == before and store.inbox_length("done-1") == 0


# --------------------------------------------------------------------------------------------------
# 6. --version, short flags, AGENT first, --by defaults, --store runs.db, db migrate


def test_version_help_and_short_flags() -> None:
    from tether import __version__

    assert ok("--version").strip() == f"tether {__version__}" == ok("-V").strip()
    assert "Usage:" in ok("-h") and "Usage:" in ok("ls", "-h")
    store_help = " ".join(ok("ls", "--help").split())
    assert "-s, --store URL" in store_help and "postgresql://" in store_help and "runs.db" in store_help
    assert "-n, --limit" in " ".join(ok("ls", "--help").split())
    for command, flags in {
        "approve": ("-b, --by", "-m, --reason"),
        "rm": ("-r, --children", "-y, --yes", "-n, --dry-run"),
        "prune": ("-r, --children", "-n, --dry-run"),
        "show": ("-u, --utc",),
        "worker": ("-c, --concurrency",),
    }.items():
        text = " ".join(ok(command, "--help").split())
        assert all(flag in text for flag in flags), (command, text)
    for command in ("run", "resume", "submit", "worker", "crashtest"):
        usage = " ".join(ok(command, "--help").split())
        assert re.search(rf"Usage: tether {command} \[OPTIONS\] {{?AGENT", usage), usage


def test_by_defaults_to_the_login_name_everywhere(db: str) -> None:
    root, child, _ = waiting_tree(db)
    ok("deny", child, "c3_0", "-m", "not now", "--store", db)
    [decision] = [item for item in open_store(db).read_inbox(child)]
    assert decision.body["by"] == getpass.getuser()
    ok("cancel", root, "--store", db)
    [cancel] = [e for e in open_store(db).read(root) if isinstance(e, j.CancelRequested)]
    assert cancel.by == getpass.getuser()


def test_a_store_path_ending_in_db_is_a_sqlite_file(here: Path) -> None:
    ok("run", "app.py:weather", "Weather?", "--id", "s-1", "--store", "runs.db")
    assert (here / "runs.db").is_file()
    assert open_store("sqlite:///runs.db").load("s-1").status == "completed"
    assert "s-1" in ok("ls", "-s", "runs.db")
    ok("run", "app.py:weather", "Weather?", "--id", "s-2", "--store", "other.sqlite")
    assert (here / "other.sqlite").is_file()
    assert "does not exist yet" in ok("ls", "--store", "missing.db")
    assert not (here / "missing.db").exists()


def test_db_migrate_needs_a_store(here: Path) -> None:
    line = clean_error(*tether("db", "migrate"))
    assert "Fix: tether db migrate --store postgresql://" in line
    assert not (here / ".tether").exists()
    assert "migrates itself whenever it is opened" in ok("db", "migrate", "-s", "runs.db")


# --------------------------------------------------------------------------------------------------
# 7. errors give the command to run


def test_errors_name_the_command_to_run(db: str) -> None:
    root, child, _ = waiting_tree(db)
    ok("run", "app.py:weather", "Weather?", "--id", "w-1", "--store", db)
    line = clean_error(*tether("rm", root, "--store", db))
    assert re.search(r"has 1 subagent run\. Fix: tether rm \S+ --children$", line), line
    line = clean_error(*tether("rm", child, "--store", db))
    assert "--children" in line and "Fix: tether rm " in line
    line = clean_error(*tether("resume", "app.py:boss", child, "--store", db))
    assert f"Fix: tether resume AGENT {root} (the root of its tree)" in line
    line = clean_error(*tether("resume", "app.py:boss", "w-1", "--store", db))
    assert "belongs to agent weather" in line
    assert "Fix: tether resume AGENT w-1 (AGENT: module:attribute of the Agent named weather)" in line
    line = clean_error(*tether("run", "app.py:weather", "again", "--id", "w-1", "--store", db))
    assert f"Fix: tether resume app.py:weather w-1 --store {db}, or pass another --id" in line
    line = clean_error(*tether("approve", "w-1", "c3_0", "--store", db))
    assert "Fix: tether show w-1 lists the calls that wait" in line
    line = clean_error(*tether("fork", child, "--store", db))
    assert "Fix: tether fork " in line
    line = clean_error(*tether("run", "nocolon", "x", "--store", db))
    assert "Fix: name it like myapp.agents:support" in line


# --------------------------------------------------------------------------------------------------
# 8. dates and zones


@pytest.fixture
def paris(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("TZ", "Europe/Paris")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_show_prints_dates_and_the_zone_local_by_default(db: str, paris: None) -> None:
    ok("run", "app.py:weather", "Weather?", "--id", "w-1", "--store", db)
    local = ok("show", "w-1", "--store", db)
    day = re.search(r"^\s+(\d{4}-\d\d-\d\d) (CES?T) \(UTC\+0([12]):00\)$", local, re.M)
    assert day is not None, local
    utc = ok("show", "w-1", "--utc", "--store", db)
    assert re.search(r"^\s+\d{4}-\d\d-\d\d UTC$", utc, re.M), utc
    first_local = re.search(r"^\s+0\s+(\d\d):\d\d:\d\d\.\d{3}\s+run_started", local, re.M)
    first_utc = re.search(r"^\s+0\s+(\d\d):\d\d:\d\d\.\d{3}\s+run_started", utc, re.M)
    assert first_local is not None and first_utc is not None
    assert (int(first_utc.group(1)) + int(day.group(3))) % 24 == int(first_local.group(1))


# --------------------------------------------------------------------------------------------------
# 9. --json and follow


RUN_KEYS = {
    "id", "parent_id", "root_id", "agent", "status", "display_status", "turn", "first_message",
    "created_at", "updated_at", "held_by", "metadata",
}  # fmt: skip
SHOW_KEYS = RUN_KEYS | {
    "answer", "output", "reason", "usage", "next_step", "open_calls", "pending_approvals", "subagent_runs",
    "entries",
}  # fmt: skip


def test_ls_and_show_json_share_one_documented_shape(db: str) -> None:
    root, child, _ = waiting_tree(db)
    listed = json.loads(ok("ls", "--json", "--store", db))
    assert all(set(run) == RUN_KEYS for run in listed)
    shown = json.loads(ok("show", root, "--json", "--store", db))
    assert set(shown) == SHOW_KEYS
    assert {key: shown[key] for key in RUN_KEYS} == listed[0]
    assert [run["id"] for run in shown["subagent_runs"]] == [child]
    assert shown["entries"][0]["kind"] == "run_started" and shown["status"] == "waiting"
    doc = (ROOT / "docs" / "cli.md").read_text()
    assert all(f"`{key}`" in doc for key in SHOW_KEYS), "docs/cli.md documents every key"


def test_follow_prints_a_run_driven_elsewhere_until_it_stops(db: str, here: Path) -> None:
    sys.modules.pop("app", None)
    import app as module  # type: ignore[import-not-found]

    agent = module.slow()
    agent.store = open_store(db)
    driver = threading.Thread(target=agent.run, args=("Look it up",), kwargs={"id": "slow-1"})
    driver.start()
    try:
        assert module.STARTED.wait(30)
        follow = subprocess.Popen(
            [sys.executable, "-m", "tether.cli", "follow", "slow-1", "--json", "--store", db],
            stdout=subprocess.PIPE,
            text=True,
            cwd=here,
        )
        assert follow.stdout is not None
        seen = [json.loads(follow.stdout.readline())]
        while seen[-1]["kind"] != "tool_started":  # the journal so far; the tool is still running
            seen.append(json.loads(follow.stdout.readline()))
        module.RELEASE.set()
        rest, _ = follow.communicate(timeout=60)
    finally:
        module.RELEASE.set()
        driver.join(60)
    sys.modules.pop("app", None)
    seen += [json.loads(line) for line in rest.splitlines()]
    assert follow.returncode == 0
    assert [entry["seq"] for entry in seen] == list(range(len(seen)))  # no gap, no duplicate
    assert seen[-1]["kind"] == "run_stopped" and seen[-1]["status"] == "completed"
    assert [e.kind for e in open_store(db).read("slow-1")] == [entry["kind"] for entry in seen]
    text = ok("follow", "slow-1", "--store", db)
    assert text.splitlines()[-1] == "run slow-1 is completed: Found it."


def test_follow_of_a_waiting_run_says_how_to_decide_and_ctrl_c_stops_following(db: str, here: Path) -> None:
    import signal

    root, _, _ = waiting_tree(db)
    follow = subprocess.Popen(
        [sys.executable, "-m", "tether.cli", "follow", root, "--store", db],
        stdout=subprocess.PIPE,
        text=True,
        cwd=here,
    )
    assert follow.stdout is not None
    lines = [follow.stdout.readline()]
    while "deny:" not in lines[-1] and lines[-1]:  # the journal, then how to decide, then it waits on
        lines.append(follow.stdout.readline())
    follow.send_signal(signal.SIGINT)
    rest, _ = follow.communicate(timeout=60)
    output = "".join(lines) + rest
    assert follow.returncode == 130, output
    assert "it waits for a decision, and goes on once one is made:" in output
    assert re.search(r"approve: tether approve \S+ c3_0", output)
    assert output.splitlines()[-1].startswith("stopped following run")
    assert open_store(db).load(root).status == "waiting"


# --------------------------------------------------------------------------------------------------
# 10. README: the command lines it lists exist, install lines that work from a clone, docs in the repo


def test_readme_command_line_section_is_true() -> None:
    text = (ROOT / "README.md").read_text()
    assert "pip install -e '.[anthropic]'" in text
    assert "pip install 'tether[" not in text
    assert "../shared" not in text
    for link in re.findall(r"\]\((docs/[^)]+)\)", text):
        assert (ROOT / link).exists(), link
    section = text[text.index("## The command line") :]
    section = section[: section.index("\n## ", 3)]
    commands = set(re.findall(r"`tether ([a-z]+)", section))
    assert {"ls", "show", "follow", "run", "resume", "approve", "deny", "cancel", "rm", "prune"} <= commands
    for command in commands:
        assert "Usage:" in ok(command, "--help"), command


# --------------------------------------------------------------------------------------------------
# Short ids: the rules, and a store too big to read whole


def test_short_forms_are_the_shortest_unambiguous_beginnings() -> None:
    from tether._cli.ids import Names, pick

    a, b = "01a2310515525a174bff6c041421a886", "01a2310515995a174bff6c041421a886"
    kid = f"{a}-d12ef123224f0a17d813c714"
    names = Names([a, b, kid, f"{a}-d1aa00000000000000000000", "nightly-report"], complete=True)
    assert names.short(a) == "01a23105155" and names.short(b) == "01a23105159"
    assert names.short(kid) == "01a23105155-d12e"  # its root's short form, then its own part
    assert names.short("nightly-report") == "nightly-report"  # ids people chose stay whole
    assert Names([a], complete=True).short(a) == "01a2310"  # git's 7 at least
    assert Names([a], complete=False).short(a) == "01a231051552"  # the creation millisecond
    assert pick("01a2310515", [a, b, kid]) == [a, b]  # ambiguous: two roots
    assert pick("01a23105155", [a, kid]) == [a]  # a root over its subagent runs
    assert pick(kid, [kid]) == [kid]


def test_ls_of_a_store_too_big_to_read_whole(db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from tether._cli import ids

    root, child, _ = waiting_tree(db)
    for _ in range(3):
        ok("run", "app.py:weather", "Weather?", "--store", db)
    monkeypatch.setattr(ids, "ALL_KNOWN", 2)
    output = ok("ls", "--store", db, "-n", "10")
    rows = output.splitlines()[1:]
    assert len(rows) == 5 and rows[-2].startswith(root[:12]) and rows[-1].startswith(f"└ {root[:12]}-")
    assert all(len(row.split()[0 if not row.startswith("└") else 1].split("-")[0]) >= 12 for row in rows)
    listed = json.loads(ok("ls", "--store", db, "--json", "--status", "waiting"))
    assert [run["id"] for run in listed] == [root, child]
