"""Instructions per turn (valgrind's callgrind), for comparing two source trees on a busy machine.

Seconds per turn move with the load of the machine and the disk; instruction counts do not: callgrind
gives the same count for the same code and input within a fraction of a percent. This runs N one-call
turns on a FileStore (``--store sqlite``: an SQLiteStore; ``memory``: a MemoryStore) in /dev/shm (no disk)
once with few and once with many turns, for each tree given, and prints the difference divided by the
extra turns: the instructions one turn costs, start-up excluded.

    python bench/turn_instructions.py                                  # this checkout's src/
    git worktree add /tmp/before <rev>
    python bench/turn_instructions.py --tree /tmp/before/src --tree src   # before and after, same run

Needs valgrind (on this machine's image). Each tree is imported through PYTHONPATH, so it needs no install.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

_TURNS = """
import os, shutil, sys, tempfile
from tether import Agent, FileStore, MemoryStore, SQLiteStore, tool
from tether.testing import ScriptedModel, call

n, kind = int(sys.argv[1]), sys.argv[2]
folder = tempfile.mkdtemp(dir="/dev/shm" if sys.platform == "linux" else None)
store = {
    "file": lambda: FileStore(folder),
    "sqlite": lambda: SQLiteStore(os.path.join(folder, "runs.db")),
    "memory": MemoryStore,
}[kind]()

@tool(effect="read_only")
def look(i: int) -> str:
    '''Look.'''
    return f"result {i}"

script = [call("look", i=i) for i in range(n)] + ["done"]
state = Agent(ScriptedModel(script), tools=[look], store=store, max_turns=n + 5).run("go")
assert state.status == "completed", state.status
shutil.rmtree(folder)
"""


def instructions(tree: Path, turns: int, work: Path, store: str = "file") -> int:
    """Instructions callgrind counts for a run of ``turns`` turns on ``store`` with ``tree`` on the path."""
    script = work / "turns.py"
    script.write_text(_TURNS)
    out = work / f"cg.{turns}.out"
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={out}",
            sys.executable,
            str(script),
            str(turns),
            store,
        ],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    found = re.search(r"Collected : (\d+)", done.stderr)
    if found is None:
        raise SystemExit(f"callgrind printed no count. Fix: check valgrind runs here:\n{done.stderr[-2000:]}")
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tree", action="append", help="a src/ folder holding tether (repeat to compare)")
    parser.add_argument("--few", type=int, default=20)
    parser.add_argument("--many", type=int, default=220)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument(
        "--store",
        choices=["file", "sqlite", "memory"],
        default="file",
        help="where the run lives (in /dev/shm)",
    )
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed. Fix: apt-get install -y valgrind")
    trees = [Path(t).resolve() for t in (args.tree or [Path(__file__).parent.parent / "src"])]
    extra = args.many - args.few
    print(
        f"python {sys.version.split()[0]}; {args.store} store; {args.few} and {args.many} turns, "
        f"{args.repeat} runs each"
    )
    print(f"{'tree':60}  instructions/turn (each run)")
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeat):
            for tree in trees:
                per_turn = (
                    instructions(tree, args.many, Path(tmp), args.store)
                    - instructions(tree, args.few, Path(tmp), args.store)
                ) / extra
                print(f"{tree!s:60}  {per_turn:,.0f}", flush=True)


if __name__ == "__main__":
    main()
