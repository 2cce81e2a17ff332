"""tether.mcp against real MCP servers (tests/_mcp_server.py, the official SDK) run as subprocesses."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tether import Agent, FileStore
from tether.mcp import MCPServerError, MCPTools
from tether.testing import ScriptedModel, call

SERVER = str(Path(__file__).with_name("_mcp_server.py"))


def executions(log: Path) -> list[dict[str, Any]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines()]


def finished(state: Any) -> list[Any]:
    return [e for e in state.history if e.kind == "tool_finished"]


def stdio(log: Path, **options: Any) -> MCPTools:
    return MCPTools(sys.executable, [SERVER, str(log)], **options)


def test_tools_offered_with_prefix_include_exclude(tmp_path: Path) -> None:
    model = ScriptedModel(["done"])
    source = stdio(tmp_path / "log", prefix="kv", include=["l*", "p*", "d*"], exclude=["die_*", "picture"])
    state = Agent(model, tools=[source]).run("hi")
    assert state.status == "completed"
    names = [t["name"] for t in model.requests[0].tools]
    assert names == ["kv_lookup", "kv_put", "kv_delete"]
    lookup = model.requests[0].tools[0]
    assert lookup["description"] == "Look a word up."
    assert lookup["parameters"]["properties"]["word"]["type"] == "string"
    assert lookup["parameters"]["required"] == ["word"]


def test_effects_from_annotations_and_overrides(tmp_path: Path) -> None:
    source = stdio(tmp_path / "log", effects={"delete": "idempotent"})

    async def effects() -> dict[str, str]:
        async with source.open_tools() as tools:
            return {t.name: t.effect for t in tools}

    import asyncio

    got = asyncio.run(effects())
    assert got["lookup"] == "read_only"
    assert got["put"] == "idempotent"
    assert got["broken"] == "unsafe"
    assert got["delete"] == "idempotent"  # the override wins


@pytest.mark.parametrize(
    ("approval", "asked"),
    [
        (False, set()),
        (True, {"lookup", "put", "delete"}),
        ("destructive", {"delete"}),  # put says destructiveHint=False; lookup is read-only
        (["put", "del*"], {"put", "delete"}),
    ],
)
def test_approval_modes(tmp_path: Path, approval: Any, asked: set[str]) -> None:
    log = tmp_path / "log"
    model = ScriptedModel(
        [[call("lookup", word="a"), call("put", key="k", value="v"), call("delete", key="k")], "ok"]
    )
    state = Agent(model, tools=[stdio(log, approval=approval)], store=FileStore(tmp_path / "runs")).run("go")
    waiting = {state.call(p.call_id).tool for p in state.pending_approvals}
    assert waiting == asked
    assert {e["tool"] for e in executions(log)} == {"lookup", "put", "delete"} - asked


def test_meta_results_and_is_error(tmp_path: Path) -> None:
    log = tmp_path / "log"
    model = ScriptedModel([[call("lookup", word="a"), call("broken"), call("picture")], "done"])
    state = Agent(model, tools=[stdio(log)]).run("go")
    assert state.status == "completed"
    by_tool = {state.call(e.call_id).tool: e for e in finished(state)}
    assert by_tool["lookup"].outcome == "done"
    assert by_tool["lookup"].content == [{"type": "text", "text": "a: a word"}]
    assert by_tool["broken"].outcome == "error"
    assert "no such key" in by_tool["broken"].content[0]["text"]
    assert by_tool["picture"].content == [
        {"type": "image", "media_type": "image/png", "data": "aGVsbG8="},
        {"type": "text", "text": '{"width":1,"height":2}'},
    ]
    lookup = next(e for e in executions(log) if e["tool"] == "lookup")
    call_id = by_tool["lookup"].call_id
    tether_meta = {k: v for k, v in lookup["meta"].items() if k.startswith("tether/")}
    assert tether_meta == {  # the SDK may add its own keys (traceparent, when OpenTelemetry is on)
        "tether/idempotency_key": f"tether:{state.id}:{call_id}",
        "tether/run_id": state.id,
        "tether/call_id": call_id,
    }


def test_server_stderr_does_not_leak(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    model = ScriptedModel([call("lookup", word="a"), "done"])
    Agent(model, tools=[stdio(tmp_path / "log")]).run("go")
    out, err = capfd.readouterr()
    assert "lookup noise" not in out + err


def test_server_that_cannot_start(tmp_path: Path) -> None:
    model = ScriptedModel(["done"])
    missing = MCPTools("/nonexistent/mcp-server", ["--flag"])
    with pytest.raises(MCPServerError, match=r"/nonexistent/mcp-server --flag could not start.*Fix: "):
        Agent(model, tools=[missing]).run("go")
    assert model.requests == []
    script = tmp_path / "bad.py"
    script.write_text("import sys\nprint('cannot open the database', file=sys.stderr)\nsys.exit(2)\n")
    with pytest.raises(MCPServerError) as info:
        Agent(model, tools=[MCPTools(sys.executable, [str(script)])]).run("go")
    assert "cannot open the database" in str(info.value)
    assert str(script) in str(info.value)
    assert model.requests == []


def test_connection_lost_mid_call_idempotent_retried_with_same_key(tmp_path: Path) -> None:
    log = tmp_path / "log"
    model = ScriptedModel([call("die_idempotent"), "done"])
    state = Agent(model, tools=[stdio(log)]).run("go")
    assert state.status == "completed"
    starts = [e for e in state.history if e.kind == "tool_started"]
    assert [e.attempt for e in starts] == [1, 2]
    assert starts[0].idempotency_key == starts[1].idempotency_key
    assert [e.outcome for e in finished(state)] == ["done"]
    runs = executions(log)
    assert len(runs) == 2  # once cut off, once after reconnecting
    assert runs[0]["pid"] != runs[1]["pid"]
    assert {r["meta"]["tether/idempotency_key"] for r in runs} == {starts[0].idempotency_key}


def test_connection_lost_mid_call_unsafe_aborted_not_rerun(tmp_path: Path) -> None:
    log = tmp_path / "log"
    model = ScriptedModel([call("die_unsafe"), "done"])
    state = Agent(model, tools=[stdio(log)]).run("go")
    assert state.status == "completed"
    (result,) = finished(state)
    assert result.outcome == "aborted"
    assert "may or may not have run" in result.content[0]["text"]
    assert len(executions(log)) == 1


def test_tool_set_joins_the_fingerprint(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "runs")
    log = tmp_path / "log"
    for run_id, exclude, changed in (("same", [], False), ("other", ["delete"], True)):
        model = ScriptedModel([call("lookup", word="a"), "done"])
        waiting = Agent(model, tools=[stdio(log, approval=True)], store=store).run("go", id=run_id)
        assert waiting.status == "waiting"
        waiting.approve(waiting.pending_approvals[0].call_id, by="test")
        store.save(waiting)
        again = Agent(model, tools=[stdio(log, approval=True, exclude=exclude)], store=store)
        resumed = again.resume(run_id)
        assert resumed.status == "completed"
        assert any(e.kind == "agent_changed" for e in resumed.history) is changed


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def http_server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    log = tmp_path / "http-log"
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, SERVER, str(log), "http", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        while True:  # until it accepts connections (pytest-timeout bounds the wait)
            if proc.poll() is not None:
                raise RuntimeError("the HTTP test server exited")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                import time

                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp", log
    finally:
        proc.kill()
        proc.wait()


def test_streamable_http(http_server: tuple[str, Path]) -> None:
    url, log = http_server
    model = ScriptedModel([[call("web_lookup", word="b"), call("web_broken")], "done"])
    state = Agent(model, tools=[MCPTools(url=url, prefix="web", headers={"X-Test": "1"})]).run("go")
    assert state.status == "completed"
    outcomes = {state.call(e.call_id).tool: e.outcome for e in finished(state)}  # the two finish in any order
    assert outcomes == {"web_lookup": "done", "web_broken": "error"}
    assert {e["meta"]["tether/run_id"] for e in executions(log)} == {state.id}


def test_http_server_that_cannot_connect() -> None:
    url = f"http://127.0.0.1:{_free_port()}/mcp"
    model = ScriptedModel(["done"])
    with pytest.raises(MCPServerError, match=f"{url} could not connect"):
        Agent(model, tools=[MCPTools(url=url)]).run("go")
    assert model.requests == []


def test_options_are_checked() -> None:
    with pytest.raises(ValueError, match=r"command .* or a url"):
        MCPTools()
    with pytest.raises(ValueError, match="effects"):
        MCPTools("x", effects={"a": "maybe"})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="approval"):
        MCPTools("x", approval="sometimes")


@pytest.mark.parametrize(
    ("tool", "runs", "outcome"),
    [("crash_read_only", 2, "done"), ("crash_idempotent", 2, "done"), ("crash_unsafe", 1, "aborted")],
)
def test_sigkill_of_the_driver_mid_call_recovered_by_effect(
    tmp_path: Path, tool: str, runs: int, outcome: str
) -> None:
    """The server SIGKILLs the driving process while the call runs; a new process resumes the run."""
    driver = str(Path(__file__).with_name("_mcp_driver.py"))
    log = tmp_path / "log"
    args = [sys.executable, driver, str(tmp_path / "runs"), str(log), tool]
    crashed = subprocess.run([*args, "run"], capture_output=True, text=True, timeout=60)
    assert crashed.returncode == -9, crashed.stderr
    assert len(executions(log)) == 1
    resumed = subprocess.run([*args, "resume"], capture_output=True, text=True, timeout=60)
    assert resumed.returncode == 0, resumed.stderr
    result = json.loads(resumed.stdout)
    assert result["status"] == "completed"
    assert result["outcomes"] == [outcome]
    runs_seen = executions(log)
    assert len(runs_seen) == runs  # counted on the server's side
    assert len(result["keys"]) == 1
    assert {r["meta"]["tether/idempotency_key"] for r in runs_seen} == set(result["keys"])
    if outcome == "aborted":
        assert "may or may not have run" in result["texts"][0]
    else:
        assert result["attempts"] == [1, 2]


def test_a_worker_drives_mcp_tools_and_lets_go_of_a_run_whose_server_fails(tmp_path: Path) -> None:
    from tether import Worker

    store = FileStore(tmp_path / "runs")
    log = tmp_path / "log"
    broken = Agent(ScriptedModel(["done"]), tools=[MCPTools("/nonexistent/mcp-server")], store=store)
    broken.submit("go", id="w1")
    Worker([broken], store, poll_interval=0.1).run(stop_when_idle=True)
    assert store.load("w1").status == "running"  # not driven: the server could not start
    agent = Agent(ScriptedModel([call("lookup", word="w"), "done"]), tools=[stdio(log)], store=store)
    Worker([agent], store, poll_interval=0.1).run(stop_when_idle=True)  # the lease was let go
    assert store.load("w1").status == "completed"
    assert [e["tool"] for e in executions(log)] == ["lookup"]


def test_http_server_lost_mid_call(http_server: tuple[str, Path]) -> None:
    """The HTTP server dies under an unsafe call: the call is aborted, the run goes on."""
    url, log = http_server
    model = ScriptedModel([call("die_unsafe"), "done"])
    state = Agent(model, tools=[MCPTools(url=url)]).run("go")
    assert state.status == "completed"
    (result,) = finished(state)
    assert result.outcome == "aborted"
    assert len(executions(log)) == 1


def test_server_that_never_answers_initialize(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tether.mcp

    monkeypatch.setattr(tether.mcp, "_CONNECT_TIMEOUT", 1.0)
    script = tmp_path / "silent.py"
    script.write_text(
        "import sys, time\nprint('silent server up', file=sys.stderr, flush=True)\ntime.sleep(60)\n"
    )
    model = ScriptedModel(["done"])
    with pytest.raises(MCPServerError, match="did not answer initialize") as info:
        Agent(model, tools=[MCPTools(sys.executable, [str(script)])]).run("go")
    assert "silent server up" in str(info.value)
    assert model.requests == []
