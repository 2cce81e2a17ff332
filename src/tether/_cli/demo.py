"""``tether demo``: a weather agent is killed with SIGKILL mid-run, then resumed in a new process.

The parent (``run_demo``) starts the run in a child process that the store kills right after the tool's
result is durable (the ``TETHER_FAILPOINT`` crash hook), shows the journal as the dead process left it,
resumes the run in a second child process, and checks in a side file, outside the store, that the tool
ran exactly once. The children are this module run as a script::

    python -m tether._cli.demo start|resume STORE_URL RUN_ID SIDE_FILE
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from .._timeline import Timeline, display_status, open_state_lines, truncate
from ..agent import Agent
from ..state import State
from ..stores import Store, open_store
from ..testing import ExecutionLog, ScriptedModel, call
from ..tools import ToolContext, tool

__all__ = ["LOG_ENV", "Printer", "build_agent", "get_weather", "main", "run_demo"]

LOG_ENV = "TETHER_DEMO_LOG"
"""The environment variable naming the side file where ``get_weather`` records each execution."""

_DATE_LINE = re.compile(r"\s+\d{4}-\d\d-\d\d ")

QUESTION = "What is the weather in London?"
ANSWER = "It is sunny and 22C in London."
FAILPOINT = "after_append:tool_finished"
"""Kill the first child right after the append that makes ``get_weather``'s result durable."""


class Printer(Protocol):
    """Prints one line with a style: ``""``, ``"heading"``, ``"ok"``, ``"error"`` or ``"dim"``."""

    def __call__(self, line: str, style: str = "") -> None:
        """Print ``line``."""


@tool
def get_weather(city: str, ctx: ToolContext) -> str:
    """Get the current weather for a city.

    Args:
        city: The city to look up.
        ctx: Injected by tether (never shown to the model).
    """
    path = os.environ.get(LOG_ENV)
    if path:
        ExecutionLog(path).record(run_id=ctx.run_id, call_id=ctx.call_id, tool="get_weather", city=city)
    return f"Sunny, 22C in {city}"


def build_agent(store: Store) -> Agent:
    """The demo's weather agent: a scripted model that calls ``get_weather`` once, then answers."""
    model = ScriptedModel([call("get_weather", city="London"), ANSWER])
    return Agent(
        model,
        name="weather",
        instructions="You are a helpful weather assistant.",
        tools=[get_weather],
        store=store,
        poll_interval=0.2,
    )


# --------------------------------------------------------------------------------------------------
# The parent: what `tether demo` shows


def _plain(line: str, style: str = "") -> None:
    print(line)


def _child(
    command: str, store_url: str, run_id: str, log_path: Path, failpoint: str | None
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop("TETHER_FAILPOINT", None)
    if failpoint:
        env["TETHER_FAILPOINT"] = failpoint
    env[LOG_ENV] = str(log_path)
    argv = [sys.executable, "-m", "tether._cli.demo", command, store_url, run_id, str(log_path)]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)


def _exit_text(returncode: int) -> str:
    if returncode == -9:
        return "killed by SIGKILL (returncode -9)"
    if returncode < 0:
        return f"killed by signal {-returncode} (returncode {returncode})"
    return f"exited with code {returncode}"


def _child_failed(out: Printer, what: str, result: subprocess.CompletedProcess[str]) -> int:
    out(f"   FAILED: the {what} child {_exit_text(result.returncode)}", "error")
    for line in (result.stderr or result.stdout or "").strip().splitlines()[-12:]:
        out(f"   | {line}", "dim")
    return 1


def _ran(log: ExecutionLog, run_id: str) -> tuple[int, list[int]]:
    records = [r for r in log.records() if r.get("run_id") == run_id and r.get("tool") == "get_weather"]
    return len(records), [int(r.get("pid", 0)) for r in records]


def _times(n: int) -> str:
    return "1 time" if n == 1 else f"{n} times"


def run_demo(store_url: str | None = None, out: Printer = _plain) -> int:
    """Run the demo and print what happens; return the exit code (0: the tool ran once and the run completed).

    Args:
        store_url: where the run is kept; None makes a SQLite file in a fresh temporary folder (deleted at
            the end).
        out: prints one line with a style (see ``Printer``).

    Raises:
        ValueError: ``store_url`` is not a store both child processes can reach (``memory:``), or is bad.
    """
    started = time.monotonic()
    kept = store_url is not None
    if store_url is not None and store_url.strip().startswith("memory:"):
        raise ValueError(
            "the demo runs in three processes, and a memory: store lives in one. Fix: pass "
            "--store sqlite:///PATH or --store file:PATH, or leave --store out for a temporary SQLite file"
        )
    workdir = Path(tempfile.mkdtemp(prefix="tether-demo-"))
    store: Store | None = None
    try:
        url = store_url if store_url is not None else f"sqlite:///{workdir / 'runs.db'}"
        store = open_store(url)
        run_id = f"demo-{secrets.token_hex(4)}"
        code = _steps(store, url, run_id, workdir / "get_weather.log", out, started)
        if kept:
            out(f"Look at it again: tether show {run_id} --store {url}", "dim")
        else:
            out("To keep the run for tether show: tether demo --store demo.db", "dim")
        return code
    finally:
        if store is not None:
            store.close()
        shutil.rmtree(workdir, ignore_errors=True)


