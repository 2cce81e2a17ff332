"""How long listing takes: the newest 50 of 10,000 and of 100,000 runs, on SQLiteStore, PostgresStore and FileStore.

For each store and size it fills a fresh store, then times (median of several calls, after one warm-up):
``list(limit=50)`` (what ``tether ls`` does), the second page through ``list_page``'s cursor, a status
filter, and ``claim_next`` when no run needs work. DESIGN 13: the newest 50 of 100,000 runs in SQLiteStore
and PostgresStore under 5 ms. The baseline, for the SQL stores, is the bare query for the same 50 rows on
the same table and index (``SELECT * ... ORDER BY updated_at DESC, id DESC LIMIT 50``) through the same
driver, measured in the same run: what tether adds is building the ``RunInfo`` records.

Filling is not timed. SQL rows are inserted in one transaction (the listing columns as appends leave
them); FileStore journals are copies of one real run's journal with each listing line rewritten, since
``list`` reads only a journal's last append and listing line. PostgreSQL gets a fresh schema, dropped after.

    python bench/listing.py                          # 10000 and 100000 runs, every store, in ./.bench
    python bench/listing.py --runs 10000 --stores sqlite --dir /some/disk/folder
    python bench/listing.py --stores postgres --pg postgresql://root@127.0.0.1:5432/test
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
from _postgres import postgres_answers

from tether import FileStore, Owner, State, Store
from tether import journal as j
from tether.stores.sqlite import SQLiteStore
from tether.writing import JournalWriter

STATUSES = ("completed", "completed", "completed", "failed", "cancelled", "waiting")


def _at(i: int) -> str:
    return (datetime(2025, 1, 1, tzinfo=UTC) + timedelta(seconds=i)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def fill_sqlite(path: Path, count: int) -> SQLiteStore:
    """A SQLite store holding ``count`` stopped runs (one ``updated_at`` per second)."""
    store = SQLiteStore(path)
    rows = [
        (f"run{i:07d}", "bench", STATUSES[i % len(STATUSES)], 3, "hello", _at(i), _at(i), f"run{i:07d}", 7)
        for i in range(count)
    ]
    conn = store._conn()
    conn.execute("BEGIN IMMEDIATE")
    conn.executemany(
        "INSERT INTO runs (id, agent, status, turn, first_message, created_at, updated_at, root_id, length) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        rows,
    )
    conn.execute("COMMIT")
    return store


def fill_postgres(dsn: str, schema: str, count: int) -> Any:
    """A PostgresStore in a fresh ``schema`` holding ``count`` stopped runs (one ``updated_at`` per second)."""
    import psycopg

    from tether.stores.postgres import PostgresStore

    store = PostgresStore(dsn, schema=schema)
    store.list(limit=1)  # creates the schema's tables
    with psycopg.connect(dsn) as conn, conn.cursor() as cur:
        with cur.copy(
            f'COPY "{schema}".runs (id, agent, status, turn, first_message, created_at, updated_at, root_id, '
            "length) FROM STDIN"
        ) as copy:
            for i in range(count):
                copy.write_row(
                    (f"run{i:07d}", "bench", STATUSES[i % len(STATUSES)], 3, "hello", _at(i), _at(i),
                     f"run{i:07d}", 7)
                )  # fmt: skip
        cur.execute(f'ANALYZE "{schema}".runs')
    return store


NEWEST = "SELECT * FROM {table} ORDER BY updated_at DESC, id DESC LIMIT 50"


def bare_sqlite(store: SQLiteStore) -> Callable[[], Any]:
    """The baseline: the bare query for the newest 50 rows, on the store's own connection."""
    conn = store._conn()
    return lambda: conn.execute(NEWEST.format(table="runs")).fetchall()


def bare_postgres(dsn: str, schema: str) -> tuple[Callable[[], Any], Callable[[], None]]:
    """The baseline: the bare query for the newest 50 rows on one open connection, and its closer."""
    import psycopg

    conn = psycopg.connect(dsn, autocommit=True)
    sql = NEWEST.format(table=f'"{schema}".runs')
    return (lambda: conn.execute(sql, prepare=True).fetchall()), conn.close


