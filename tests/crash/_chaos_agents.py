"""Agents, worker processes and PostgreSQL helpers for the store, worker and chaos tests.

    python tests/crash/_chaos_agents.py worker STORE_URL SIDE_FILE AGENT [TTL] [CONCURRENCY]
    python tests/crash/_chaos_agents.py approver STORE_URL SIDE_FILE STOP_FILE
    python tests/crash/_chaos_agents.py messenger STORE_URL SIDE_FILE STOP_FILE

``worker`` runs a ``Worker`` for one agent (``chaos``, ``hold`` or ``pause``) until SIGTERM, logging to
stderr. ``approver`` approves every pending call of waiting runs, ``messenger`` posts messages to random
runs (then settles them, as posting commands do); both record each posted item in ``SIDE_FILE.posts`` and
stop when STOP_FILE exists. Tools record each execution in the side file (``ExecutionLog``): start and end
events with run, call id, attempt, effect, idempotency key, pid, time, and the lease token and writer the
run had when the tool started. STORE_URL is ``postgresql://...`` or ``sqlite:///path``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tether import Agent, ModelReply, ModelRequest, ToolContext, tool
from tether.stores.base import Store
from tether.testing import ExecutionLog

BASE_DSN = os.environ.get("TETHER_TEST_POSTGRES_DSN", "postgresql://root@127.0.0.1:5432/test")
"""The server the tests use (trust auth); a fresh schema per test module."""


# --------------------------------------------------------------------------------------------------
# PostgreSQL: reachable or skipped (failed when TETHER_REQUIRE_POSTGRES=1), a fresh schema per module


def postgres_or_skip() -> str:
    """The base DSN when a server answers; otherwise skip (or fail under ``TETHER_REQUIRE_POSTGRES=1``)."""
    required = os.environ.get("TETHER_REQUIRE_POSTGRES") == "1"
    try:
        import psycopg

        with psycopg.connect(BASE_DSN, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except Exception as exc:
        reason = f"no PostgreSQL at {BASE_DSN} ({type(exc).__name__}: {str(exc).strip()[:200]})"
        if required:
            pytest.fail(f"{reason}; TETHER_REQUIRE_POSTGRES=1 requires one", pytrace=False)
        pytest.skip(f"{reason}; set TETHER_TEST_POSTGRES_DSN or start the server")
    return BASE_DSN


def in_schema(dsn: str, schema: str, **params: str) -> str:
    """``dsn`` with tether's ``schema`` parameter and ``search_path`` both ``schema`` (and more URL
    parameters): the store keeps its tables there, and a raw connection (``libpq(dsn)``) finds them."""
    from urllib.parse import urlencode

    query = urlencode({"options": f"-csearch_path={schema}", "schema": schema, **params})
    return f"{dsn}{'&' if '?' in dsn else '?'}{query}"


def libpq(dsn: str) -> str:
    """``dsn`` without tether's ``schema`` parameter, for ``psycopg.connect`` (libpq refuses it)."""
    from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

    parts = urlsplit(dsn)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "schema"]
    return urlunsplit(parts._replace(query=urlencode(query)))


@contextlib.contextmanager
def fresh_schema(prefix: str = "tether_test") -> Iterator[str]:
    """Create ``<prefix>_<random>``, yield a DSN using it, drop it afterwards."""
    import psycopg

    base = postgres_or_skip()
    schema = f"{prefix}_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        yield in_schema(base, schema)
    finally:
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def open_test_store(url: str, ttl: float = 30.0, **kw: Any) -> Store:
    if url.startswith("postgres"):
        from tether.stores.postgres import PostgresStore

        return PostgresStore(url, ttl=ttl, **kw)
    from tether.stores.sqlite import SQLiteStore

    return SQLiteStore(url.removeprefix("sqlite:///"), ttl=ttl)


