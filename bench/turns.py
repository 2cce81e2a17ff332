"""Per-turn cost of a durable run on FileStore, against a baseline measured in the same run (DESIGN 13).

Each turn is one model reply with one tool call and its result. For 100, 1,000 and 10,000 turns it prints
time per turn, syncs per turn (counted by wrapping os.fsync / os.fdatasync), bytes per turn, load time and
peak memory of a load. The baseline does the same syncs with the same call, flags, bytes and folder as the
store: per turn, ``syncs`` appends of the store's average append size (the journal's bytes over its
syncs) to a file in the same folder, each followed by the same sync call. It runs just before and just after each measured tether run (its shape
taken from an unmeasured warm-up run) and their mean is used, so drift in the disk's speed hits both sides
alike. The ratio is tether's time per turn over the baseline's.

The floor makes the baseline's syncs the way DESIGN 5.3 has an asyncio driver make them, with no other
work: each append handed from the event loop to a thread and back, and the sync tool's call on a thread
of its own. floor/base is what those thread handoffs alone cost on this machine; tether/floor is what
tether adds beyond them.

    python bench/turns.py                 # 100, 1000, 10000 turns in ./.bench (on disk, not tmpfs)
    python bench/turns.py --turns 100,1000 --dir /some/disk/folder
"""

from __future__ import annotations

import argparse
import asyncio
import os
import queue
import shutil
import statistics
import sys
import threading
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tether import Agent, FileStore, tool
from tether.testing import ScriptedModel, call

SYNC_CALLS = {"fsync": os.fsync, "fdatasync": getattr(os, "fdatasync", os.fsync)}
_counts = {"fsync": 0, "fdatasync": 0}


def _counting(name: str) -> Callable[[int], None]:
    real = SYNC_CALLS[name]

    def wrapper(fd: int) -> None:
        _counts[name] += 1
        real(fd)

    return wrapper


os.fsync = _counting("fsync")
if hasattr(os, "fdatasync"):
    os.fdatasync = _counting("fdatasync")


@tool(effect="read_only")
def lookup(n: int) -> str:
    """Look a number up.

    Args:
        n: The number.
    """
    return f"result {n}"


def run_turns(folder: Path, turns: int) -> dict[str, float]:
    """Drive one run of ``turns`` one-call turns and measure it."""
    run_id = f"bench-{turns}"
    replies: list[object] = [call("lookup", n=i) for i in range(turns)]
    replies.append("done")
    store = FileStore(folder)
    agent = Agent(ScriptedModel(replies), name="bench", tools=[lookup], store=store, poll_interval=5.0)
    before = dict(_counts)
    start = time.perf_counter()
    state = agent.run("go", id=run_id)
    elapsed = time.perf_counter() - start
    assert state.status == "completed", state.status
    syncs = sum(_counts.values()) - sum(before.values())
    used = "fdatasync" if _counts["fdatasync"] > before["fdatasync"] else "fsync"
    journal = folder / f"{run_id}.jsonl"
    size = journal.stat().st_size
    load_start = time.perf_counter()
    loaded = store.load(run_id)
    load_time = time.perf_counter() - load_start
    assert len(loaded.history) == len(state.history)
    tracemalloc.start()
    store.load(run_id)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {
        "turns": turns,
        "per_turn": elapsed / turns,
        "syncs_per_turn": syncs / turns,
        "bytes_per_turn": size / turns,
        "append_bytes": size / max(1, syncs),  # each append is one sync (the create's included)
        "load": load_time,
        "load_peak_mb": peak / 1e6,
        "sync_call": used,
    }


def baseline(folder: Path, turns: int, syncs_per_turn: float, append_bytes: int, sync_call: str) -> float:
    """Seconds per turn for the same syncs of the same size in the same folder: O_APPEND write + sync."""
    path = folder / "baseline.bin"
    sync = SYNC_CALLS[sync_call]
    payload = b"x" * (append_bytes - 1) + b"\n"
    total = round(syncs_per_turn * turns)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        start = time.perf_counter()
        for _ in range(total):
            os.write(fd, payload)
            sync(fd)
        elapsed = time.perf_counter() - start
    finally:
        os.close(fd)
        path.unlink()
    return elapsed / turns


def sync_cost(folder: Path, sync_call: str) -> float:
    """Median seconds of one small write + sync in ``folder``."""
    path = folder / "probe.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    times = []
    try:
        for _ in range(50):
            os.write(fd, b"x\n")
            start = time.perf_counter()
            SYNC_CALLS[sync_call](fd)
            times.append(time.perf_counter() - start)
    finally:
        os.close(fd)
        path.unlink()
    return statistics.median(times)


