"""Per-turn cost of a durable run on SQLiteStore, against a baseline measured in the same run (DESIGN 13).

Each turn is one model reply with one tool call and its result. SQLite syncs from C, so they are counted
with ``strace -f -c -e trace=fsync,fdatasync`` on a separate run of the same size; the timed run has no
tracer. The baseline does, per turn, the same number of syncs (the same call SQLite used) after
appending the same bytes per sync to a file in the same folder.

    python bench/turns_sqlite.py                 # 100, 1000, 10000 turns in ./.bench-sqlite
    python bench/turns_sqlite.py --turns 100,1000
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SYNCS = {"fsync": os.fsync, "fdatasync": getattr(os, "fdatasync", os.fsync)}


def drive(folder: Path, turns: int) -> float:
    """Run ``turns`` one-call turns on a SQLiteStore in ``folder``; seconds per turn."""
    from tether import Agent, SQLiteStore, tool
    from tether.testing import ScriptedModel, call

    @tool(effect="read_only")
    def lookup(n: int) -> str:
        """Look a number up.

        Args:
            n: The number.
        """
        return f"result {n}"

    replies: list[object] = [call("lookup", n=i) for i in range(turns)]
    replies.append("done")
    store = SQLiteStore(folder / "runs.db")
    agent = Agent(ScriptedModel(replies), name="bench", tools=[lookup], store=store, poll_interval=5.0)
    start = time.perf_counter()
    state = agent.run("go", id="bench")
    elapsed = time.perf_counter() - start
    assert state.status == "completed", state.status
    store.close()
    return elapsed / turns


def count_syncs(turns: int, root: Path) -> tuple[dict[str, int], int]:
    """Sync calls by name of one run under strace, and the bytes the database files hold after it."""
    folder = Path(tempfile.mkdtemp(dir=root))
    trace = folder / "strace.txt"
    subprocess.run(
        ["strace", "-f", "-c", "-e", "trace=fsync,fdatasync", "-o", str(trace), sys.executable, __file__,
         "--inner", str(turns), "--dir", str(folder)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    counts = {name: int(n) for n, name in re.findall(r"^\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\w+)$",
                                                       trace.read_text(), re.M) if name in SYNCS}  # fmt: skip
    size = sum(p.stat().st_size for p in folder.glob("runs.db*"))
    shutil.rmtree(folder)
    return counts, size


def baseline(folder: Path, syncs: int, chunk: int, sync_call: str, turns: int) -> float:
    """Seconds per turn for ``syncs`` appends of ``chunk`` bytes, each followed by ``sync_call``."""
    path = folder / "baseline.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    payload = b"x" * max(1, chunk)
    try:
        start = time.perf_counter()
        for _ in range(syncs):
            os.write(fd, payload)
            SYNCS[sync_call](fd)
        elapsed = time.perf_counter() - start
    finally:
        os.close(fd)
        path.unlink()
    return elapsed / turns


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--turns", default="100,1000,10000")
    parser.add_argument("--dir", default=".bench-sqlite")
    parser.add_argument("--inner", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inner:
        drive(Path(args.dir), args.inner)
        return 0
    if shutil.which("strace") is None:
        print("strace is needed to count SQLite's syncs: apt-get install strace")
        return 1
    root = Path(args.dir).resolve()
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    print(f"python {sys.version.split()[0]}, folder {root}")
    print("turns  ms/turn  base ms/turn  ratio   syncs/turn  bytes/turn")
    first = None
    try:
        for turns in (int(t) for t in args.turns.split(",")):
            counts, size = count_syncs(turns, root)
            sync_call = max(counts, key=lambda name: counts[name]) if counts else "fsync"
            syncs = sum(counts.values())
            folder = Path(tempfile.mkdtemp(dir=root))
            per_turn = drive(folder, turns)
            base = baseline(folder, syncs, size // max(1, syncs), sync_call, turns)
            shutil.rmtree(folder)
            ratio = per_turn / base
            first = first or ratio
            print(
                f"{turns:>5}  {per_turn * 1e3:7.3f}  {base * 1e3:12.3f}  {ratio:5.2f}x  {syncs / turns:10.2f}"
                f"  {size / turns:10.0f}   ({sync_call})"
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if first is not None:
        print(f"ratio at the largest size / ratio at the smallest: {ratio / first:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
