"""Loading a finished run: time, beside the cost of only decoding the same bytes, and peak memory (DESIGN 13).

A run of ``--turns`` one-call turns (3 entries a turn: 10,000 turns are 30,005 entries) is driven once on
FileStore and once on SQLiteStore. Then, interleaved ``--repeats`` times, it measures ``store.load(id)``
and the baseline: the same bytes read from the same file (the journal file; the ``entries`` rows) and
each line or body decoded with one ``orjson.loads``, nothing else. The figures are the minimum over the
repeats (the machine is shared; the minimum is the steadier figure). Memory: ``tracemalloc``'s peak while
loading, and what the loaded State holds (traced memory still allocated after the load, the State alive);
DESIGN 13 asks for a peak of at most 2x the State.

    python bench/load.py                       # 10,000 turns
    python bench/load.py --turns 1000 --repeats 9
"""

from __future__ import annotations

import argparse
import gc
import shutil
import sqlite3
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from tether import Agent, FileStore, SQLiteStore, tool
from tether import journal as j
from tether.testing import ScriptedModel, call


@tool(effect="read_only")
def lookup(n: int) -> str:
    """Look a number up.

    Args:
        n: The number.
    """
    return f"result {n}"


def _drive(store: Any, turns: int) -> int:
    replies: list[object] = [call("lookup", n=i) for i in range(turns)]
    replies.append("done")
    agent = Agent(ScriptedModel(replies), name="bench", tools=[lookup], store=store, poll_interval=5.0)
    state = agent.run("What is the weather in London?", id="bench")
    assert state.status == "completed"
    return len(state.history)


def _decode_file(path: Path) -> Callable[[], int]:
    def decode() -> int:
        loads = orjson.loads
        return len([loads(line) for line in path.read_bytes().splitlines()])

    return decode


def _decode_sqlite(path: Path) -> Callable[[], int]:
    def decode() -> int:
        conn = sqlite3.connect(path)
        try:
            rows = conn.execute("SELECT seq, body FROM entries WHERE run_id = ? ORDER BY seq", ("bench",))
            loads = orjson.loads
            return len([loads(body) for _, body in rows])
        finally:
            conn.close()

    return decode


def _best(fns: list[Callable[[], Any]], repeats: int) -> list[float]:
    """The fastest of ``repeats`` calls of each of ``fns``, taking turns; the clock stops before the result (a
    State, the decoded lines) is freed."""
    best = [float("inf")] * len(fns)
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            gc.collect()
            start = time.perf_counter()
            result = fn()
            best[i] = min(best[i], time.perf_counter() - start)
            del result
    return best


def _memory(load: Callable[[], Any]) -> tuple[float, float]:
    gc.collect()
    tracemalloc.start()
    state = load()
    held, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del state
    return peak / 1e6, held / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--dir", default=".bench-load")
    args = parser.parse_args()
    root = Path(args.dir)
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    try:
        files = FileStore(root / "files")
        entries = _drive(files, args.turns)
        sqlite = SQLiteStore(root / "runs.db")
        _drive(sqlite, args.turns)
        rows = {
            "file": (files, _decode_file(root / "files" / "bench.jsonl")),
            "sqlite": (sqlite, _decode_sqlite(root / "runs.db")),
        }
        print(
            f"python {sys.version.split()[0]}, format {j.FORMAT_VERSION}, {args.turns} one-call turns "
            f"({entries} entries), min of {args.repeats}"
        )
        print("store    load s  decode only s  load/decode  peak MB  State MB  peak/State")
        for name, (store, decode) in rows.items():
            load_s, decode_s = _best([lambda store=store: store.load("bench"), decode], args.repeats)  # type: ignore[misc]
            peak, held = _memory(lambda store=store: store.load("bench"))  # type: ignore[misc]
            print(
                f"{name:7}  {load_s:6.3f}  {decode_s:13.3f}  {load_s / decode_s:10.1f}x  {peak:7.1f}  {held:8.1f}"
                f"  {peak / held:9.2f}x"
            )
        print("budget: load under 0.2 s; peak at most 2x the State")
        files.close()
        sqlite.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
