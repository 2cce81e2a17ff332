"""Ctrl+C and SIGTERM in a real process: in-flight unsafe calls are aborted, the run is released and stays
resumable (DESIGN 5.4)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _helpers import finished, kinds, ok, out, run, spawn, starts, text, wait_for

from tether import FileStore
from tether.testing import ExecutionLog

pytestmark = pytest.mark.crash


@pytest.mark.slow
def test_ctrl_c_during_a_sync_unsafe_tool_aborts_it_and_drops_the_late_result(tmp_path: Path) -> None:
    runs, side = tmp_path / "runs", tmp_path / "side.jsonl"
    child = spawn("start", runs, "int", side, "sigint")
    try:
        wait_for(lambda: starts(side, tool="nap"), what="the nap tool to start")
        child.send_signal(signal.SIGINT)
        child.wait(30)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == 130, child.stderr.read().decode()[-3000:]
    assert out(side).get("interrupted") is True
    ends = [r for r in ExecutionLog(side).records() if r.get("event") == "end"]
    assert len(ends) == 1, "the tool finished its second after the interrupt, in the still-living process"
    state = FileStore(runs).load("int")
    (result,) = finished(state)["c3_0"]  # one result only: the late one was dropped
    assert result.outcome == "aborted", "Ctrl+C is an interrupt, never a cancel"
    assert "may or may not" in text(result)
    assert kinds(state)[-1] == "run_released"
    assert "cancelled" not in [e.outcome for es in finished(state).values() for e in es]
    assert state.status == "running"
    ok(run("resume", runs, "int", side, "sigint"))
    assert out(side)["status"] == "completed"
    assert len(starts(side, tool="nap")) == 1, "an aborted unsafe call is not run again"


@pytest.mark.slow
def test_sigterm_with_handle_sigterm_exits_143_after_releasing_the_run(tmp_path: Path) -> None:
    runs, side = tmp_path / "runs", tmp_path / "side.jsonl"
    child = spawn("start", runs, "term", side, "sigterm")
    try:
        wait_for(lambda: len(starts(side)) == 2, what="both hold tools to start")
        child.send_signal(signal.SIGTERM)
        child.wait(30)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == 143, child.stderr.read().decode()[-3000:]
    store = FileStore(runs)
    state = store.load("term")
    assert kinds(state)[-1] == "run_released"
    results = finished(state)
    assert [e.outcome for e in results["c3_0"]] == ["aborted"], "the unsafe call in flight is aborted"
    assert "c3_1" not in results, "the idempotent call in flight is left open for a resume"
    assert [(c.call_id, c.action) for c in state.open_calls] == [("c3_1", "retry")]
    assert store.holder("term") is None
    Path(str(side) + ".release").touch()
    ok(run("resume", runs, "term", side, "sigterm"))
    assert out(side)["status"] == "completed"
    assert [r["attempt"] for r in starts(side, call_id="c3_0")] == [1]
    again = starts(side, call_id="c3_1")
    assert [r["attempt"] for r in again] == [1, 2] and len({r["key"] for r in again}) == 1
    first, second = out(side)["answer"].removeprefix("answer: ").split(" | ")
    assert first.startswith("aborted:") and "may or may not" in first
    assert second == "done:held on attempt 2"


def test_sigterm_during_a_model_request_writes_nothing_for_it(tmp_path: Path) -> None:
    runs, side = tmp_path / "runs", tmp_path / "side.jsonl"
    marker = Path(str(side) + ".model_marker")
    child = spawn("start", runs, "hang", side, "model_hang")
    try:
        wait_for(marker.exists, what="the second model request")
        child.send_signal(signal.SIGTERM)
        child.wait(30)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == 143, child.stderr.read().decode()[-3000:]
    state = FileStore(runs).load("hang")
    assert kinds(state)[-2:] == ["tool_finished", "run_released"]
    assert state.requests == 1, "no model_replied or model_failed for the interrupted request"
    ok(run("resume", runs, "hang", side, "model_hang"))
    report = out(side)
    assert [r["index"] for r in report["requests"]] == [1]
    assert report["answer"] == "answer: done:3"


def test_sigterm_with_handle_sigterm_and_no_run_in_progress_still_exits_143(tmp_path: Path) -> None:
    code = "import sys, time, tether\ntether.handle_sigterm()\nprint('ready', flush=True)\ntime.sleep(2)\n"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.readline() == b"ready\n"
        child.send_signal(signal.SIGTERM)
        child.wait(30)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == 143


@pytest.mark.slow
def test_the_seeds_sigterm_recipe_closes_every_run_as_ctrl_c_does(tmp_path: Path) -> None:
    """A handler raising ``SystemExit(128 + signum)`` (the seed's recipe), SIGTERM sent mid-tool 20 times."""
    runs = tmp_path / "runs"
    for attempt in range(20):
        run_id, side = f"seed{attempt}", tmp_path / f"side{attempt}.jsonl"
        child = spawn("start", runs, run_id, side, "seed_sigterm")
        try:
            wait_for(lambda side=side: len(starts(side)) == 2, what="both hold tools to start")
            time.sleep((attempt % 10) * 0.003)  # a varied point while both tools run
            child.send_signal(signal.SIGTERM)
            child.wait(30)
        finally:
            if child.poll() is None:
                child.kill()
        assert child.returncode == 143, child.stderr.read().decode()[-3000:]
        store = FileStore(runs)
        state = store.load(run_id)
        assert kinds(state)[-1] == "run_released", f"try {attempt}: {kinds(state)[-4:]}"
        results = finished(state)
        assert [e.outcome for e in results["c3_0"]] == ["aborted"], f"try {attempt}: unsafe call not aborted"
        assert "c3_1" not in results, "the idempotent call in flight is left open for a resume"
        assert store.holder(run_id) is None
