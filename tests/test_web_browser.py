"""The run inspector in a real headless browser: Playwright driving Debian's Chromium (/usr/bin/chromium).

Never ``playwright install``: the browser is the system's. Skipped when it is absent, unless
``TETHER_REQUIRE_BROWSER=1`` (set by ``.ci/run``), which makes its absence a failure. Screenshots go to
``tmp_path`` (and to ``$TETHER_SCREENSHOTS`` when set).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tether import SQLiteStore
from tether import journal as j

CHROMIUM = Path("/usr/bin/chromium")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]
TESTS = Path(__file__).parent


def _need_browser() -> None:
    required = os.environ.get("TETHER_REQUIRE_BROWSER") == "1"
    problem = None
    if not CHROMIUM.exists():
        problem = f"no Chromium at {CHROMIUM} (apt-get install chromium)"
    else:
        try:
            import playwright.sync_api  # noqa: F401
            import uvicorn  # noqa: F401
        except ImportError as exc:
            problem = f"{exc.name} is not installed (pip install -e '.[dev]')"
    if problem is not None:
        if required:
            pytest.fail(f"TETHER_REQUIRE_BROWSER=1 but {problem}")
        pytest.skip(f"browser tests need a browser: {problem}")


@pytest.fixture
def runs(tmp_path: Path) -> SQLiteStore:
    return SQLiteStore(tmp_path / "runs.db")


@pytest.fixture
def seeded(runs: SQLiteStore) -> SQLiteStore:
    """The store with ``_web_runs.seed``'s runs, made before Playwright's event loop starts."""
    sys.path.insert(0, str(TESTS))
    from _web_runs import seed

    seed(runs)
    return runs


def off_loop(fn: Any) -> Any:
    """``fn()`` on a thread of its own: sync Playwright keeps an event loop running on this one."""
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(fn()))
    thread.start()
    thread.join(60)
    assert out, "the call did not finish"
    return out[0]


@pytest.fixture
def server(runs: SQLiteStore) -> Iterator[str]:
    _need_browser()
    import uvicorn

    from tether.web import create_app

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = uvicorn.Config(
        create_app(runs, user="carol", token="tok"),
        host="127.0.0.1",
        port=port,
        log_level="warning",
        timeout_graceful_shutdown=1,
    )
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not srv.started:
        assert time.monotonic() < deadline, "the inspector did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    srv.should_exit = True
    thread.join(5)


@pytest.fixture
def page(server: str) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS, headless=True)
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        tab = context.new_page()
        tab.set_default_timeout(15000)
        errors: list[str] = []
        tab.on("pageerror", lambda exc: errors.append(str(exc)))
        tab.goto(f"{server}/?token=tok")
        yield tab
        context.close()
        browser.close()
        assert not errors, f"JavaScript errors in the page: {errors}"


def shot(tab: Any, tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    tab.screenshot(path=str(path), full_page=True)
    keep = os.environ.get("TETHER_SCREENSHOTS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(keep) / name)
    return path


def test_the_list(seeded: SQLiteStore, page: Any, server: str, tmp_path: Path) -> None:
    page.goto(f"{server}/")
    assert "token=" not in page.url  # the token went into the cookie
    banner = page.locator("#waiting")
    assert banner.is_visible() and "1 run waiting for a decision" in banner.inner_text()
    rows = page.locator("table.runs tbody tr")
    assert rows.count() == 3
    assert page.locator("tr.st-waiting").count() == 1
    page.fill("input[name=meta]", "user=u42")
    page.click("form.filters button")
    page.wait_for_url("**/?*meta=user%3Du42*")
    assert page.locator("table.runs tbody tr").count() == 1
    page.goto(f"{server}/")
    assert shot(page, tmp_path, "runs.png").stat().st_size > 0


def test_a_live_run_gains_entries_without_a_reload(
    runs: SQLiteStore, page: Any, server: str, tmp_path: Path
) -> None:
    db = tmp_path / "runs.db"
    script = textwrap.dedent(
        f"""
        import time
        from tether import Agent, SQLiteStore, tool
        from tether.testing import ScriptedModel, call

        @tool(effect="read_only")
        def slow_lookup(q: str) -> str:
            "Look something up, slowly."
            time.sleep(3)
            return "found " + q

        agent = Agent(ScriptedModel([call("slow_lookup", q="tides"), "high tide at 6"]), name="slow",
                      tools=[slow_lookup], store=SQLiteStore({str(db)!r}))
        agent.run("When is high tide?", id="live1")
        """
    )
    other = subprocess.Popen([sys.executable, "-c", script])
    try:
        deadline = time.monotonic() + 20
        while not runs.exists("live1") or not any(e.kind == "tool_started" for e in runs.read("live1")):
            assert time.monotonic() < deadline, "the other process did not start the run"
            time.sleep(0.05)
        page.goto(f"{server}/runs/live1")
        page.evaluate("window.__notReloaded = true")
        assert page.locator('#timeline tr[data-seq] td.kind:text-is("run_stopped")').count() == 0
        page.locator('#timeline td.kind:text-is("run_stopped")').wait_for()
        page.locator('#timeline td.kind:text-is("tool_finished")').wait_for()
        assert page.evaluate("window.__notReloaded") is True
        page.locator("#status:text-is('completed')").wait_for()  # the panels refreshed too
        page.locator("#live:text-is('finished')").wait_for()
        shot(page, tmp_path, "run_live.png")
    finally:
        assert other.wait(30) == 0
    stopped = runs.load("live1")
    assert stopped.status == "completed"
    rows = page.locator("#timeline tr[data-seq]")
    assert rows.count() == len(stopped.history)
    assert rows.first.get_attribute("data-seq") == str(stopped.history[-1].seq)  # newest first


def test_an_approval_clicked_in_the_page(seeded: SQLiteStore, page: Any, server: str, tmp_path: Path) -> None:
    from _web_runs import refund_agent

    runs = seeded
    page.goto(f"{server}/")
    page.click("#waiting a.badge")
    page.wait_for_url("**/runs/w1")
    pending = page.locator("#pending")
    assert pending.is_visible() and "refund" in pending.inner_text()
    page.fill("#pending input[name=reason]", "the photos show the damage")
    shot(page, tmp_path, "run_waiting.png")
    page.click("#pending button.approve")
    page.wait_for_url("**/runs/w1?done=*")
    assert "approved by carol" in page.locator("#flash").inner_text()
    (decided,) = [e for e in runs.load("w1").history if isinstance(e, j.ApprovalDecided)]
    assert (decided.approved, decided.by, decided.reason) == (True, "carol", "the photos show the damage")
    page.evaluate("window.__notReloaded = true")
    done = off_loop(lambda: refund_agent(runs).resume("w1"))  # a driver elsewhere; the open page follows
    assert done.status == "completed"
    page.locator('#timeline td.kind:text-is("run_stopped")').wait_for()
    page.locator("#status:text-is('completed')").wait_for()
    assert page.evaluate("window.__notReloaded") is True
    assert "refunded 500" in page.locator("table.calls").first.inner_text()
    shot(page, tmp_path, "run_approved.png")
