"""One Worker driving many runs at once, against the ideal (DESIGN 13: within 1.3x, SQLite and PostgreSQL).

``--runs`` runs are submitted (not timed), then one ``Worker(concurrency=N)`` drives them all until none
needs work. Each run has ``--turns`` model requests, each answered after ``--latency`` seconds: every
request but the last calls a sync tool, the last answers. The ideal is runs x turns x latency /
concurrency: the model's latency, perfectly overlapped. The baseline, measured in the same run, is the
same schedule with no store and no tether at all: N asyncio tasks taking jobs from a queue and sleeping
``turns`` times. Each store runs in a fresh process, so its peak memory (``ru_maxrss``) is its own; the
figure per in-flight run is (peak - memory before driving) / concurrency.

    python bench/concurrency.py                              # SQLite (./.bench-concurrency) and PostgreSQL
    python bench/concurrency.py --stores sqlite --runs 200
    python bench/concurrency.py --tree /tmp/before/src --tree src --repeat 2   # before and after, interleaved
    TETHER_BENCH_POSTGRES_DSN=postgresql://root@127.0.0.1:5432/test python bench/concurrency.py
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import itertools
import json
import os
import resource
import shutil
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

DEFAULT_DSN = "postgresql://root@127.0.0.1:5432/test"


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux


def _current_rss_mb() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def baseline(runs: int, turns: int, latency: float, concurrency: int) -> float:
    """Seconds for the same schedule with asyncio alone: ``concurrency`` tasks sleeping ``turns`` times a job."""

    async def main() -> float:
        jobs: asyncio.Queue[int] = asyncio.Queue()
        for i in range(runs):
            jobs.put_nowait(i)

        async def work() -> None:
            while not jobs.empty():
                jobs.get_nowait()
                for _ in range(turns):
                    await asyncio.sleep(latency)

        start = time.perf_counter()
        await asyncio.gather(*(work() for _ in range(concurrency)))
        return time.perf_counter() - start

    return asyncio.run(main())


def _store(kind: str, where: str) -> Any:
    if kind == "sqlite":
        from tether import SQLiteStore

        return SQLiteStore(Path(where) / "runs.db")
    from tether import PostgresStore

    if "schema" not in inspect.signature(PostgresStore).parameters:  # a tree before issue 21: the search_path
        where = where.replace("schema=", "options=-csearch_path%3D")
    return PostgresStore(where, pool_max=int(os.environ.get("TETHER_BENCH_POOL_MAX", "20")))


def drive(kind: str, where: str, runs: int, turns: int, latency: float, concurrency: int) -> dict[str, Any]:
    """Submit ``runs`` runs, drive them with one Worker, and measure it (in this process)."""
    from tether import Agent, Worker, tool
    from tether.testing import ScriptedModel, call

    @tool(effect="read_only")
    def lookup(n: int) -> str:
        """Look a number up.

        Args:
            n: The number.
        """
        return f"result {n}"

    def answer(reply: Any) -> Any:
        async def later(request: Any) -> Any:
            if timeline is not None:
                timeline.requested()
            await asyncio.sleep(latency)
            return reply

        return later

    script = [answer(call("lookup", n=i)) for i in range(turns - 1)] + [answer("done")]
    store = _store(kind, where)
    agent = Agent(ScriptedModel(script), name="bench", tools=[lookup], store=store, poll_interval=1.0)
    for i in range(runs):
        agent.submit("go", id=f"run-{i:05d}")
    worker = Worker([agent], store, concurrency=concurrency, poll_interval=0.5)
    timeline = _Timeline(worker, store) if os.environ.get("TETHER_BENCH_TIMELINE") else None
    server_before = _server_cpu()
    threads_before = _threads_now()
    rss_before = _current_rss_mb()
    cpu_before = _cpu_seconds()
    start = time.perf_counter()
    if os.environ.get("TETHER_BENCH_PROFILE"):  # cProfile of the drive, to that file (pstats)
        import cProfile

        with cProfile.Profile(time.process_time) as profile:  # CPU, not time waited
            worker.run(stop_when_idle=True)
        profile.dump_stats(os.environ["TETHER_BENCH_PROFILE"])
    else:
        worker.run(stop_when_idle=True)
    elapsed = time.perf_counter() - start
    cpu = _cpu_seconds() - cpu_before
    statuses = Counter(info.status for info in store.list(limit=runs + 10))
    store.close()
    if timeline is not None:
        timeline.report(start, latency, turns)
        print(
            f"  server cpu {_server_cpu() - server_before:.2f} s (every local postgres process)",
            file=sys.stderr,
        )
    return {
        "seconds": elapsed,
        "cpu": cpu,
        "statuses": dict(statuses),
        "claimed": worker.claimed,
        "peak_mb": _rss_mb(),
        "before_mb": rss_before,
        "threads_before": threads_before,
        "threads_peak": _PEAK_THREADS[0],
    }


_PEAK_THREADS = [0]


def _server_cpu() -> float:
    """CPU seconds of this machine's postgres processes (and their children that ended); 0 when unreadable."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if stat.with_name("comm").read_text().strip() == "postgres":
                total += sum(int(f) for f in fields[11:15])  # utime, stime, cutime, cstime
        except (OSError, IndexError, ValueError):
            continue
    return total / os.sysconf("SC_CLK_TCK")


