"""Closing a PostgresStore that ``agent.run`` (the sync face over the thread's event loop) used.

The thread's loop stays open between runs, and its async pool with it; ``store.close()`` closes that pool
too, so its connections end at once and no pending pool task is reported when the loop is collected.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).with_name("crash")))

from _chaos_agents import fresh_schema, libpq

pytest.importorskip("psycopg", reason="psycopg is not installed. Fix: pip install 'tether[postgres]'")
import psycopg

SCRIPT = textwrap.dedent(
    """
    import sys
    import time
    import psycopg
    from tether import Agent, tool
    from tether.stores.postgres import PostgresStore
    from tether.testing import ScriptedModel, call

    dsn, plain, app = sys.argv[1], sys.argv[2], sys.argv[3]

    @tool
    def echo(x: int) -> int:
        "Echo x."
        return x

    def ours() -> int:
        with psycopg.connect(plain, autocommit=True) as conn:
            return conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (app,)
            ).fetchone()[0]

    def ours_after_close() -> int:
        # a closed connection's backend leaves pg_stat_activity a moment after the socket closes; one
        # left open (before the fix, until the process exited) is still there after 5 seconds
        deadline = time.monotonic() + 5
        while (left := ours()) and time.monotonic() < deadline:
            time.sleep(0.05)
        return left

    for i in range(2):  # two stores in turn on the same thread's loop
        store = PostgresStore(dsn)
        agent = Agent(ScriptedModel([call("echo", x=i), "done"]), tools=[echo], store=store)
        assert agent.run("go").status == "completed"
        assert ours() > 0  # the run's connections are there until the store is closed
        store.close()
        print("open after close:", ours_after_close(), flush=True)
    """
)


def test_close_ends_the_async_pool_agent_run_left_on_the_threads_loop() -> None:
    app = f"tether-close-{uuid.uuid4().hex[:8]}"
    with fresh_schema("tether_test_close") as dsn:
        with_app = f"{dsn}&application_name={app}"
        done = subprocess.run(
            [sys.executable, "-c", SCRIPT, with_app, libpq(dsn), app],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines() == ["open after close: 0", "open after close: 0"], done.stdout
        assert "Task was destroyed but it is pending" not in done.stderr, done.stderr
        with psycopg.connect(libpq(dsn), autocommit=True) as conn:
            left = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (app,))
            assert left.fetchone() == (0,)
