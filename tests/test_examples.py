"""The seed documents' examples, ported to tether in examples/, run as a user would run them."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    for script in EXAMPLES.glob("*.py"):
        shutil.copy(script, tmp_path / script.name)
    return tmp_path


def run(workdir: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if k != "TETHER_FAILPOINT"}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, *args], cwd=workdir, env=full_env, capture_output=True, text=True, timeout=60
    )


def test_weather_killed_after_tool_result_then_resumed(workdir: Path) -> None:
    crashed = run(workdir, "weather.py", env={"TETHER_FAILPOINT": "after_append:tool_finished"})
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    assert "RUN_ID london-weather" in crashed.stdout
    resumed = run(workdir, "resume.py", "london-weather")
    assert resumed.returncode == 0, resumed.stderr
    assert "status: completed" in resumed.stdout
    assert "sunny with a temperature of 22°C" in resumed.stdout
    assert (workdir / "weather-calls.log").read_text().count("London") == 1  # the tool did not run again


def test_resume_of_a_finished_run_runs_nothing(workdir: Path) -> None:
    first = run(workdir, "weather.py")
    assert first.returncode == 0, first.stderr
    journal = workdir / "runs" / "london-weather.jsonl"
    before = journal.read_bytes()
    again = run(workdir, "resume.py", "london-weather")
    assert again.returncode == 0, again.stderr
    assert "status: completed" in again.stdout
    assert journal.read_bytes() == before
    assert (workdir / "weather-calls.log").read_text().count("London") == 1


def test_sigterm_stops_cleanly_and_the_run_resumes(workdir: Path) -> None:
    env = {**os.environ, "COLLECT_SECONDS": "30"}
    env.pop("TETHER_FAILPOINT", None)
    proc = subprocess.Popen(
        [sys.executable, "sigterm.py"], cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    journal = workdir / ".agent-runs" / "nightly-report.jsonl"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if journal.exists() and b'"tool_started"' in journal.read_bytes():
            break
        time.sleep(0.05)
    else:
        proc.kill()
        pytest.fail("the tool never started")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 143
    lines = journal.read_bytes().splitlines()
    assert b'"run_released"' in [line for line in lines if b'"kind"' in line][-1]
    finished = run(workdir, "sigterm.py", env={"COLLECT_SECONDS": "0"})
    assert finished.returncode == 0, finished.stderr
    assert "status: completed" in finished.stdout
    assert "Nightly report" in finished.stdout


def test_list_and_delete(workdir: Path) -> None:
    out = run(workdir, "list_and_delete.py")
    assert out.returncode == 0, out.stderr
    assert "review-pr-43 completed 'Review PR 43'" in out.stdout
    assert "top-level runs: 2" in out.stdout
    assert "after delete: ['review-pr-43']" in out.stdout


def test_stream_yields_entries_and_text(workdir: Path) -> None:
    out = run(workdir, "stream.py")
    assert out.returncode == 0, out.stderr
    assert "entry: 0 run_started" in out.stdout  # the entries that created the run come first
    assert "tool_finished" in out.stdout
    assert out.stdout.rstrip().endswith("run_stopped")
    assert "text: 'It is cl'" in out.stdout


def test_refund_app_starts_runs_per_request_idempotently_and_a_worker_finishes_them(workdir: Path) -> None:
    out = run(workdir, "refund_app.py")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "POST /refunds o1: completed {'order': 'o1', 'refunded': 40}" in lines
    assert "retried o1: refund-o1 completed refunds made: 1" in lines  # the same run, refunded once
    assert "POST /refunds o2: waiting ['refund']" in lines  # above 100: a person decides
    assert "submitted o3: submitted" in lines
    assert (
        "runs of u42: [{'id': 'refund-o1', 'status': 'completed'}, {'id': 'refund-o2', 'status': 'completed'}]"
        in lines
    )
    assert "runs of u7: [{'id': 'refund-o3', 'status': 'completed'}]" in lines
    assert "refund-o2: completed Refund order='o2' refunded=200" in lines  # the edited amount, typed
    assert "refunds: [('o1', 40), ('o2', 200), ('o3', 30)]" in lines
