"""Bytes per one-call turn in each store (DESIGN 13: at most 800 in FileStore).

Each turn is one model reply with one tool call and its result (the turn of ``bench/turns.py``). For each
store it drives a run of ``--turns`` turns and prints what one more turn costs: FileStore, the journal
file's growth (entry lines and listing lines); SQLiteStore and PostgresStore, the bytes of the entry
bodies (``length(body)``) and, for SQLite, the database file's growth. The baseline is the same facts as
compact JSON, nothing else: the reply's content blocks, the call's name, effect and attempt, the result's
blocks (what any journal must hold).

    python bench/journal_bytes.py                      # FileStore and SQLiteStore
    python bench/journal_bytes.py --pg postgresql://127.0.0.1:5432/test
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import orjson
from _postgres import postgres_answers

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


def _drive(store: Any, run_id: str, turns: int) -> None:
    replies: list[object] = [call("lookup", n=i) for i in range(turns)]
    replies.append("done")
    agent = Agent(ScriptedModel(replies), name="bench", tools=[lookup], store=store, poll_interval=5.0)
    assert agent.run("What is the weather in London?", id=run_id).status == "completed"


def _facts(store: Any, run_id: str, turns: int) -> float:
    """The baseline: the turn's facts alone, as compact JSON, per turn."""
    total = 0
    for entry in store.load(run_id).history:
        if isinstance(entry, j.ModelReplied):
            total += len(orjson.dumps(entry.content))
        elif isinstance(entry, j.ToolStarted):
            total += len(orjson.dumps([entry.tool, entry.effect, entry.attempt]))
        elif isinstance(entry, j.ToolFinished):
            total += len(orjson.dumps([entry.outcome, entry.content]))
    return total / turns


def _per_turn(measure: Any, turns: int) -> float:
    """What one more turn costs: (bytes after 2n turns - bytes after n turns) / n."""
    return (measure(2 * turns) - measure(turns)) / turns


def file_bytes(root: Path, turns: int) -> dict[str, float]:
    def measure(n: int) -> int:
        folder = Path(tempfile.mkdtemp(dir=root))
        store = FileStore(folder)
        _drive(store, "bench", n)
        store.close()
        size = (folder / "bench.jsonl").stat().st_size
        shutil.rmtree(folder)
        return size

    folder = Path(tempfile.mkdtemp(dir=root))
    store = FileStore(folder)
    _drive(store, "bench", turns)
    facts = _facts(store, "bench", turns)
    lines = (folder / "bench.jsonl").read_bytes().splitlines()
    info = [line for line in lines if line.startswith((b'{"info"', b'{"i":'))]  # full and short
    store.close()
    shutil.rmtree(folder)
    return {
        "per_turn": _per_turn(measure, turns),
        "listing_per_turn": sum(len(line) + 1 for line in info[2:]) / turns,
        "facts": facts,
    }


def sqlite_bytes(root: Path, turns: int) -> dict[str, float]:
    import sqlite3

    def measure(n: int) -> tuple[int, int]:
        folder = Path(tempfile.mkdtemp(dir=root))
        store = SQLiteStore(folder / "runs.db")
        _drive(store, "bench", n)
        store.close()
        conn = sqlite3.connect(folder / "runs.db")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        (body,) = conn.execute("SELECT sum(length(body)) FROM entries").fetchone()
        (pages,) = conn.execute("PRAGMA page_count").fetchone()
        (page,) = conn.execute("PRAGMA page_size").fetchone()
        conn.close()
        shutil.rmtree(folder)
        return int(body), int(pages * page)

    small, large = measure(turns), measure(2 * turns)
    return {"per_turn": (large[0] - small[0]) / turns, "file_per_turn": (large[1] - small[1]) / turns}


def pg_bytes(dsn: str, turns: int) -> dict[str, float]:
    import psycopg

    from tether.stores.postgres import PostgresStore

    schema = f"tether_bench_bytes_{os.getpid()}"

    def measure(n: int) -> tuple[int, int]:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
            conn.execute(f"CREATE SCHEMA {schema}")
        store = PostgresStore(dsn, schema=schema)
        _drive(store, "bench", n)
        store.close()
        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute(
                f"SELECT sum(length(body)), sum(pg_column_size(e.*)) FROM {schema}.entries e"
            ).fetchone()
            conn.execute(f"DROP SCHEMA {schema} CASCADE")
        assert row is not None
        return int(row[0]), int(row[1])

    small, large = measure(turns), measure(2 * turns)
    return {"per_turn": (large[0] - small[0]) / turns, "row_per_turn": (large[1] - small[1]) / turns}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--dir", default=".bench-bytes")
    parser.add_argument("--pg", default=None, help="a PostgreSQL DSN to measure PostgresStore too")
    # make bench passes --pg; with no server answering there, PostgresStore's row is skipped with a reason
    args = parser.parse_args()
    root = Path(args.dir)
    root.mkdir(parents=True, exist_ok=True)
    try:
        f = file_bytes(root, args.turns)
        s = sqlite_bytes(root, args.turns)
        print(
            f"python {sys.version.split()[0]}, format {j.FORMAT_VERSION}, one-call turns, {args.turns} more turns"
        )
        print("store       bytes/turn  (of which)")
        print(f"file        {f['per_turn']:10.0f}  listing lines {f['listing_per_turn']:.0f}; budget 800")
        print(f"sqlite      {s['per_turn']:10.0f}  entry bodies; database file {s['file_per_turn']:.0f}")
        if args.pg and postgres_answers(args.pg, "start one, or drop --pg"):
            p = pg_bytes(args.pg, args.turns)
            print(
                f"postgres    {p['per_turn']:10.0f}  entry bodies; rows (pg_column_size) {p['row_per_turn']:.0f}"
            )
        print(f"baseline    {f['facts']:10.0f}  the turn's facts alone as compact JSON")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
