"""Per-turn cost of a durable run on PostgresStore, sync face and native async face, against a baseline
measured in the same run (DESIGN 13: per turn within 3x of a bare INSERT + COMMIT per append).

Each turn is one model reply with one tool call and its result: two appends. Both drives are
``agent.arun``: "sync" on a PostgresStore whose twins are the base's (each store call a trip to the store's
threads, over the sync pool), "async" on PostgresStore's native twins (psycopg's async pool, on the loop). The baseline, per
turn, makes two autocommit INSERTs of the same bytes on one connection to the same server.

    python bench/turns_postgres.py                     # 200 turns, postgresql://root@127.0.0.1:5432/test
    python bench/turns_postgres.py --turns 500 --dsn postgresql://USER@HOST/DB
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from typing import Any


def _agent(store: Any, turns: int) -> Any:
    from tether import Agent, tool
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
    return Agent(ScriptedModel(replies), name="bench", tools=[lookup], store=store, poll_interval=5.0)


def drive(url: str, turns: int, face: str) -> tuple[float, int]:
    """Seconds per turn of one run of ``turns`` turns, and the bytes its journal holds."""
    from tether.stores.base import PRIMITIVES, Store
    from tether.stores.postgres import PostgresStore

    class ThreadTwins(PostgresStore):
        """PostgresStore whose twins are the base's: each sync primitive on the store's threads."""

    for name in PRIMITIVES:
        setattr(ThreadTwins, f"a{name}", getattr(Store, f"a{name}"))
    ThreadTwins.async_native = False

    store: Any = PostgresStore(url) if face == "async" else ThreadTwins(url)
    agent = _agent(store, turns)
    run_id = f"bench-{face}-{uuid.uuid4().hex[:8]}"
    start = time.perf_counter()
    state = asyncio.run(agent.arun("go", id=run_id))
    elapsed = time.perf_counter() - start
    assert state.status == "completed", state.status
    size = sum(len(bytes(row[0])) for row in store._run(lambda cx, _: cx.all(
        f"SELECT body FROM {store._t.entries} WHERE run_id = %s", (run_id,))))  # fmt: skip
    store.close()
    return elapsed / turns, size // max(len(state.history), 1)


def baseline(url: str, turns: int, entry_bytes: int, schema: str) -> float:
    """Seconds per turn of two autocommit INSERT + COMMIT of ``2 * entry_bytes`` each, on one connection."""
    import psycopg

    with psycopg.connect(_libpq(url), autocommit=True) as conn:
        conn.execute(f"CREATE TABLE IF NOT EXISTS {schema}.bench_baseline (id BIGSERIAL, body BYTEA)")
        body = b"x" * (2 * entry_bytes)
        start = time.perf_counter()
        for _ in range(2 * turns):
            conn.execute(f"INSERT INTO {schema}.bench_baseline (body) VALUES (%s)", (body,))
        return (time.perf_counter() - start) / turns


def _libpq(url: str) -> str:
    return url.split("?")[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--dsn", default="postgresql://root@127.0.0.1:5432/test")
    args = parser.parse_args()
    import psycopg

    schema = f"tether_bench_{uuid.uuid4().hex[:8]}"
    url = f"{args.dsn}?schema={schema}"
    try:
        sync, entry = drive(url, args.turns, "sync")
        native, _ = drive(url, args.turns, "async")
        base = baseline(url, args.turns, entry, schema)
        print(f"PostgresStore, {args.turns} one-call turns (2 appends each), {entry} bytes per entry")
        print(f"  baseline (2 x INSERT + COMMIT): {base * 1e3:8.3f} ms/turn")
        print(f"  sync face on threads:           {sync * 1e3:8.3f} ms/turn  {sync / base:5.2f}x baseline")
        print(
            f"  native async face:              {native * 1e3:8.3f} ms/turn  {native / base:5.2f}x baseline"
        )
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


if __name__ == "__main__":
    main()
