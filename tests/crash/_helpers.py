"""Helpers for the crash tests: run the scenario script in a real process and read what it left."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from tether.testing import ExecutionLog

SCRIPT = str(Path(__file__).with_name("_scenario.py"))


def env_with(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TETHER_FAILPOINT"}
    env.update(extra)
    return env


def run(
    mode: str,
    store_dir: Path,
    run_id: str,
    side: Path,
    scenario: str = "basic",
    *,
    timeout: float = 60,
    **env: str,
) -> subprocess.CompletedProcess[bytes]:
    """Run the scenario script to its end and return the finished process."""
    return subprocess.run(
        [sys.executable, SCRIPT, mode, str(store_dir), run_id, str(side), scenario],
        env=env_with(**env),
        capture_output=True,
        timeout=timeout,
        check=False,
    )


def spawn(
    mode: str, store_dir: Path, run_id: str, side: Path, scenario: str = "basic", **env: str
) -> subprocess.Popen[bytes]:
    """Start the scenario script and return at once."""
    return subprocess.Popen(
        [sys.executable, SCRIPT, mode, str(store_dir), run_id, str(side), scenario],
        env=env_with(**env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def killed(proc: subprocess.CompletedProcess[bytes] | subprocess.Popen[bytes]) -> bool:
    return proc.returncode == -9


def ok(proc: subprocess.CompletedProcess[bytes]) -> None:
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stderr.decode(errors='replace')[-3000:]}"


def out(side: Path) -> dict[str, Any]:
    """What the last process that ended normally reported."""
    return orjson.loads(Path(str(side) + ".out.json").read_bytes())


def starts(side: Path, **match: Any) -> list[dict[str, Any]]:
    """The side file's execution records (event ``start``) matching ``match``."""
    return [
        r
        for r in ExecutionLog(side).records()
        if r.get("event") == "start" and all(r.get(k) == v for k, v in match.items())
    ]


def wait_for(predicate: Callable[[], Any], timeout: float = 20, what: str = "a condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every journal and inbox file of the store folder and its bytes.

    Lock files are left out: a take records its owner there, which writes nothing of the run.
    """
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file() and p.suffix != ".lock"}


def kinds(state: Any) -> list[str]:
    return [e.kind for e in state.history]


def finished(state: Any) -> dict[str, list[Any]]:
    """Each call's tool_finished entries (a list, so a second result would show)."""
    out: dict[str, list[Any]] = {}
    for e in state.history:
        if e.kind == "tool_finished":
            out.setdefault(e.call_id, []).append(e)
    return out


def text(entry: Any) -> str:
    return "".join(b.get("text", "") for b in entry.content if b.get("type") == "text")
