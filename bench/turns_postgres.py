"""Per-turn cost of a durable run on PostgresStore, native async face and sync face on threads, against a
baseline measured in the same run (DESIGN 13: per turn within 3x of a bare INSERT + COMMIT per append).

Each turn is one model reply with one tool call and its result: two appends (reply and start, result).
Both drives are ``agent.arun``: "async" on PostgresStore's native twins (psycopg's async pool, on the loop),
"threads" on a PostgresStore whose twins are the base's (each store call a trip to the store's threads,
over the sync pool).
The baseline is a bare ``INSERT`` + ``COMMIT`` per append (one statement in autocommit on a psycopg
connection: one transaction, one round trip) of the same bytes per append as the store's, into a table of
the entries' shape in the same schema: two per turn. It runs right before and right after each measured
run (the mean is used), so the server's and the machine's drift hit both sides alike.

Transactions, client round trips and statements per turn are read off the wire by a counting proxy
(``tests/_pg_wire.py``) on a separate run of the same size (the timed runs connect directly): the
difference between a run of N turns and one of N/2, so a run's fixed cost (create, release, pool start)
is left out. Then the append alone, in both faces: each ``store.append`` / ``await store.aappend`` (1 or 2
messages) followed by one bare INSERT, as many times as the largest run's turns, so the ratio holds even
while the machine's load drifts; and the CPU an ``aappend`` costs this process and
the server's backend (read from ``/proc``: a local server), steadier than either's wall time. ``--src``
measures another tree's tether (e.g. a ``git worktree`` of an earlier commit).

    python bench/turns_postgres.py             # 100 and 1000 turns, postgresql://root@127.0.0.1:5432/test
    python bench/turns_postgres.py --turns 200 --dsn postgresql://USER@HOST/DB --src /tmp/before/src
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import os
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def _store(dsn: str, face: str) -> Any:
    """A PostgresStore; face "threads": one whose twins are the base's (each call a trip to the store's
    threads over the sync pool, as before the native async face); "async": its own native twins."""
    from tether.stores.base import PRIMITIVES, Store
    from tether.stores.postgres import PostgresStore

    if face == "async":
        return PostgresStore(dsn)

    class ThreadTwins(PostgresStore):
        """PostgresStore whose twins are the base's: each sync primitive on the store's threads."""

    for name in PRIMITIVES:
        setattr(ThreadTwins, f"a{name}", getattr(Store, f"a{name}"))
    ThreadTwins.async_native = False
    return ThreadTwins(dsn)


def drive(dsn: str, turns: int, face: str = "async") -> tuple[float, int]:
    """Run ``turns`` one-call turns on a PostgresStore at ``dsn`` (``face``: see ``_store``); seconds per
    turn, and journal bytes."""
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
    store = _store(dsn, face)
    store.migrate()
    agent = Agent(ScriptedModel(replies), name="bench", tools=[lookup], store=store, poll_interval=1.0)
    run_id = f"bench-{uuid.uuid4().hex[:12]}"

    async def timed() -> float:
        try:
            start = time.perf_counter()
            state = await agent.arun("go", id=run_id)
            elapsed = time.perf_counter() - start
        finally:
            await store.aclose()  # this loop's pool, then the sync one
        assert state.status == "completed", state.status
        return elapsed

    elapsed = asyncio.run(timed())
    return elapsed / turns, sum(len(body) for body in _bodies(store, run_id))


def _bodies(store: Any, run_id: str) -> list[bytes]:
    import psycopg

    with psycopg.connect(store.dsn, autocommit=True) as conn:
        rows = conn.execute(
            f'SELECT body FROM "{store.schema}".entries WHERE run_id = %s', (run_id,)
        ).fetchall()
    return [bytes(body) for (body,) in rows]


def baseline(dsn: str, schema: str, appends: int, chunk: int, turns: int) -> float:
    """Seconds per turn for ``appends`` single-statement INSERTs (autocommit) of ``chunk`` bytes each."""
    import psycopg

    payload = b"x" * max(1, chunk)
    run_id = f"base-{uuid.uuid4().hex[:12]}"
    table = f'"{schema}".bench_baseline'
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {table} (run_id TEXT NOT NULL, seq INTEGER NOT NULL, body BYTEA "
            "NOT NULL, PRIMARY KEY (run_id, seq))"
        )
        sql = f"INSERT INTO {table} (run_id, seq, body) VALUES (%s, %s, %s)"
        start = time.perf_counter()
        for seq in range(appends):
            conn.execute(sql, (run_id, seq, payload))
        elapsed = time.perf_counter() - start
        conn.execute(f"DELETE FROM {table} WHERE run_id = %s", (run_id,))
    return elapsed / turns


def _backend_cpu(pid: int) -> float:
    """CPU seconds of the server process ``pid`` (a local server); 0 when it cannot be read."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def append_cpu(dsn: str, count: int, chunk: int) -> tuple[float, float]:
    """Per ``await store.aappend`` alone (one-entry batches of about ``chunk`` bytes, ``count`` of them, on one
    pooled connection): this process's CPU and the server backend's CPU, in ms. Steadier than wall time on
    a busy machine."""
    from tether import journal as j
    from tether._harness.conformance.support import make_sealed, record
    from tether.stores.postgres import PostgresStore

    store = PostgresStore(dsn, pool_min=1, pool_max=1)
    run_id = f"cpu-{uuid.uuid4().hex[:12]}"
    writer, lease = make_sealed(store, run_id, held=True)
    assert lease is not None
    by_run = "run_id" in inspect.signature(j.seal).parameters
    text = "x" * max(1, chunk - 150)
    batches = [
        j.seal([j.MessageAdded(seq=seq, at=j.now_iso(), content=[{"type": "text", "text": text}])], writer,
               **({"run_id": run_id} if by_run else {}))
        for seq in range(2, 2 + count)
    ]  # fmt: skip
    info = record(run_id)

    async def measure() -> tuple[float, float]:
        try:
            pool = await store._apool()
            async with pool.connection() as conn:
                pid = (await (await conn.execute("SELECT pg_backend_pid()")).fetchone())[0]
            server, client = _backend_cpu(pid), time.process_time()
            for batch in batches:
                await store.aappend(run_id, batch, expected_seq=batch[0].seq, writer=writer,
                                    lease_token=lease.token, info=info)  # fmt: skip
            return time.process_time() - client, _backend_cpu(pid) - server
        finally:
            await store.aclose()

    client, server = asyncio.run(measure())
    return client * 1e3 / count, server * 1e3 / count


