"""Instructions per loaded entry (valgrind's callgrind), for comparing two source trees on a busy machine.

A run of ``--turns`` one-call turns is written once per tree into a FileStore and a SQLiteStore in
/dev/shm (by that tree: each writes its own format). Then, under callgrind, each tree loads its run once and
three times; the difference over the two extra loads, divided by the entries, is what one entry costs to
load (read, decode, check, fold), start-up excluded. ``decode only`` is the same bytes each decoded by one
``orjson.loads``, the floor any JSON journal pays.

    python bench/load_instructions.py                                   # this checkout's src/
    git worktree add /tmp/before <rev>
    python bench/load_instructions.py --tree /tmp/before/src --tree src  # before and after, same run

Needs valgrind. Each tree is imported through PYTHONPATH, so it needs no install.
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

_WRITE = """
import sys
from tether import Agent, FileStore, SQLiteStore, tool
from tether.testing import ScriptedModel, call

n, folder = int(sys.argv[1]), sys.argv[2]

@tool(effect="read_only")
def look(i: int) -> str:
    '''Look.'''
    return f"result {i}"

for store in (FileStore(folder + "/files"), SQLiteStore(folder + "/runs.db")):
    script = [call("look", i=i) for i in range(n)] + ["done"]
    Agent(ScriptedModel(script), tools=[look], store=store, max_turns=n + 5, poll_interval=5).run("go", id="b")
    store.close()
"""

_LOAD = """
import sys, orjson, sqlite3
from tether import FileStore, SQLiteStore

kind, folder, times = sys.argv[1], sys.argv[2], int(sys.argv[3])
if kind == "file":
    store = FileStore(folder + "/files")
elif kind == "sqlite":
    store = SQLiteStore(folder + "/runs.db")
for _ in range(times):
    if kind == "decode":
        with open(folder + "/files/b.jsonl", "rb") as f:
            [orjson.loads(line) for line in f.read().splitlines()]
    else:
        state = store.load("b")
print(len(state.history) if kind != "decode" else 0)
"""


def _instructions(tree: str, kind: str, folder: str, times: int) -> int:
    out = os.path.join(folder, f"callgrind.{kind}.{times}.out")
    done = subprocess.run(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable, "-c", _LOAD,
         kind, folder, str(times)],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": tree}, check=False,
    )  # fmt: skip
    found = re.search(r"Collected : (\d+)", done.stderr)
    if not found:
        raise SystemExit(f"callgrind printed no count. Fix: check valgrind runs here:\n{done.stderr[-2000:]}")
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", default=None, help="a src/ folder (repeat to compare)")
    parser.add_argument("--turns", type=int, default=1000)
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed. Fix: apt-get install -y valgrind")
    trees = args.tree or [str(Path(__file__).resolve().parent.parent / "src")]
    entries = 3 * args.turns + 5
    print(
        f"python {sys.version.split()[0]}; {args.turns} one-call turns ({entries} entries); instructions per entry"
    )
    print(f"{'tree':60}  {'file':>8}  {'sqlite':>8}  {'decode only':>11}")
    for tree in trees:
        folder = tempfile.mkdtemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
        try:
            subprocess.run([sys.executable, "-c", _WRITE, str(args.turns), folder], check=True,
                           env={**os.environ, "PYTHONPATH": tree})  # fmt: skip
            row = []
            for kind in ("file", "sqlite", "decode"):
                one, three = _instructions(tree, kind, folder, 1), _instructions(tree, kind, folder, 3)
                row.append((three - one) / 2 / entries)
            print(f"{tree:60}  {row[0]:8,.0f}  {row[1]:8,.0f}  {row[2]:11,.0f}")
        finally:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