def _steps(store: Store, store_url: str, run_id: str, log_path: Path, out: Printer, started: float) -> int:
    log = ExecutionLog(log_path)
    out("tether demo: a run is killed mid-way, then resumed in another process.", "heading")
    out("  agent  weather (a scripted model; one tool, get_weather)", "dim")
    out(f"  asks   {QUESTION}", "dim")
    out(f"  store  {store_url}", "dim")
    out(f"  run    {run_id}", "dim")
    out("")

    out("1. Start the run in a child process; it dies once the tool's result is saved.", "heading")
    out(f"   $ TETHER_FAILPOINT={FAILPOINT} python -m tether._cli.demo start", "dim")
    first = _child("start", store_url, run_id, log_path, FAILPOINT)
    if first.returncode != -9:
        return _child_failed(out, "first", first)
    ran, pids = _ran(log, run_id)
    out(f"   the child was {_exit_text(first.returncode)}")
    out(f"   get_weather ran {_times(ran)} (pid {_pids(pids)})")
    out("")

    out("2. The journal as the killed process left it:", "heading")
    state = store.load(run_id)
    _show_journal(store, state, out)
    for line in open_state_lines(state, indent="   "):
        out(line)
    out("")

    out("3. Resume it in a new process: agent.resume(run_id).", "heading")
    out("   $ python -m tether._cli.demo resume", "dim")
    second = _child("resume", store_url, run_id, log_path, None)
    if second.returncode != 0:
        return _child_failed(out, "resuming", second)
    out(f"   the child {_exit_text(second.returncode)}")
    out("")

    out("4. The journal after the resume:", "heading")
    final = store.load(run_id)
    _show_journal(store, final, out, after=len(state.history) - 1)
    out("")
    ran, pids = _ran(log, run_id)
    ok = ran == 1 and final.status == "completed"
    out(f"   answer: {truncate(final.answer or '(none)')}")
    out(f"   the side file outside the store says get_weather ran {_times(ran)} (pid {_pids(pids)}):")
    out("   the resume reused the saved result instead of calling the tool again.")
    out("")
    elapsed = time.monotonic() - started
    if ok:
        out(f"OK: run {run_id} is completed and get_weather ran 1 time ({elapsed:.1f}s).", "ok")
        return 0
    out(
        f"FAILED: run {run_id} is {final.status} and get_weather ran {_times(ran)}; expected completed, 1.",
        "error",
    )
    return 1


def _pids(pids: Sequence[int]) -> str:
    return ", ".join(str(p) for p in pids) or "-"


def _show_journal(store: Store, state: State, out: Printer, after: int = -1) -> None:
    timeline = Timeline(indent="   ", kind_width=max(len(entry.kind) for entry in state.history))
    out(timeline.header(), "dim")
    if after >= 0:
        out(f"   {'...':>3}  (seq 0 to {after} as above)", "dim")
    for entry in state.history:
        lines = timeline.lines(entry)  # every entry, so the date line comes where it is due
        if entry.seq > after:
            for line in lines:
                out(line, "dim" if _DATE_LINE.match(line) else "")
    status = display_status(state.status, store.holder(state.id) is not None)
    out(f"   status: {status}")


# --------------------------------------------------------------------------------------------------
# The children


def main(argv: Sequence[str] | None = None) -> int:
    """The child processes: ``start|resume STORE_URL RUN_ID SIDE_FILE``; returns the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 4 or args[0] not in ("start", "resume"):
        print("usage: python -m tether._cli.demo start|resume STORE_URL RUN_ID SIDE_FILE", file=sys.stderr)
        return 2
    command, store_url, run_id, log_path = args
    os.environ[LOG_ENV] = log_path
    agent = build_agent(open_store(store_url))
    state = agent.run(QUESTION, id=run_id) if command == "start" else agent.resume(run_id)
    print(f"{command}: run {state.id} is {state.status}")
    return 0 if state.status == "completed" else 1


if __name__ == "__main__":
    sys.exit(main())
