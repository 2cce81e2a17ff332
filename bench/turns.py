"""Per-turn cost of a durable run on FileStore, against a baseline measured in the same run (DESIGN 13).

Each turn is one model reply with one tool call and its result. For 100, 1,000 and 10,000 turns it prints
time per turn, syncs per turn (counted by wrapping os.fsync / os.fdatasync), bytes per turn, load time and
peak memory of a load. The baseline does the same syncs with the same call, flags, bytes and folder as the
store: per turn, ``syncs`` appends of the store's average append size to a file in the same folder, each
followed by the same sync call. The ratio is tether's time per turn over the baseline's.

    python bench/turns.py                 # 100, 1000, 10000 turns in ./.bench (on disk, not tmpfs)
    python bench/turns.py --turns 100,1000 --dir /some/disk/folder
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

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
    appends = _count_appends(journal)
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
        "append_bytes": size / max(1, appends),
        "load": load_time,
        "load_peak_mb": peak / 1e6,
        "sync_call": used,
    }


def _count_appends(journal: Path) -> int:
    # Each append ends with one info line (it has no "seq").
    return sum(1 for line in journal.read_bytes().splitlines() if not line.startswith(b'{"kind"'))


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
            reps = max(1, min(5, 2000 // turns))  # short runs are repeated: fsync latency is noisy
            samples = []
            for rep in range(reps):
                folder = root / f"t{turns}-{rep}"
                folder.mkdir()
                row = run_turns(folder, turns)
                row["baseline"] = baseline(
                    folder, turns, row["syncs_per_turn"], int(row["append_bytes"]), str(row["sync_call"])
                )
                row["sync_cost"] = sync_cost(folder, str(row["sync_call"]))
                samples.append(row)
                shutil.rmtree(folder)
            rows.append({key: _median(samples, key) for key in samples[0]})
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"python {sys.version.split()[0]}, folder {root} ({rows[0]['sync_call']} per append)")
    header = "turns  ms/turn  base ms/turn  ratio   syncs/turn  bytes/turn  load s   load peak MB"
    print(header)
    first_ratio = None
    for row in rows:
        if row["sync_cost"] < 20e-6:
            ratio_text = "UNMEASURABLE"
        else:
            ratio = row["per_turn"] / row["baseline"]
            first_ratio = first_ratio or ratio
            ratio_text = f"{ratio:5.2f}x"
        print(
            f"{int(row['turns']):>5}  {row['per_turn'] * 1e3:7.3f}  {row['baseline'] * 1e3:12.3f}  {ratio_text:>6}"
            f"  {row['syncs_per_turn']:10.2f}  {row['bytes_per_turn']:10.0f}  {row['load']:6.3f}"
            f"  {row['load_peak_mb']:12.1f}"
        )
    if first_ratio is not None and len(rows) > 1 and rows[-1]["sync_cost"] >= 20e-6:
        last = rows[-1]["per_turn"] / rows[-1]["baseline"]
        print(
            f"ratio at {rows[-1]['turns']} turns / ratio at {rows[0]['turns']} turns: {last / first_ratio:.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