_TIMED = ("aclaim_next", "aread", "aread_inbox", "aappend", "arelease", "aabandon", "renew", "alist")


class _Timeline:
    """Per run: when it was claimed, each model request, when its drive stopped; each store call's time
    (``TETHER_BENCH_TIMELINE=1``; the report goes to stderr)."""

    def __init__(self, worker: Any, store: Any) -> None:
        self.worker, self.events, self.calls = worker, [], {}
        start_drive, drive_done = worker._start_drive, worker._drive_done

        def started(lease: Any) -> None:
            self.events.append((time.perf_counter(), "claimed", lease.run_id))
            start_drive(lease)

        def done(task: Any) -> None:
            self.events.append((time.perf_counter(), "stopped", worker._tasks.get(task)))
            drive_done(task)

        worker._start_drive, worker._drive_done = started, done
        for name in _TIMED:
            self._time(store, name)
        self.pool_stats: list[dict[str, Any]] = []
        close_loop = store.aclose_loop

        async def closing() -> None:  # the loop's pool's figures, before it closes
            self.pool_stats += [mine.pool.get_stats() for mine in getattr(store, "_apools", {}).values()]
            await close_loop()

        store.aclose_loop = closing

    def _time(self, store: Any, name: str) -> None:
        fn = getattr(store, name)
        spent = self.calls.setdefault(name, [])
        if name.startswith("a"):

            async def timed(*args: Any, **kwargs: Any) -> Any:
                began = time.perf_counter()
                try:
                    return await fn(*args, **kwargs)
                finally:
                    spent.append((began, time.perf_counter()))
        else:

            def timed(*args: Any, **kwargs: Any) -> Any:  # type: ignore[misc]
                began = time.perf_counter()
                try:
                    return fn(*args, **kwargs)
                finally:
                    spent.append((began, time.perf_counter()))

        setattr(store, name, timed)

    def requested(self) -> None:
        task = asyncio.current_task()
        self.events.append((time.perf_counter(), "request", self.worker._tasks.get(task)))

    def report(self, start: float, latency: float, turns: int) -> None:
        def ms(values: list[float]) -> str:
            if not values:
                return "-"
            values = sorted(values)
            pick = lambda q: values[min(len(values) - 1, int(q * len(values)))] * 1e3  # noqa: E731
            return f"n={len(values)} mean {sum(values) / len(values) * 1e3:.1f} p50 {pick(0.5):.1f} p90 {pick(0.9):.1f} max {values[-1] * 1e3:.1f}"

        out = sys.stderr
        for name, spent in self.calls.items():
            print(f"  {name:12} {ms([b - a for a, b in spent])}", file=out)
        runs: dict[str, dict[str, Any]] = {}
        for at, kind, run_id in self.events:
            run = runs.setdefault(run_id, {"requests": []})
            if kind == "request":
                run["requests"].append(at)
            else:
                run[kind] = at
        claimed_to_first, gaps, last_to_stop = [], [], []
        for run in runs.values():
            r = run["requests"]
            if "claimed" in run and r:
                claimed_to_first.append(r[0] - run["claimed"])
            gaps += [b - a - latency for a, b in itertools.pairwise(r)]
            if "stopped" in run and r:
                last_to_stop.append(run["stopped"] - r[-1] - latency)
        stops = sorted(at for at, kind, _ in self.events if kind == "stopped")
        claims = sorted(at for at, kind, _ in self.events if kind == "claimed")
        refill = []
        for stop in stops:  # the first claim after each stop (a slot refilled), while runs were left
            later = [c for c in claims if c >= stop]
            if later and len(refill) < len(claims) - self.worker.concurrency:
                refill.append(later[0] - stop)
        print(f"  claimed -> first request    {ms(claimed_to_first)}", file=out)
        print(f"  request -> next, less model {ms(gaps)}", file=out)
        print(f"  last reply -> stopped       {ms(last_to_stop)}", file=out)
        print(f"  stopped -> a slot refilled  {ms(refill)}", file=out)
        print(
            f"  first claim {(claims[0] - start) * 1e3:.0f} ms, last claim {(claims[-1] - start) * 1e3:.0f} ms, "
            f"last stop {(stops[-1] - start) * 1e3:.0f} ms",
            file=out,
        )
        in_flight, series = 0, []
        for at, kind, _ in sorted(e for e in self.events if e[1] != "request"):
            in_flight += 1 if kind == "claimed" else -1
            series.append((at - start, in_flight))
        marks = [(t, n) for t, n in series][:: max(1, len(series) // 40)]
        print("  in flight: " + " ".join(f"{t:.2f}s:{n}" for t, n in marks), file=out)
        for stats in self.pool_stats:
            print(f"  async pool {stats}", file=out)


def _threads_now() -> int:
    import threading

    def watch() -> None:
        while True:
            _PEAK_THREADS[0] = max(_PEAK_THREADS[0], threading.active_count())
            time.sleep(0.05)

    threading.Thread(target=watch, daemon=True).start()
    return threading.active_count()


def _postgres_schema(base: str) -> tuple[str, Any]:
    import psycopg

    schema = f"bench_concurrency_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")

    def drop() -> None:
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")

    sep = "&" if "?" in base else "?"
    return f"{base}{sep}schema={schema}", drop  # every statement names the store's schema


def _child(args: argparse.Namespace, tree: str | None, kind: str, where: str) -> dict[str, Any]:
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = str(Path(tree).resolve())
    command = [sys.executable, __file__, "--inner", kind, where, "--runs", str(args.runs)]
    command += ["--turns", str(args.turns), "--latency", str(args.latency)]
    command += ["--concurrency", str(args.concurrency)]
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=env, cwd="/")
    if done.returncode != 0:
        raise SystemExit(f"the {kind} run failed:\n{done.stderr[-3000:]}")
    if os.environ.get("TETHER_BENCH_TIMELINE"):
        print(f"{kind} {tree or 'src'}:\n{done.stderr}", file=sys.stderr)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _one_store(args: argparse.Namespace, tree: str | None, kind: str) -> dict[str, Any] | None:
    """Drive the runs on a fresh store of ``kind`` with ``tree`` on the path; None when it cannot be had."""
    if kind == "sqlite":
        where = str(Path(args.dir).resolve())
        shutil.rmtree(where, ignore_errors=True)
        os.makedirs(where)
        try:
            return _child(args, tree, kind, where)
        finally:
            shutil.rmtree(where, ignore_errors=True)
    try:
        dsn, drop = _postgres_schema(os.environ.get("TETHER_BENCH_POSTGRES_DSN", DEFAULT_DSN))
    except Exception as exc:  # no server, or no psycopg: say so and go on
        print(f"postgres skipped: {exc}")
        return None
    try:
        return _child(args, tree, kind, dsn)
    finally:
        drop()