def floor(folder: Path, turns: int, syncs_per_turn: float, append_bytes: int, sync_call: str) -> float:
    """Seconds per turn for the baseline's syncs made off the event loop, plus one tool call on a thread."""
    path = folder / "floor.bin"
    sync = SYNC_CALLS[sync_call]
    payload = b"x" * (append_bytes - 1) + b"\n"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    syncs = round(syncs_per_turn * turns)

    def append() -> None:
        os.write(fd, payload)
        sync(fd)

    def tool() -> None:
        pass

    async def drive() -> float:
        loop = asyncio.get_running_loop()
        store_jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        tool_jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()

        def work(jobs: queue.SimpleQueue[Any]) -> None:
            while (job := jobs.get()) is not None:
                future, fn = job
                fn()
                loop.call_soon_threadsafe(future.set_result, None)

        for jobs in (store_jobs, tool_jobs):
            threading.Thread(target=work, args=(jobs,), daemon=True).start()

        async def on(jobs: queue.SimpleQueue[Any], fn: Callable[[], None]) -> None:
            future = loop.create_future()
            jobs.put((future, fn))
            await future

        start = time.perf_counter()
        for _ in range(turns):
            await on(store_jobs, append)  # the reply and the call's start
            await on(tool_jobs, tool)
            await on(store_jobs, append)  # the call's result
        for _ in range(syncs - 2 * turns):
            await on(store_jobs, append)
        elapsed = time.perf_counter() - start
        store_jobs.put(None)
        tool_jobs.put(None)
        return elapsed / turns

    try:
        return asyncio.run(drive())
    finally:
        os.close(fd)
        path.unlink()


def _median(samples: list[dict[str, float]], key: str) -> float:
    values = [sample[key] for sample in samples]
    if isinstance(values[0], str):
        return values[0]  # type: ignore[return-value]
    return statistics.median(values)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--turns", default="100,1000,10000")
    parser.add_argument("--dir", default=".bench")
    args = parser.parse_args()
    root = Path(args.dir).resolve()
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    rows = []
    try:
        for turns in (int(t) for t in args.turns.split(",")):
            reps = max(3, min(5, 2000 // turns))  # repeated, medians kept: fsync latency is noisy
            samples = []
            warm = root / f"t{turns}-warm-up"
            warm.mkdir()
            shape = run_turns(warm, turns)  # the syncs and bytes the baselines copy
            shutil.rmtree(warm)
            like = (shape["syncs_per_turn"], int(shape["append_bytes"]), str(shape["sync_call"]))
            for rep in range(reps):
                folder = root / f"t{turns}-{rep}"
                folder.mkdir()
                before = baseline(folder, turns, *like)
                row = run_turns(folder, turns)
                row["baseline"] = (before + baseline(folder, turns, *like)) / 2
                row["floor"] = floor(folder, turns, *like)
                row["sync_cost"] = sync_cost(folder, str(row["sync_call"]))
                row["ratio"] = row["per_turn"] / row["baseline"]
                row["floor_ratio"] = row["floor"] / row["baseline"]
                row["over_floor"] = row["per_turn"] / row["floor"]
                samples.append(row)
                shutil.rmtree(folder)
            rows.append({key: _median(samples, key) for key in samples[0]})
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"python {sys.version.split()[0]}, folder {root} ({rows[0]['sync_call']} per append)")
    print(
        "turns  ms/turn  base ms/turn  ratio  floor ms/turn  floor/base  tether/floor  syncs/turn  bytes/turn"
        "  load s  load peak MB"
    )
    for row in rows:
        measurable = row["sync_cost"] >= 20e-6
        ratio = f"{row['ratio']:5.2f}x" if measurable else "UNMEASURABLE"
        floor_ratio = f"{row['floor_ratio']:9.2f}x" if measurable else "UNMEASURABLE"
        print(
            f"{int(row['turns']):>5}  {row['per_turn'] * 1e3:7.3f}  {row['baseline'] * 1e3:12.3f}  {ratio:>6}"
            f"  {row['floor'] * 1e3:13.3f}  {floor_ratio:>10}  {row['over_floor']:11.2f}x"
            f"  {row['syncs_per_turn']:10.2f}  {row['bytes_per_turn']:10.0f}  {row['load']:6.3f}"
            f"  {row['load_peak_mb']:12.1f}"
        )
    print(f"median fdatasync of a small append here: {rows[0]['sync_cost'] * 1e6:.0f} us")
    if len(rows) > 1 and all(row["sync_cost"] >= 20e-6 for row in rows):
        print(
            f"ratio at {int(rows[-1]['turns'])} turns / ratio at {int(rows[0]['turns'])} turns: "
            f"{rows[-1]['ratio'] / rows[0]['ratio']:.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
