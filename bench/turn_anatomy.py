"""What one turn costs the event loop: loop iterations, tasks, timers, waits and thread hand-offs.

Each turn is one model reply with one tool call (a sync tool) and its result, as in bench/turns.py. The
script drives a run of ``--few`` and one of ``--many`` turns with counters wrapped around asyncio's and
tether's own machinery, and prints the difference divided by the extra turns (start-up excluded):

- loop iterations: ``BaseEventLoop._run_once`` calls (each is one ``select`` and a round of callbacks);
- tasks: ``create_task`` / ``ensure_future`` of a coroutine;
- timers: ``call_at`` / ``call_later`` handles (``asyncio.wait`` with a timeout makes one);
- waits: ``asyncio.wait`` and ``asyncio.wait_for`` calls;
- to threads: jobs handed to a tether thread (``Threads.submit``, ``then``);
- wake-ups: ``call_soon_threadsafe`` (a thread waking the loop with a result).

Counts of a deterministic path repeat exactly run to run; loop iterations can differ by a fraction when
a thread's result lands in the same ``select`` as another. With ``--tree`` (repeatable) each source tree
runs in a subprocess of its own, to compare before and after:

    python bench/turn_anatomy.py                                    # this checkout, FileStore and SQLite
    python bench/turn_anatomy.py --tree /tmp/before/src --tree src  # before and after, same run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

COUNTS: Counter[str] = Counter()


def _count(owner: Any, name: str, key: str) -> None:
    real = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        COUNTS[key] += 1
        return real(*args, **kwargs)

    setattr(owner, name, wrapper)


def install() -> None:
    """Wrap the counters around asyncio and tether's threads (before any loop exists)."""
    import asyncio.base_events as base_events
    import asyncio.tasks as tasks

    from tether import _threads

    _count(base_events.BaseEventLoop, "_run_once", "loop iterations")
    _count(base_events.BaseEventLoop, "create_task", "tasks")
    _count(base_events.BaseEventLoop, "call_at", "timers")
    _count(base_events.BaseEventLoop, "call_soon_threadsafe", "wake-ups")
    for module in (asyncio, tasks):
        _count(module, "wait", "waits")
        _count(module, "wait_for", "waits")
    _count(_threads.Threads, "submit", "to threads")
    _count(_threads.Threads, "then", "to threads")


def drive(store_kind: str, turns: int) -> dict[str, int]:
    """The counts of one run of ``turns`` one-call turns on a fresh store in /dev/shm."""
    from tether import Agent, FileStore, SQLiteStore, tool
    from tether.testing import ScriptedModel, call

    @tool(effect="read_only")
    def look(i: int) -> str:
        """Look.

        Args:
            i: The number.
        """
        return f"result {i}"

    folder = tempfile.mkdtemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    try:
        store = FileStore(folder) if store_kind == "file" else SQLiteStore(Path(folder) / "runs.db")
        script: list[object] = [call("look", i=i) for i in range(turns)]
        script.append("done")
        agent = Agent(ScriptedModel(script), tools=[look], store=store, max_turns=turns + 5)
        COUNTS.clear()
        state = agent.run("go")
        assert state.status == "completed", state.status
        return dict(COUNTS)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


KEYS = ("loop iterations", "tasks", "timers", "waits", "to threads", "wake-ups")


def per_turn(store_kind: str, few: int, many: int) -> dict[str, float]:
    """Counts per turn: the difference between a run of ``many`` and one of ``few`` turns."""
    drive(store_kind, 3)  # warm-up: imports, thread start-up
    small, large = drive(store_kind, few), drive(store_kind, many)
    return {key: (large.get(key, 0) - small.get(key, 0)) / (many - few) for key in KEYS}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tree", action="append", help="a src/ folder holding tether (repeat to compare)")
    parser.add_argument("--stores", default="file,sqlite")
    parser.add_argument("--few", type=int, default=20)
    parser.add_argument("--many", type=int, default=220)
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # one tree, for --tree
    args = parser.parse_args()
    stores = args.stores.split(",")
    if args.json:
        install()
        print(json.dumps({kind: per_turn(kind, args.few, args.many) for kind in stores}))
        return 0
    rows: list[tuple[str, str, dict[str, float]]] = []
    for tree in args.tree or [str(Path(__file__).resolve().parent.parent / "src")]:
        env = {**os.environ, "PYTHONPATH": str(Path(tree).resolve())}
        command = [sys.executable, __file__, "--json", "--stores", args.stores]
        command += ["--few", str(args.few), "--many", str(args.many)]
        out = subprocess.run(command, capture_output=True, text=True, env=env, cwd="/", check=False)
        if out.returncode != 0:
            raise SystemExit(f"the run with {tree} failed:\n{out.stderr[-3000:]}")
        for kind, counts in json.loads(out.stdout).items():
            rows.append((str(Path(tree).resolve()), kind, counts))
    print(f"python {sys.version.split()[0]}; per turn (one sync tool call), {args.few} and {args.many} turns")
    print(f"{'tree':44} {'store':6}" + "".join(f" {key:>15}" for key in KEYS))
    for tree, kind, counts in rows:
        print(f"{tree[-44:]:44} {kind:6}" + "".join(f" {counts[key]:15.2f}" for key in KEYS))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
