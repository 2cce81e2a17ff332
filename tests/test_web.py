"""The run inspector (DESIGN 17) through Starlette's TestClient: every route, auth, CSRF, escaping."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("starlette")
pytest.importorskip("jinja2")

from starlette.testclient import TestClient

from _web_runs import EVIL, seed
from tether import SQLiteStore
from tether import journal as j
from tether.web import COOKIE, create_app


@pytest.fixture
def runs(tmp_path: Path) -> SQLiteStore:
    return SQLiteStore(tmp_path / "runs.db")


@pytest.fixture
def client(runs: SQLiteStore) -> TestClient:
    seed(runs)
    return TestClient(create_app(runs, user="alice"))


def csrf(client: TestClient, path: str = "/runs/page1") -> str:
    found = re.search(r'name="csrf_token" value="([^"]+)"', client.get(path).text)
    assert found, "no CSRF token in the page"
    return found.group(1)


def test_list_newest_first_waiting_runs_stand_out(client: TestClient) -> None:
    page = client.get("/")
    assert page.status_code == 200
    text = page.text
    assert text.index("/runs/m1") < text.index("/runs/page1") < text.index('href="/runs/w1">w1</a></td>')
    assert 'class="waiting-banner"' in text and "1 run waiting for a decision" in text
    assert 'class="run root st-waiting"' in text


def listed(text: str) -> list[str]:
    """The run ids in the runs table, in order."""
    return re.findall(r'<td class="id">(?:<span class="fold">↳</span>)?<a href="/runs/([^"]+)">', text)


def test_list_filters(client: TestClient) -> None:
    assert listed(client.get("/").text) == ["m1", "page1", "w1"]
    assert listed(client.get("/?meta=user=u42").text) == ["m1"]
    assert listed(client.get("/?meta=user=nobody").text) == []
    assert listed(client.get("/?status=waiting").text) == ["w1"]
    assert listed(client.get("/?agent=reader").text) == ["page1"]
    assert listed(client.get("/?agent=reader&status=waiting").text) == []
    assert "not KEY=VALUE" in client.get("/?meta=oops").text
    found = client.get("/?id=page1", follow_redirects=False)
    assert found.status_code == 303 and found.headers["location"].endswith("/runs/page1")
    assert client.get("/?id=nope").status_code == 404


def test_keyset_paging(runs: SQLiteStore, monkeypatch: pytest.MonkeyPatch) -> None:
    from tether import Agent
    from tether.testing import ScriptedModel
    from tether.web import app as web_app

    monkeypatch.setattr(web_app, "PAGE_SIZE", 2)
    for n in range(5):
        Agent(ScriptedModel(["ok"]), name="a", store=runs).run(f"run {n}", id=f"p{n}")
    client = TestClient(create_app(runs))
    seen: list[str] = []
    url = "/"
    for _ in range(5):
        text = client.get(url).text
        seen += listed(text)
        more = re.search(r'id="next" href="([^"]+)"', text)
        if more is None:
            break
        url = "/" + more.group(1).replace("&amp;", "&")
    assert seen == ["p4", "p3", "p2", "p1", "p0"]


def test_subagent_runs_fold_under_their_root(runs: SQLiteStore) -> None:
    from tether import Agent
    from tether.testing import ScriptedModel, call

    child = Agent(ScriptedModel(["child answer"]), name="helper", description="Helps.")
    parent = Agent(
        ScriptedModel([call("helper", prompt="help"), "parent done"]), name="boss", tools=[child], store=runs
    )
    parent.run("go", id="boss1")
    kids = runs.list(parent_id="boss1")
    assert kids
    text = TestClient(create_app(runs)).get("/").text
    root_at = text.index('href="/runs/boss1">boss1</a>')
    child_at = text.index(f'<span class="fold">↳</span><a href="/runs/{kids[0].id}">')
    assert root_at < child_at


def test_run_page_shows_calls_open_calls_and_pending(client: TestClient) -> None:
    text = client.get("/runs/w1").text
    assert "Waiting for a decision (1)" in text
    assert "refund(amount=500, note=&#34;damaged&#34;)" in text or "refund(amount=500" in text
    assert "a resume will" in text and "nothing until the pending approvals are decided" in text
    assert "Open calls, and what a resume does with each" in text
    assert "approval_requested" in text and 'data-seq="' in text
    done = client.get("/runs/page1").text
    assert "fetch_page" in done and "read_only" in done and "badge out-done" in done
    assert client.get("/runs/nope").status_code == 404


def test_tool_result_html_is_escaped(client: TestClient) -> None:
    text = client.get("/runs/page1").text
    assert EVIL not in text and "<script>alert" not in text
    assert "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;" in text


def test_security_headers(client: TestClient) -> None:
    for path in ("/", "/runs/w1", "/static/style.css"):
        response = client.get(path)
        csp = response.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "default-src 'none'" in csp and "unsafe-inline" not in csp
        assert response.headers["referrer-policy"] == "no-referrer"
    assert "<script>" not in client.get("/").text.replace('<script src="', "")  # no inline script


def test_approve_with_reason_and_edited_args_is_journaled_with_by(
    runs: SQLiteStore, client: TestClient
) -> None:
    call_id = runs.load("w1").pending_approvals[0].call_id
    token = csrf(client, "/runs/w1")
    response = client.post(
        "/runs/w1/approve",
        data={
            "csrf_token": token,
            "call_id": call_id,
            "run_id": "w1",
            "reason": "half is fair",
            "args": '{"amount": 250, "note": "damaged"}',
        },
        follow_redirects=False,
    )
    assert response.status_code == 303
    (decided,) = [e for e in runs.load("w1").history if isinstance(e, j.ApprovalDecided)]
    assert (decided.approved, decided.by, decided.reason, decided.args) == (
        True,
        "alice",
        "half is fair",
        {"amount": 250, "note": "damaged"},
    )
    page = client.get(response.headers["location"]).text
    assert f"call {call_id} approved by alice" in page
    again = client.post("/runs/w1/approve", data={"csrf_token": token, "call_id": call_id, "run_id": "w1"})
    assert again.status_code == 400 and "problem" in again.text


def test_approve_unchanged_args_records_no_edit(runs: SQLiteStore, client: TestClient) -> None:
    call_id = runs.load("w1").pending_approvals[0].call_id
    client.post(
        "/runs/w1/approve",
        data={
            "csrf_token": csrf(client),
            "call_id": call_id,
            "run_id": "w1",
            "args": '{"amount": 500, "note": "damaged"}',
        },
    )
    (decided,) = [e for e in runs.load("w1").history if isinstance(e, j.ApprovalDecided)]
    assert decided.approved and decided.args is None


def test_bad_edited_args_are_refused(runs: SQLiteStore, client: TestClient) -> None:
    call_id = runs.load("w1").pending_approvals[0].call_id
    for bad, why in (("{nope", "not JSON"), ("[1]", "not a JSON object")):
        response = client.post(
            "/runs/w1/approve",
            data={"csrf_token": csrf(client), "call_id": call_id, "run_id": "w1", "args": bad},
        )
        assert response.status_code == 400 and why in response.text
    assert runs.load("w1").pending_approvals


def test_deny_with_reason(runs: SQLiteStore, client: TestClient) -> None:
    call_id = runs.load("w1").pending_approvals[0].call_id
    response = client.post(
        "/runs/w1/deny",
        headers={"X-CSRF-Token": csrf(client)},
        data={"call_id": call_id, "run_id": "w1", "reason": "no refunds on sale items"},
        follow_redirects=False,
    )
    assert response.status_code == 303
    (decided,) = [e for e in runs.load("w1").history if isinstance(e, j.ApprovalDecided)]
    assert (decided.approved, decided.by, decided.reason) == (False, "alice", "no refunds on sale items")


def test_post_without_csrf_is_403_and_acts_not(runs: SQLiteStore, client: TestClient) -> None:
    call_id = runs.load("w1").pending_approvals[0].call_id
    before = runs.length("w1")
    for path, data in (
        ("/runs/w1/approve", {"call_id": call_id, "run_id": "w1"}),
        ("/runs/w1/deny", {"call_id": call_id, "run_id": "w1", "csrf_token": "forged"}),
        ("/runs/w1/cancel", {}),
        ("/runs/w1/fork", {}),
    ):
        assert client.post(path, data=data).status_code == 403
    assert runs.length("w1") == before and runs.inbox_length("w1") == 0
    assert len(runs.list()) == 3


def test_get_never_acts(runs: SQLiteStore, client: TestClient) -> None:
    before = (runs.length("w1"), runs.inbox_length("w1"), len(runs.list()))
    for path in ("/runs/w1/approve", "/runs/w1/deny", "/runs/w1/cancel", "/runs/w1/fork"):
        assert client.get(path).status_code in (404, 405)
    assert (runs.length("w1"), runs.inbox_length("w1"), len(runs.list())) == before


def test_cancel(runs: SQLiteStore, client: TestClient) -> None:
    response = client.post("/runs/w1/cancel", data={"csrf_token": csrf(client)}, follow_redirects=False)
    assert response.status_code == 303
    state = runs.load("w1")
    assert state.status == "cancelled"
    (asked,) = [e for e in state.history if isinstance(e, j.CancelRequested)]
    assert asked.by == "alice"


def test_fork_at_a_turn(runs: SQLiteStore, client: TestClient) -> None:
    response = client.post(
        "/runs/page1/fork", data={"csrf_token": csrf(client), "at_seq": "5"}, follow_redirects=False
    )
    assert response.status_code == 303
    made = response.headers["location"].split("/runs/")[1].split("?")[0]
    started = runs.load(made).history[0]
    assert isinstance(started, j.RunStarted) and started.forked_from == {"id": "page1", "seq": 5}
    bad = client.post("/runs/page1/fork", data={"csrf_token": csrf(client), "at_seq": "999"})
    assert bad.status_code == 400


def test_token_cookie_flow(runs: SQLiteStore) -> None:
    seed(runs)
    client = TestClient(create_app(runs, token="s3cret"))
    assert client.get("/").status_code == 401
    assert client.get("/runs/w1").status_code == 401
    assert client.get("/?token=wrong").status_code == 401
    opened = client.get("/?token=s3cret&status=waiting", follow_redirects=False)
    assert opened.status_code == 303 and opened.headers["location"] == "/?status=waiting"
    cookie = opened.headers["set-cookie"]
    assert (
        f"{COOKIE}=s3cret" in cookie
        and "HttpOnly" in cookie
        and "SameSite=strict" in cookie.replace("Strict", "strict")
    )
    assert client.get("/").status_code == 200  # the cookie now
    stranger = TestClient(create_app(runs, token="s3cret"))
    assert stranger.post("/runs/w1/cancel", data={}).status_code == 401


def test_user_header_behind_a_proxy(runs: SQLiteStore) -> None:
    seed(runs)
    client = TestClient(create_app(runs, user="ignored", user_header="X-Forwarded-User"))
    token = csrf(client)
    assert client.post("/runs/w1/cancel", data={"csrf_token": token}).status_code == 403
    client.post("/runs/w1/cancel", data={"csrf_token": token}, headers={"X-Forwarded-User": "bob"})
    (asked,) = [e for e in runs.load("w1").history if isinstance(e, j.CancelRequested)]
    assert asked.by == "bob"


def test_sse_yields_entries(runs: SQLiteStore, client: TestClient) -> None:
    with client.stream("GET", "/runs/page1/events?after=-1") as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        body = "".join(response.iter_text())
    kinds = [e.kind for e in runs.load("page1").history]
    assert body.count("event: entry") == len(kinds)
    assert "event: end" in body and '"kind": "run_stopped"' in body
    assert "<script>alert" not in body  # rows come escaped
    with client.stream("GET", "/runs/page1/events?after=3") as response:
        later = "".join(response.iter_text())
    assert later.count("event: entry") == len(kinds) - 4 and "id: 3\n" not in later


def test_panels_fragment(client: TestClient) -> None:
    text = client.get("/runs/w1/panels").text
    assert "<html" not in text and "Waiting for a decision" in text


def test_import_tether_loads_no_web_framework() -> None:
    import subprocess
    import sys

    code = "import sys, tether; print([m for m in ('starlette', 'jinja2', 'uvicorn', 'tether.web') if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_mounted_under_a_prefix(runs: SQLiteStore) -> None:
    from starlette.applications import Starlette
    from starlette.routing import Mount

    seed(runs)
    host = Starlette(routes=[Mount("/inspect", app=create_app(runs, user="erin"))])
    client = TestClient(host)
    text = client.get("/inspect/").text
    assert 'href="/inspect/runs/w1"' in text and 'href="/inspect/static/style.css"' in text
    page = client.get("/inspect/runs/w1").text
    assert 'action="/inspect/runs/w1/cancel"' in page and 'data-events="/inspect/runs/w1/events"' in page
    token = re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)  # type: ignore[union-attr]
    done = client.post("/inspect/runs/w1/cancel", data={"csrf_token": token}, follow_redirects=False)
    assert done.status_code == 303 and done.headers["location"].startswith(
        "http://testserver/inspect/runs/w1"
    )
    assert runs.load("w1").status == "cancelled"


def test_tether_ui_prints_the_tokened_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import uvicorn
    from typer.testing import CliRunner

    from tether._cli.app import app

    seed(SQLiteStore(tmp_path / "ui.db"))
    served: dict[str, object] = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: served.update(app=app, **kw))
    result = CliRunner().invoke(app, ["ui", "--store", f"sqlite:///{tmp_path / 'ui.db'}", "--user", "zoe"])
    assert result.exit_code == 0, result.output
    found = re.search(r"http://127\.0\.0\.1:8765/\?token=(\S+)", result.output)
    assert found and served["host"] == "127.0.0.1" and served["port"] == 8765
    client = TestClient(served["app"])  # type: ignore[arg-type]
    assert client.get("/").status_code == 401
    opened = client.get(f"/?token={found.group(1)}")
    assert opened.status_code == 200 and "acting as <strong>zoe</strong>" in opened.text


def test_a_long_timeline_shows_its_newest_entries_first(
    client: TestClient, runs: SQLiteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tether.web import app as web_app

    monkeypatch.setattr(web_app, "TIMELINE_WINDOW", 3)
    seqs = [e.seq for e in runs.load("page1").history]
    text = client.get("/runs/page1").text
    shown = [int(s) for s in re.findall(r'<tr class="entry[^"]*" data-seq="(\d+)"', text)]
    assert shown == seqs[::-1][:3]
    earlier = re.search(r'href="(/runs/page1\?before=\d+)"', text)
    assert earlier
    older = client.get(earlier.group(1)).text
    assert [int(s) for s in re.findall(r'<tr class="entry[^"]*" data-seq="(\d+)"', older)] == seqs[::-1][3:6]


def test_a_subagent_call_is_decided_from_the_root_page(runs: SQLiteStore) -> None:
    from _web_runs import refund
    from tether import Agent
    from tether.testing import ScriptedModel, call

    child = Agent(
        ScriptedModel([call("refund", amount=9), "child done"]),
        name="clerk",
        tools=[refund],
        description="Refunds.",
    )
    boss = Agent(
        ScriptedModel([call("clerk", prompt="refund 9"), "boss done"]), name="boss", tools=[child], store=runs
    )
    state = boss.run("go", id="tree1")
    (pending,) = state.pending_approvals
    assert pending.run_id != "tree1"
    client = TestClient(create_app(runs, user="ivy"))
    page = client.get("/runs/tree1").text
    assert f'name="run_id" value="{pending.run_id}"' in page and "in subagent run" in page
    token = re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)  # type: ignore[union-attr]
    response = client.post(
        "/runs/tree1/approve",
        data={"csrf_token": token, "call_id": pending.call_id, "run_id": pending.run_id, "reason": "small"},
        follow_redirects=False,
    )
    assert response.status_code == 303
    posted = runs.read_inbox(pending.run_id)
    assert len(posted) == 1 and posted[0].body.get("by") == "ivy" and posted[0].body.get("reason") == "small"