def lease_of(store: Store, run_id: str) -> tuple[int, str | None]:
    """The run's current lease token and holder's writer id, read straight from the store's tables."""
    sql = "SELECT lease_token, lease_owner FROM runs WHERE id = %s"
    if hasattr(store, "_conninfo"):
        row = store._run(lambda cx, _: cx.one(sql, (run_id,)))  # type: ignore[attr-defined]
        owner = row[1]
    else:
        import orjson

        row = store._conn().execute(sql.replace("%s", "?"), (run_id,)).fetchone()  # type: ignore[attr-defined]
        owner = orjson.loads(row[1]) if row[1] else None
    return int(row[0]), (owner or {}).get("writer")


# --------------------------------------------------------------------------------------------------
# Agents


class PlanModel:
    """Replies by request index from a plan of tool calls; past the plan, a final answer."""

    def __init__(self, plan: list[list[tuple[str, dict[str, Any]]]], delay: float = 0.0) -> None:
        self.plan, self.delay, self.name = plan, delay, "plan"

    async def request(self, request: ModelRequest, on_text: Any = None) -> ModelReply:
        if self.delay:
            await asyncio.sleep(random.uniform(0, self.delay))
        usage = {"input_tokens": 10, "output_tokens": 5}
        if request.index >= len(self.plan):
            return ModelReply([{"type": "text", "text": "done"}], "end_turn", usage)
        calls = [
            {"type": "tool_call", "name": name, "args": args, "provider_call_id": f"p{request.index}_{i}"}
            for i, (name, args) in enumerate(self.plan[request.index])
        ]
        return ModelReply(calls, "tool_use", usage)


def make_agent(kind: str, store: Store, side: str | os.PathLike[str], ttl: float | None = None) -> Agent:
    """The agent ``kind`` on ``store``; its tools record each execution in the side file ``side``."""
    log = ExecutionLog(side)
    side_path = Path(side)

    def record(event: str, ctx: ToolContext, effect: str, **more: Any) -> None:
        fields: dict[str, Any] = {}
        if event == "start":
            token, writer = lease_of(store, ctx.run_id)
            fields = {"token": token, "writer": writer}
        log.record(
            event=event, tool=ctx.tool, run_id=ctx.run_id, call_id=ctx.call_id, attempt=ctx.attempt,
            key=ctx.idempotency_key, effect=effect, t=time.time(), **fields, **more,
        )  # fmt: skip

    def wait_release(limit: float = 60.0) -> bool:
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            if Path(f"{side_path}.release").exists():
                return True
            time.sleep(0.01)
        return False

    @tool(effect="idempotent")
    def step(n: int, ctx: ToolContext) -> str:
        """A step that may run again (idempotent)."""
        record("start", ctx, "idempotent")
        time.sleep(random.uniform(0.05, 0.4))
        record("end", ctx, "idempotent")
        return f"step {n} done"

    @tool(effect="unsafe")
    def charge(amount: int, ctx: ToolContext) -> str:
        """Charge a card (unsafe: never twice)."""
        record("start", ctx, "unsafe")
        time.sleep(random.uniform(0.05, 0.3))
        record("end", ctx, "unsafe")
        return f"charged {amount}"

    @tool(effect="unsafe", approval=True)
    def ship(item: str, ctx: ToolContext) -> str:
        """Ship an item (unsafe, needs a person's approval)."""
        record("start", ctx, "unsafe")
        time.sleep(random.uniform(0.05, 0.2))
        record("end", ctx, "unsafe")
        return f"shipped {item}"

    @tool(effect="unsafe")
    def hold(ctx: ToolContext) -> str:
        """Blocks until the release file exists (unsafe)."""
        record("start", ctx, "unsafe")
        released = wait_release()
        record("end", ctx, "unsafe", released=released)
        return "held"

    @tool(effect="idempotent")
    def hold_idem(ctx: ToolContext) -> str:
        """Blocks until the release file exists (idempotent)."""
        record("start", ctx, "idempotent")
        released = wait_release()
        record("end", ctx, "idempotent", released=released)
        return f"held on attempt {ctx.attempt}"

    @tool(effect="idempotent")
    def slow_step(ctx: ToolContext) -> str:
        """Takes 1.5 s (idempotent)."""
        record("start", ctx, "idempotent")
        time.sleep(1.5)
        record("end", ctx, "idempotent")
        return "slow step done"

    @tool(effect="unsafe")
    def after_step(ctx: ToolContext) -> str:
        """Runs after slow_step (unsafe)."""
        record("start", ctx, "unsafe")
        record("end", ctx, "unsafe")
        return "after step done"

    plans: dict[str, tuple[list[list[tuple[str, dict[str, Any]]]], list[Any]]] = {
        "chaos": (
            [
                [("step", {"n": 0}), ("charge", {"amount": 1})],
                [("ship", {"item": "book"})],
                [("step", {"n": 1})],
            ],
            [step, charge, ship],
        ),
        "hold": ([[("hold", {}), ("hold_idem", {})]], [hold, hold_idem]),
        "pause": ([[("slow_step", {})], [("after_step", {})]], [slow_step, after_step]),
        "simple": ([[("step", {"n": 0})]], [step]),
    }
    plan, tools = plans[kind]
    return Agent(
        PlanModel(plan, delay=0.05 if kind == "chaos" else 0.0),
        name=kind,
        tools=tools,
        store=store,
        poll_interval=0.2,
        lease_ttl=ttl,
    )


