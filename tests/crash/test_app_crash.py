"""Application integration across real processes (DESIGN 18): deps given again on resume and never
journaled, approval conditions never evaluated again after a crash, edited arguments surviving a crash
between the decision and the start, and ``if_exists="resume"`` racing from two processes.

Each process is ``_app_scenario.py``; "ran once" and "evaluated once" are judged from the side file its
tools and conditions write, never from the journal alone.
"""

from __future__ import annotations

import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from _helpers import env_with

from tether import open_store
from tether.testing import ExecutionLog

pytestmark = pytest.mark.crash

SCRIPT = str(Path(__file__).with_name("_app_scenario.py"))


def _args(mode: str, url: str, run_id: str, side: Path, scenario: str, arg: str) -> list[str]:
    return [sys.executable, SCRIPT, mode, url, run_id, str(side), scenario, arg]


def scene(mode: str, url: str, run_id: str, side: Path, scenario: str, arg: str = "", **env: str) -> int:
    """Run the scenario script to its end; its exit code (-9 when a failpoint killed it)."""
    proc = subprocess.run(
        _args(mode, url, run_id, side, scenario, arg),
        env=env_with(**env),
        capture_output=True,
        timeout=120,
        check=False,
    )
    if proc.returncode not in (0, -9):
        raise AssertionError(f"exit {proc.returncode}\n{proc.stderr.decode(errors='replace')[-3000:]}")
    return proc.returncode


def reports(side: Path) -> list[dict[str, Any]]:
    """What each process that ended normally reported."""
    return [orjson.loads(p.read_bytes()) for p in sorted(side.parent.glob(side.name + ".*.out.json"))]


def records(side: Path, **match: Any) -> list[dict[str, Any]]:
    return [r for r in ExecutionLog(side).records() if all(r.get(k) == v for k, v in match.items())]


def stored_bytes(folder: Path) -> bytes:
    """Every byte the store wrote (journals, inboxes, listing lines; SQLite's file and WAL)."""
    return b"".join(p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file())


@pytest.fixture(params=["file", "sqlite"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    folder = tmp_path / "store"
    folder.mkdir()
    return f"file:{folder}" if request.param == "file" else f"sqlite:///{folder}/runs.db"


def _folder(url: str) -> Path:
    path = url.removeprefix("sqlite:///").removeprefix("file:")
    return Path(path).parent if url.startswith("sqlite") else Path(path)


def test_deps_are_given_again_on_resume_and_never_journaled(url: str, tmp_path: Path) -> None:
    side = tmp_path / "side.jsonl"
    first, second = f"token-{secrets.token_hex(8)}", f"token-{secrets.token_hex(8)}"
    code = scene("start", url, "d1", side, "deps", first, TETHER_FAILPOINT="after_append:tool_finished")
    assert code == -9  # killed once the first lookup's result was durable
    assert scene("resume", url, "d1", side, "deps", second) == 0
    looked = {r["order"]: r for r in records(side, event="start", tool="lookup")}
    assert looked["o1"]["token"] == first and looked["o2"]["token"] == second  # each drive's own deps
    assert {r["user"] for r in looked.values()} == {"u42"}  # ctx.metadata, from the journal
    (report,) = reports(side)
    assert report["status"] == "completed"
    written = stored_bytes(_folder(url))
    assert first.encode() not in written and second.encode() not in written  # deps are never journaled
    assert b"u42" in written  # metadata is
    store = open_store(url)
    state = store.load("d1")
    assert state.metadata == {"user": "u42"}
    assert [i.id for i in store.list(metadata={"user": "u42"})] == ["d1"]
    store.close()


def test_an_approval_condition_is_not_evaluated_again_after_a_crash(url: str, tmp_path: Path) -> None:
    side = tmp_path / "side.jsonl"
    # Killed right after the plan's append (the reply, the ask for 500 and the start of 50), before any tool.
    assert (
        scene("start", url, "c1", side, "conditions", "a", TETHER_FAILPOINT="after_append:model_replied")
        == -9
    )
    evaluated = records(side, event="condition")
    assert sorted(r["amount"] for r in evaluated) == [50, 500]
    assert {r["currency"] for r in evaluated} == {"EUR"}  # validated arguments, defaults filled in
    assert scene("resume", url, "c1", side, "conditions", "b") == 0
    (report,) = reports(side)
    assert report["status"] == "waiting" and len(report["pending"]) == 1
    assert [r["amount"] for r in records(side, event="start", tool="refund")] == [50]  # retried, idempotent
    assert scene("approve", url, "c1", side, "conditions") == 0  # as it was asked: no edited arguments
    assert scene("resume", url, "c1", side, "conditions", "c") == 0
    assert [r["amount"] for r in records(side, event="start", tool="refund")] == [50, 500]
    assert len(records(side, event="condition")) == 2  # never again: not by recovery, not by the approval
    assert {r["pid"] for r in records(side, event="condition")} == {evaluated[0]["pid"]}
    store = open_store(url)
    assert store.load("c1").status == "completed"
    store.close()


@pytest.mark.parametrize("failpoint", ["before_append:tool_started", "after_append:tool_started"])
def test_edited_arguments_survive_a_crash_between_the_decision_and_the_start(
    url: str, tmp_path: Path, failpoint: str
) -> None:
    side = tmp_path / "side.jsonl"
    assert scene("start", url, "e1", side, "edit", "a") == 0
    (report,) = reports(side)
    assert report["status"] == "waiting"
    # A short-lived taker without the agent journals the decision and its edited arguments alone.
    assert scene("approve", url, "e1", side, "edit", '{"amount": 90}') == 0
    store = open_store(url)
    decided = [e for e in store.load("e1").history if e.kind == "approval_decided"]
    assert [(e.by, e.args) for e in decided] == [("alice", {"amount": 90})]  # type: ignore[attr-defined]
    store.close()
    assert scene("resume", url, "e1", side, "edit", "b", TETHER_FAILPOINT=failpoint) == -9
    assert scene("resume", url, "e1", side, "edit", "c") == 0
    runs = records(side, event="start", tool="refund")
    assert [(r["amount"], r["token"]) for r in runs] == [(90, "c")]  # once, with the edited arguments
    done = [r for r in reports(side) if r["status"] == "completed"]
    assert len(done) == 1
    answer = done[0]["answer"]
    assert "alice approved this call with changed arguments (reason: the customer paid 90)" in answer
    assert 'You asked for {"amount":500}; alice changed them to {"amount":90}' in answer
    assert answer.endswith("refunded 90 EUR")


def test_if_exists_resume_racing_from_two_processes_ends_with_one_run(url: str, tmp_path: Path) -> None:
    side = tmp_path / "side.jsonl"
    procs = [
        subprocess.Popen(
            _args("race", url, "order-42", side, "race", token),
            env=env_with(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for token in ("p1", "p2")
    ]
    Path(str(side) + ".go").touch()  # both start the run at once
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err.decode(errors="replace")[-3000:]
    both = reports(side)
    assert len(both) == 2
    assert {r["id"] for r in both} == {"order-42"}
    assert {(r["status"], r["answer"]) for r in both} == {("completed", "done:order o1 is paid")}
    assert sorted(len(r["requests"]) for r in both) == [0, 2]  # one drove it; the other got it as it was
    assert len(records(side, event="start", tool="lookup")) == 1
    store = open_store(url)
    state = store.load("order-42")
    assert [e.kind for e in state.history].count("run_started") == 1
    assert [i.id for i in store.list()] == ["order-42"]
    store.close()