def appends(dsn: str, schema: str, count: int, chunk: int) -> tuple[float, float, float, float]:
    """Per append, ms: ``store.append`` (sync face), the bare INSERT beside it, ``await store.aappend`` (async
    face), the bare INSERT awaited beside it; each append interleaved with its baseline's INSERT (one after
    the other, ``count`` times), so the server's drift hits both alike. Batches of 2 and 1 messages, in
    turn, of about ``chunk`` bytes an append."""
    import psycopg

    from tether import journal as j
    from tether._harness.conformance.support import make_sealed, record
    from tether.stores.postgres import PostgresStore

    store = PostgresStore(dsn, pool_min=1, pool_max=1)
    table = f'"{schema}".bench_baseline'
    sql = f"INSERT INTO {table} (run_id, seq, body) VALUES (%s, %s, %s)"
    text = "x" * max(1, chunk // 2 - 150)
    totals = [0.0, 0.0, 0.0, 0.0]

    by_run = "run_id" in inspect.signature(j.seal).parameters  # format 3 seals with the run's id

    def batch(run_id: str, seq: int, writer: str) -> list[j.Entry]:
        n = 2 if seq % 3 == 2 else 1
        at = j.now_iso()
        made = [
            j.MessageAdded(seq=seq + i, at=at, content=[{"type": "text", "text": text}]) for i in range(n)
        ]
        return j.seal(made, writer, **({"run_id": run_id} if by_run else {}))

    def one(run_id: str, seq: int, writer: str, token: int) -> tuple[list[j.Entry], dict[str, Any]]:
        return batch(run_id, seq, writer), {"expected_seq": seq, "writer": writer, "lease_token": token,
                                    "info": record(run_id)}  # fmt: skip

    async def measure() -> None:
        base_id = f"base-{uuid.uuid4().hex[:12]}"
        with psycopg.connect(store.dsn, autocommit=True) as sync_conn:
            aconn = await psycopg.AsyncConnection.connect(store.dsn, autocommit=True)
            try:
                for face in (0, 1):
                    run_id = f"appends-{face}-{uuid.uuid4().hex[:12]}"
                    writer, lease = make_sealed(store, run_id, held=True)
                    assert lease is not None
                    seq = 2
                    for i in range(count):
                        entries, kw = one(run_id, seq, writer, lease.token)
                        payload = b"x" * max(1, chunk)
                        start = time.perf_counter()
                        if face == 0:
                            store.append(run_id, entries, **kw)
                            middle = time.perf_counter()
                            sync_conn.execute(sql, (base_id, face * count + i, payload))
                        else:
                            await store.aappend(run_id, entries, **kw)
                            middle = time.perf_counter()
                            await aconn.execute(sql, (base_id, face * count + i, payload))
                        end = time.perf_counter()
                        totals[2 * face] += middle - start
                        totals[2 * face + 1] += end - middle
                        seq += len(entries)
            finally:
                await aconn.close()
                await store.aclose()

    asyncio.run(measure())
    sync_ms, sync_base, async_ms, async_base = (t * 1e3 / count for t in totals)
    return sync_ms, sync_base, async_ms, async_base


def counted(dsn: str, turns: int) -> tuple[float, float, float, int]:
    """Transactions, round trips and statements per turn of the native async face (the threads face sends
    the same statements), off the wire: (N turns − N/2 turns) / (N/2); and the journal's bytes after N
    turns."""
    sys.path.insert(0, str(HERE.parent / "tests"))
    from _pg_wire import WireCounter

    half = max(1, turns // 2)
    with WireCounter() as wire:
        proxied = wire.dsn(dsn)
        before = wire.counts()
        drive(proxied, half)
        middle = wire.counts()
        size = drive(proxied, turns)[1]
        after = wire.counts()
    small, large = middle - before, after - middle
    extra = turns - half
    return (
        (large.transactions - small.transactions) / extra,
        (large.round_trips - small.round_trips) / extra,
        (large.statements - small.statements) / extra,
        size,
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--turns", default="100,1000")
    parser.add_argument("--dsn", default="postgresql://root@127.0.0.1:5432/test")
    parser.add_argument("--src", help="import tether from this folder (another tree's src/)")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per size (the median is printed)")
    args = parser.parse_args()
    if args.src:
        sys.path.insert(0, str(Path(args.src).resolve()))
    import psycopg

    import tether

    schema = f"tether_bench_{uuid.uuid4().hex[:10]}"
    try:
        with psycopg.connect(args.dsn, autocommit=True, connect_timeout=3) as conn:
            conn.execute(f'CREATE SCHEMA "{schema}"')
    except psycopg.OperationalError as exc:
        print(
            f"no PostgreSQL at {args.dsn} ({str(exc).strip()[:200]}); skipped. Fix: start one, or pass --dsn"
        )
        return 0
    dsn = f"{args.dsn}{'&' if '?' in args.dsn else '?'}schema={schema}"
    print(f"python {sys.version.split()[0]}, tether from {Path(tether.__file__).parent}, schema {schema}")
    print("turns  async ms/turn  threads ms/turn  base ms/turn  async ratio  threads ratio  xacts/turn  "
          "round trips/turn  statements/turn  bytes/turn")  # fmt: skip
    try:
        drive(dsn, 20)  # warm-up: the schema's migrations, the server's caches
        for turns in (int(t) for t in args.turns.split(",")):
            xacts, trips, statements, size = counted(dsn, turns)
            chunk = size // (2 * turns + 2)  # the store's bytes per append
            runs: list[tuple[float, float, float]] = []  # (native async, threads, baseline) per repeat
            for _ in range(args.repeat):
                before = baseline(args.dsn, schema, 2 * turns, chunk, turns)
                native, _ = drive(dsn, turns, "async")
                threads, _ = drive(dsn, turns, "threads")
                after = baseline(args.dsn, schema, 2 * turns, chunk, turns)
                runs.append((native, threads, (before + after) / 2))
            ratios = [native / base for native, _, base in runs]
            native, threads, base = runs[ratios.index(statistics.median(ratios)) if len(ratios) % 2 else 0]
            print(
                f"{turns:>5}  {native * 1e3:13.3f}  {threads * 1e3:15.3f}  {base * 1e3:12.3f}  "
                f"{native / base:10.2f}x  {threads / base:12.2f}x  {xacts:10.2f}  {trips:16.2f}  "
                f"{statements:15.2f}  {size / turns:10.0f}"
            )
            print(f"       async ratios of the {args.repeat} runs: " + ", ".join(f"{r:.2f}x" for r in ratios))
        count = max(int(t) for t in args.turns.split(","))
        sync_ms, sync_base, async_ms, async_base = appends(dsn, schema, count, chunk)
        print(f"per append, {count} appends each interleaved with a bare INSERT (autocommit):")
        print(f"  sync face   {sync_ms:.3f} ms, bare INSERT {sync_base:.3f} ms: {sync_ms / sync_base:.2f}x")
        print(
            f"  async face  {async_ms:.3f} ms, bare INSERT {async_base:.3f} ms: {async_ms / async_base:.2f}x"
        )
        client, server = append_cpu(dsn, max(count, 2000), chunk)
        print(
            f"  CPU per await store.aappend: this process {client:.3f} ms, the server's backend {server:.3f} ms"
        )
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