def fill_files(folder: Path, count: int) -> FileStore:
    """A FileStore holding ``count`` runs: copies of one real journal, each with its own listing line."""
    store = FileStore(folder)
    template = State(id="template")
    writer = JournalWriter(template)
    writer.add(j.RunStarted, agent="bench", root_id="template")
    writer.add(j.MessageAdded, role="user", content=[{"type": "text", "text": "hello"}])
    store.create("template", writer.next_batch(), template.info())
    data = (folder / "template.jsonl").read_bytes()
    body = data[: data.rstrip(b"\n").rfind(b"\n") + 1]  # the entry lines; the listing line is rewritten
    store.delete("template")
    for i in range(count):
        run_id = f"run{i:07d}"
        info = {"agent": "bench", "status": STATUSES[i % len(STATUSES)], "turn": 3, "first_message": "hello",
                "created_at": _at(i), "updated_at": _at(i), "parent_id": None, "root_id": run_id,
                "inbox_consumed": -1, "length": 2, "token": None}  # fmt: skip
        (folder / f"{run_id}.jsonl").write_bytes(body + orjson.dumps({"info": info}) + b"\n")
        (folder / f"{run_id}.inbox.jsonl").write_bytes(b"")
    return FileStore(folder)  # a fresh object: nothing cached


def timed(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    """The median wall time of ``fn`` over ``repeat`` calls (after a warm-up), and its last result."""
    result = fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def measure(store: Store, count: int, repeat: int) -> dict[str, float]:
    newest_t, newest = timed(lambda: store.list(limit=50), repeat)
    assert [i.id for i in newest] == [f"run{i:07d}" for i in range(count - 1, count - 51, -1)], "wrong order"
    _, cursor = store.list_page(limit=50)
    page_t, page = timed(lambda: store.list_page(limit=50, cursor=cursor), repeat)
    assert page[0][0].id == f"run{count - 51:07d}", "wrong second page"
    status_t, _ = timed(lambda: store.list(status="failed", limit=50), repeat)
    claim_t, claimed = timed(lambda: store.claim_next(Owner.here(), agents=["nobody"]), repeat)
    assert claimed is None
    return {"newest": newest_t, "page2": page_t, "status": status_t, "claim": claim_t}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", default="10000,100000", help="comma-separated run counts")
    parser.add_argument(
        "--stores", default="sqlite,postgres,file", help="comma-separated: sqlite, postgres, file"
    )
    parser.add_argument("--dir", default=".bench", help="a folder on the disk to measure (not tmpfs)")
    parser.add_argument("--pg", default="postgresql://root@127.0.0.1:5432/test", help="PostgreSQL DSN")
    parser.add_argument("--repeat", type=int, default=15, help="timed calls per figure (median)")
    args = parser.parse_args()
    root = Path(args.dir).absolute()
    print(
        f"{'store':<8} {'runs':>7}  {'fill':>7}  {'newest 50':>10}  {'bare query':>10}  {'ratio':>6}  "
        f"{'page 2':>8}  {'status=':>8}  {'claim_next':>10}"
    )
    for kind in args.stores.split(","):
        if kind == "postgres" and not postgres_answers(args.pg, "start one, or pass --pg"):
            continue
        for count in (int(n) for n in args.runs.split(",")):
            folder = root / f"listing-{kind}-{count}"
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
            schema = f"tether_bench_{uuid.uuid4().hex[:10]}"
            close_bare: Callable[[], None] = lambda: None  # noqa: E731
            start = time.perf_counter()
            store: Any
            if kind == "sqlite":
                store = fill_sqlite(folder / "runs.db", count)
                bare: Callable[[], Any] | None = bare_sqlite(store)
            elif kind == "postgres":
                store = fill_postgres(args.pg, schema, count)
                bare, close_bare = bare_postgres(args.pg, schema)
            else:
                store, bare = fill_files(folder / "runs", count), None
            fill = time.perf_counter() - start
            repeat = args.repeat if kind != "file" or count <= 10_000 else max(1, args.repeat // 3)
            try:
                figures = measure(store, count, repeat)
                bare_t = timed(bare, repeat)[0] if bare else None
            finally:
                close_bare()
                store.close()
                shutil.rmtree(folder, ignore_errors=True)
                if kind == "postgres":
                    _drop_schema(args.pg, schema)
            base = (
                f"{bare_t * 1000:>8.2f}ms  {figures['newest'] / bare_t:>5.1f}x"
                if bare_t
                else f"{'-':>10}  {'-':>6}"
            )
            print(
                f"{kind:<8} {count:>7}  {fill:>6.1f}s  {figures['newest'] * 1000:>8.2f}ms  {base}  "
                f"{figures['page2'] * 1000:>6.2f}ms  {figures['status'] * 1000:>6.2f}ms  "
                f"{figures['claim'] * 1000:>8.2f}ms",
                flush=True,
            )
    print("budget (DESIGN 13): the newest 50 of 100,000 runs in SQLiteStore and PostgresStore under 5 ms")


def _drop_schema(dsn: str, schema: str) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


if __name__ == "__main__":
    main()