# --------------------------------------------------------------------------------------------------
# Processes


def _worker(url: str, side: str, kind: str, ttl: float, concurrency: int) -> None:
    from tether.worker import Worker

    store = open_test_store(url, ttl=ttl)
    agent = make_agent(kind, store, side, ttl)
    Worker([agent], store, concurrency=concurrency, lease_ttl=ttl, poll_interval=0.3).run(
        install_signal_handlers=True
    )
    store.close()
    print("WORKER EXIT", flush=True)


def _post(url: str, side: str, stop: str, role: str) -> None:
    """Approve pending calls (``approver``) or post messages (``messenger``) until ``stop`` exists."""
    store = open_test_store(url)
    posts = ExecutionLog(f"{side}.posts")
    rng = random.Random(os.getpid())
    count = 0
    while not Path(stop).exists():
        if role == "approver":
            for info in store.list(status="waiting", limit=1000):
                state = store.load(info.id)
                for pending in state.pending_approvals:
                    with contextlib.suppress(ValueError):
                        state.approve(pending.call_id, by="approver", run_id=pending.run_id)
                changes = state.take_local_changes()
                for item in changes:
                    posts.record(run_id=info.id, item_id=item.get("item_id"), type="decision")
                if changes:
                    store.save(state)
            time.sleep(0.2)
            continue
        runs = store.list(limit=1000)
        if not runs:
            time.sleep(0.1)
            continue
        info = rng.choice(runs)
        item_id = f"msg-{os.getpid()}-{count}"
        count += 1
        history = store.read(info.id)
        item = {
            "type": "message", "role": "user", "content": [{"type": "text", "text": f"note {item_id}"}],
            "seen_seq": len(history), "run_h": history[0].h,
        }  # fmt: skip
        posts.record(run_id=info.id, item_id=item_id, type="message", event="posting")
        store.post(info.id, item, item_id=item_id)
        posts.record(run_id=info.id, item_id=item_id, type="message", event="posted")
        store.settle(info.id)
        time.sleep(rng.uniform(0.05, 0.25))
    store.close()


def main(argv: list[str]) -> None:
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.INFO,
        format="%(asctime)s %(process)d %(name)s %(levelname)s %(message)s",
    )
    mode, url, side = argv[0], argv[1], argv[2]
    if mode == "worker":
        ttl = float(argv[4]) if len(argv) > 4 else 5.0
        _worker(url, side, argv[3], ttl, int(argv[5]) if len(argv) > 5 else 4)
    else:
        _post(url, side, argv[3], mode)


if __name__ == "__main__":
    main(sys.argv[1:])