def _sync_ms(folder: str) -> float:
    """Median milliseconds of one small write + fdatasync in ``folder`` (how busy the disk is)."""
    os.makedirs(folder, exist_ok=True)
    path = Path(folder) / "probe.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    times = []
    try:
        for _ in range(30):
            os.write(fd, b"x" * 500)
            start = time.perf_counter()
            os.fdatasync(fd)
            times.append(time.perf_counter() - start)
    finally:
        os.close(fd)
        path.unlink()
    return sorted(times)[len(times) // 2] * 1e3


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--stores", default="sqlite,postgres")
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--concurrency", type=int, default=200)
    parser.add_argument("--dir", default=".bench-concurrency")
    parser.add_argument("--tree", action="append", help="a src/ folder holding tether (repeat to compare)")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--inner", nargs=2, help=argparse.SUPPRESS)  # store kind and where, in a child
    args = parser.parse_args()
    shape = (args.runs, args.turns, args.latency, args.concurrency)
    if args.inner:
        print(json.dumps(drive(args.inner[0], args.inner[1], *shape)))
        return 0
    ideal = args.runs * args.turns * args.latency / args.concurrency
    base = baseline(*shape)
    trees: list[str | None] = list(args.tree) if args.tree else [None]
    rows = []
    for _ in range(args.repeat):
        for kind in args.stores.split(","):
            for tree in trees:  # interleaved: each tree meets the machine's load of the moment
                sync = _sync_ms(str(Path(args.dir).resolve()) + "-probe")
                row = _one_store(args, tree, kind)
                if row is not None:
                    rows.append((kind, tree or "src", sync, row))
    shutil.rmtree(str(Path(args.dir).resolve()) + "-probe", ignore_errors=True)
    print(
        f"python {sys.version.split()[0]}; {args.runs} runs x {args.turns} turns, model latency "
        f"{args.latency * 1e3:.0f} ms, concurrency {args.concurrency}"
    )
    print(
        f"ideal {ideal:.2f} s; baseline (asyncio alone, same schedule) {base:.2f} s = {base / ideal:.2f}x ideal"
    )
    print(
        "store    tree                       seconds  x ideal  runs/s  cpu s  MB/in-flight run  peak threads"
        "  fdatasync ms  statuses"
    )
    for kind, tree, sync, row in rows:
        per_run = (row["peak_mb"] - row["before_mb"]) / args.concurrency
        print(
            f"{kind:8} {tree[-26:]:26} {row['seconds']:8.2f} {row['seconds'] / ideal:7.2f}x"
            f" {args.runs / row['seconds']:7.0f} {row['cpu']:6.2f} {per_run:17.3f} {row['threads_peak']:13d}"
            f" {sync:13.2f}  {row['statuses']}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
