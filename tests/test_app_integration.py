"""Application integration (DESIGN 18) in one process: deps, metadata, idempotent starts, approvals that
depend on the arguments, approvals with edited arguments, ``@agent.tool`` and typed output.

What needs real processes (crashes, races, deps given again) is in ``tests/crash/test_app_crash.py``.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from typer.testing import CliRunner

from tether import Agent, FileStore, SQLiteStore, State, ToolContext, ask, deny, tool
from tether import journal as j
from tether._cli.app import app
from tether.stores.base import RunInfo, Store
from tether.testing import ScriptedModel, call
from tether.worker import Worker


@dataclass
class Deps:
    user: str
    seen: list[str]
    token: str = ""  # a secret: no tool returns it, so it must appear nowhere in the store


def _tool_texts(request: Any) -> str:
    for message in reversed(list(request.messages)):
        if message.role == "tool":
            return " | ".join(
                f"{r['outcome']}:"
                + "".join(b.get("text", "") for b in r["content"] if b.get("type") == "text")
                for r in message.content
            )
    return "no tool result"


def shop(store: Store | None, replies: list[Any], **options: Any) -> Agent[Deps]:
    """An agent with a refund tool (needs approval above 100) and a lookup tool reading ctx.deps."""
    agent: Agent[Deps] = Agent(
        ScriptedModel(replies), name="shop", store=store, deps_type=Deps, poll_interval=0.05, **options
    )

    @agent.tool(approval=lambda args: args["amount"] > 100)
    def refund(amount: int, ctx: ToolContext[Deps], note: str = "none") -> str:
        """Refund an amount."""
        ctx.deps.seen.append(f"refund {amount} {note} for {ctx.deps.user}")
        return f"refunded {amount}"

    @agent.tool(effect="read_only")
    def whoami(ctx: ToolContext[Deps]) -> str:
        """Who the run is for."""
        ctx.deps.seen.append(f"whoami {ctx.deps.user} {dict(ctx.metadata)}")
        return f"{ctx.deps.user} {ctx.metadata.get('tenant', '-')}"

    return agent


# --------------------------------------------------------------------------------------------------
# deps


def test_deps_reach_tools_and_subagents_and_are_never_journaled(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "runs")
    helper: Agent[Deps] = Agent(
        ScriptedModel([call("whoami"), "helped"]), name="helper", description="helps", deps_type=Deps
    )

    @helper.tool
    def whoami(ctx: ToolContext[Deps]) -> str:
        """Who the run is for."""
        ctx.deps.seen.append(f"helper sees {ctx.deps.user} {dict(ctx.metadata)} {ctx.deps.token}")
        return "helped"

    main = shop(store, [[call("whoami"), call("helper", prompt="help")], "done"], tools=[helper])
    deps = Deps("u1", [], token="secret-31337")
    state = main.run("go", id="r1", deps=deps, metadata={"tenant": "acme"})
    assert state.status == "completed"
    assert sorted(deps.seen) == [
        "helper sees u1 {'tenant': 'acme'} secret-31337",  # the parent's deps, the inherited metadata
        "whoami u1 {'tenant': 'acme'}",
    ]
    written = b"".join(p.read_bytes() for p in (tmp_path / "runs").iterdir())
    assert b"secret-31337" not in written and b"acme" in written
    child = [i for i in store.list() if i.parent_id == "r1"]
    assert [c.metadata for c in child] == [{"tenant": "acme"}]


def test_resume_takes_deps_again_and_a_run_without_deps_gets_none(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "runs")
    first = Deps("alice", [])
    agent = shop(store, [call("refund", amount=500), "done"])
    assert agent.run("refund", id="r1", deps=first).status == "waiting"
    state = store.load("r1")
    state.approve(state.pending_approvals[0].call_id, by="bob")
    store.save(state)
    second = Deps("carol", [])
    assert shop(store, [call("refund", amount=500), "done"]).resume("r1", deps=second).status == "completed"
    assert (first.seen, second.seen) == ([], ["refund 500 none for carol"])

    seen: list[Any] = []

    @tool
    def probe(ctx: ToolContext) -> str:
        """Look at the deps."""
        seen.append(ctx.deps)
        return "ok"

    Agent(ScriptedModel([call("probe"), "done"]), tools=[probe]).run("go")
    assert seen == [None]


def test_a_worker_makes_each_runs_deps_from_its_run_info(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "runs.db")
    agent = shop(store, [call("whoami"), "done"])
    given: list[RunInfo] = []

    async def factory(info: RunInfo) -> Deps:  # an async factory is awaited
        given.append(info)
        return Deps(info.metadata["user"], seen)

    seen: list[str] = []
    agent.submit("who am I?", id="w1", metadata={"user": "u1", "tenant": "t1"})
    agent.submit("who am I?", id="w2", metadata={"user": "u2", "tenant": "t1"})
    Worker([agent], store, deps=factory, poll_interval=0.05).run(stop_when_idle=True)
    assert sorted(info.id for info in given) == ["w1", "w2"]
    assert sorted(seen) == [
        "whoami u1 {'user': 'u1', 'tenant': 't1'}",
        "whoami u2 {'user': 'u2', 'tenant': 't1'}",
    ]
    assert {store.load(rid).status for rid in ("w1", "w2")} == {"completed"}
    with pytest.raises(TypeError, match=r"deps=.*not callable"):
        Worker([agent], store, deps="nope")  # type: ignore[arg-type]
    store.close()


# --------------------------------------------------------------------------------------------------
# metadata


def test_metadata_is_journaled_listed_and_checked(store: Store) -> None:
    agent = shop(store, ["hello", "hello again"])
    plain = agent.run("hi")
    tagged = agent.run("hi", metadata={"user": "u42", "tenant": "acme"})
    assert plain.history[0].metadata == {} and plain.metadata == {}  # type: ignore[attr-defined]
    assert tagged.history[0].metadata == {"user": "u42", "tenant": "acme"}  # type: ignore[attr-defined]
    assert store.load(tagged.id).metadata == {"user": "u42", "tenant": "acme"}
    assert [i.id for i in store.list(metadata={"user": "u42"})] == [tagged.id]
    assert {i.id: i.metadata for i in store.list()} == {plain.id: {}, tagged.id: tagged.metadata}
    page, _ = store.list_page(metadata={"tenant": "acme", "user": "u42"})
    assert [i.id for i in page] == [tagged.id]
    for bad, error, match in [
        ({"user": 42}, TypeError, "not a string to a string"),
        ({"": "x"}, ValueError, "empty key"),
        ({f"k{i}": "v" for i in range(65)}, ValueError, "65 pairs; at most 64"),
        ({"blob": "x" * 4100}, ValueError, "4104 bytes; at most 4096"),
        (["user"], TypeError, "dict of strings"),
    ]:
        with pytest.raises(error, match=match):
            agent.run("hi", metadata=bad)  # type: ignore[arg-type]
        with pytest.raises(error, match=match):
            agent.submit("hi", metadata=bad)  # type: ignore[arg-type]
    assert len(store.list()) == 2  # nothing was created by a refused call
    with pytest.raises(ValueError, match="metadata is set when a run is created"):
        agent.run(store.load(plain.id), metadata={"user": "late"})


def test_a_journal_written_before_metadata_loads_with_none() -> None:
    old = [
        {"seq": 0, "kind": "run_started", "at": "2025-01-01T00:00:00.000000Z", "agent": "a", "b": 1},
        {"seq": 1, "kind": "message", "at": "2025-01-01T00:00:00.000000Z", "content": [], "b": 0},
    ]
    for obj in old:
        obj["h"] = j.checksum(obj)
    state = State.replay("old", j.decode_journal("old", old))
    assert state.metadata == {} and "metadata" not in state.info()
    assert "metadata" not in j.entry_to_dict(state.history[0])  # written back unchanged


# --------------------------------------------------------------------------------------------------
# if_exists="resume"


def test_if_exists_resume_creates_then_resumes_and_refuses_another_prompt(store: Store) -> None:
    agent = shop(store, [call("whoami"), "done"])
    deps = Deps("u1", [])
    first = agent.run("who?", id="order-42", if_exists="resume", deps=deps, metadata={"user": "u1"})
    assert first.status == "completed" and len(deps.seen) == 1
    again = shop(store, []).run("who?", id="order-42", if_exists="resume", deps=deps, metadata={"user": "u1"})
    assert (again.id, again.status, again.answer) == ("order-42", "completed", "done")
    assert len(again.history) == len(first.history) and len(deps.seen) == 1  # nothing ran, nothing written
    with pytest.raises(ValueError, match=r"run order-42 exists and began with 'who\?', not 'refund me'"):
        agent.run("refund me", id="order-42", if_exists="resume")
    with pytest.raises(ValueError, match="exists with metadata"):
        agent.run("who?", id="order-42", if_exists="resume", metadata={"user": "u2"})
    with pytest.raises(ValueError, match="already exists"):
        agent.run("who?", id="order-42")  # the default keeps refusing
    with pytest.raises(ValueError, match="needs a prompt and the run's id"):
        agent.run("who?", if_exists="resume")
    with pytest.raises(ValueError, match="if_exists='maybe' is not known"):
        agent.run("who?", id="x", if_exists="maybe")  # type: ignore[arg-type]


def test_if_exists_resume_continues_a_waiting_run_and_streams(store: Store) -> None:
    agent = shop(store, [call("refund", amount=500), "refund done"])
    assert agent.run("refund", id="o1", if_exists="resume", deps=Deps("a", [])).status == "waiting"
    state = store.load("o1")
    state.approve(state.pending_approvals[0].call_id, by="bob")
    store.save(state)

    async def streamed() -> list[str]:
        events = shop(store, [call("refund", amount=500), "refund done"]).stream(
            "refund", id="o1", if_exists="resume", deps=Deps("a", [])
        )
        return [e.entry.kind async for e in events if hasattr(e, "entry")]

    kinds = asyncio.run(streamed())
    assert kinds[0] != "run_started" and kinds[-1] == "run_stopped"  # resumed, not created
    assert store.load("o1").answer == "refund done"


# --------------------------------------------------------------------------------------------------
# approvals that depend on the arguments


def test_approval_conditions_see_validated_arguments_once_at_planning(store: Store) -> None:
    calls: list[dict[str, Any]] = []

    def big(args: dict[str, Any]) -> bool:
        calls.append(args)
        return bool(args["amount"] > 100)

    @tool(effect="idempotent")
    def refund(amount: int, reason: str = "damaged") -> str:
        """Refund."""
        return f"refunded {amount}"

    agent = Agent(
        ScriptedModel([[call("refund", amount=50), call("refund", amount="250")], "done"]),
        tools=[refund],
        store=store,
        permissions=[ask("refund*", when=big)],
    )
    state = agent.run("go", id="r1")
    assert calls == [{"amount": 50, "reason": "damaged"}, {"amount": 250, "reason": "damaged"}]  # validated
    assert state.status == "waiting"
    assert [(p.call_id, p.args) for p in state.pending_approvals] == [("c3_1", {"amount": "250"})]
    state.approve("c3_1", by="bob")
    assert agent.run(state).status == "completed"
    assert len(calls) == 2  # a resume, a decision, a start: none evaluates it again


def test_a_raising_condition_asks_and_a_deny_rule_wins_without_evaluating(store: Store) -> None:
    evaluated: list[str] = []

    def broken(args: dict[str, Any]) -> bool:
        evaluated.append("broken")
        raise KeyError("limit")

    @tool(approval=broken)
    def pay(amount: int) -> str:
        """Pay."""
        return "paid"

    @tool(approval=lambda args: evaluated.append("wipe") or True)
    def wipe() -> str:
        """Wipe."""
        return "wiped"

    agent = Agent(
        ScriptedModel([[call("pay", amount=1), call("wipe")], "done"]),
        tools=[pay, wipe],
        store=store,
        permissions=[deny("wipe", reason="never")],
    )
    state = agent.run("go")
    assert evaluated == ["broken"]
    (pending,) = state.pending_approvals
    assert pending.tool == "pay" and "approval condition of pay raised KeyError" in (pending.question or "")
    assert state.call("c3_1").outcome == "denied"  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="neither a bool nor a callable"):
        tool(name="x", approval="yes")(lambda: None)  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="not callable"):
        ask("x", when=5)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------------
# approving with edited arguments


def _last_tool_text(agent: Agent[Any]) -> str:
    model = agent.model
    assert isinstance(model, ScriptedModel)
    return _tool_texts(model.requests[-1])


def test_edited_arguments_run_and_the_model_is_told_who_changed_what(store: Store) -> None:
    agent = shop(store, [call("refund", amount=500, note="damaged"), _tool_texts])
    deps = Deps("u1", [])
    state = agent.run("refund", id="r1", deps=deps)
    state.approve("c3_0", by="alice", reason="over the limit", args={"amount": 90, "note": "partial"})
    store.save(state)  # a short-lived taker: journaled alone, validated by the driver that starts it
    decided = [e for e in store.load("r1").history if isinstance(e, j.ApprovalDecided)]
    assert [(e.by, e.args) for e in decided] == [("alice", {"amount": 90, "note": "partial"})]
    done = agent.resume("r1", deps=deps)
    assert deps.seen == ["refund 90 partial for u1"]
    text = _last_tool_text(agent)
    assert text.startswith(
        "done:Note: alice approved this call with changed arguments (reason: over the limit)"
    )
    assert (
        'You asked for {"amount":500,"note":"damaged"}; alice changed them to {"amount":90,"note":"partial"}'
        in text
    )
    assert text.endswith("refunded 90")
    assert done.answer == text


def test_invalid_edited_arguments_close_the_call_input_error(store: Store) -> None:
    # consumed by a driver that holds the run: checked at once
    agent = shop(store, [call("refund", amount=500), _tool_texts])
    deps = Deps("u1", [])
    state = agent.run("refund", id="r1", deps=deps)
    state.approve("c3_0", by="alice", args={"amount": "lots"})
    done = agent.run(state, deps=deps)
    assert deps.seen == []
    finished = [e for e in done.history if isinstance(e, j.ToolFinished)]
    assert [e.outcome for e in finished] == ["input_error"]
    assert "invalid arguments for refund: amount" in finished[0].content[0]["text"]
    text = _last_tool_text(agent)
    assert 'alice changed them to {"amount":"lots"}' in text and "input_error:" in text
    # journaled by a short-lived taker: checked by the driver before any start
    other = shop(store, [call("refund", amount=500), "fine"])
    waiting = other.run("refund", id="r2", deps=deps)
    waiting.approve("c3_0", by="alice", args={"amount": 5, "unknown": 1})
    store.save(waiting)
    assert [e.kind for e in store.load("r2").history][-1] == "approval_decided"
    resumed = other.resume("r2", deps=deps)
    assert deps.seen == [] and resumed.status == "completed"
    (closed,) = [e for e in resumed.history if isinstance(e, j.ToolFinished)]
    assert closed.outcome == "input_error" and "unknown argument" in closed.content[0]["text"]
    for bad in ([1], {1: 2}, {"x": object()}):
        with pytest.raises(ValueError, match="not a JSON object"):
            store.load("r1").approve("c3_0", args=bad)  # type: ignore[arg-type]


def test_tether_approve_args_and_ls_meta(tmp_path: Path) -> None:
    url = f"file:{tmp_path / 'runs'}"
    store = FileStore(tmp_path / "runs")
    agent = shop(store, [call("refund", amount=500), _tool_texts])
    agent.run("refund", id="r1", deps=Deps("u", []), metadata={"user": "u42"})
    agent.run("refund", id="r2", deps=Deps("u", []), metadata={"user": "u7"})
    runner = CliRunner()
    listed = runner.invoke(app, ["ls", "--store", url, "--meta", "user=u42", "--json"])
    assert listed.exit_code == 0, listed.output
    assert [(r["id"], r["metadata"]) for r in json.loads(listed.output)] == [("r1", {"user": "u42"})]
    bad = runner.invoke(app, ["ls", "--store", url, "--meta", "user"])
    assert bad.exit_code == 2 and "--meta takes KEY=VALUE" in bad.output
    approved = runner.invoke(
        app, ["approve", "r1", "c3_0", "--by", "alice", "--args", '{"amount": 80}', "--store", url]
    )
    assert approved.exit_code == 0, approved.output
    decided = [e for e in store.load("r1").history if isinstance(e, j.ApprovalDecided)]
    assert [(e.by, e.args) for e in decided] == [("alice", {"amount": 80})]
    not_object = runner.invoke(app, ["approve", "r2", "c3_0", "--by", "a", "--args", "[80]", "--store", url])
    assert not_object.exit_code == 2 and "--args is not a JSON object" in not_object.output


# --------------------------------------------------------------------------------------------------
# @agent.tool


def test_agent_tool_registers_tools_and_refuses_misuse() -> None:
    agent = Agent(ScriptedModel([call("double", n=2), call("shout", text="hi"), "done"]))

    @agent.tool
    def double(n: int) -> int:
        """Double it."""
        return n * 2

    @agent.tool(effect="read_only", name="shout", approval=False)
    def loud(text: str) -> str:
        """Shout it."""
        return text.upper()

    @tool(effect="idempotent")
    def kept(x: int) -> int:
        """Kept as made."""
        return x

    assert agent.tool(kept) is kept and kept.effect == "idempotent"  # a Tool keeps its options
    assert double(3) == 6 and loud.effect == "read_only"  # still callable like the function
    assert set(agent.tools) == {"double", "shout", "kept"} and agent.tools["shout"] is loud
    assert [s["name"] for s in agent.tool_schemas()] == ["double", "shout", "kept"]
    state = agent.run("go")
    assert [e.outcome for e in state.history if isinstance(e, j.ToolFinished)] == ["done", "done"]
    with pytest.raises(TypeError, match=r"agent\.tool got 'name', not a function"):
        agent.tool("name")  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="decorates a function"):
        agent.tool(effect="read_only")(42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="two tools are named double"):
        agent.tool(double.fn)
    with pytest.raises(ValueError, match="effect 'resumable' is not accepted"):
        agent.tool(effect="resumable")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        agent.tools["x"] = double  # type: ignore[index]


# --------------------------------------------------------------------------------------------------
# typed output


class Verdict(BaseModel):
    ok: bool
    why: str


MAIN_SCRIPT = textwrap.dedent(
    """
    import sys
    from pydantic import BaseModel
    from tether import Agent, FileStore
    from tether.testing import ScriptedModel, call

    class Verdict(BaseModel):  # lives in __main__: no other process can import it by that name
        ok: bool
        why: str

    agent = Agent(ScriptedModel([call("final_result", ok=True, why="paid")]), name="judge",
                  store=FileStore(sys.argv[1]), output_type=Verdict)
    state = agent.run("judge it", id="v1")
    print(type(state.output).__module__, type(state.output).__name__)
    """
)


def test_typed_output_comes_from_the_driving_agent_whoever_started_the_run(tmp_path: Path) -> None:
    script = tmp_path / "judge.py"
    script.write_text(MAIN_SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "runs")], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["__main__", "Verdict"]
    store = FileStore(tmp_path / "runs")
    assert store.load("v1").output == {"ok": True, "why": "paid"}  # its type's module is not imported here
    judge = Agent(ScriptedModel([]), name="judge", store=store, output_type=Verdict)
    resumed = judge.resume("v1")
    assert resumed.output == Verdict(ok=True, why="paid") and isinstance(resumed.output, Verdict)


def test_typed_output_of_a_run_started_by_tether_run_file(tmp_path: Path) -> None:
    (tmp_path / "judge_agent.py").write_text(
        textwrap.dedent(
            """
            from pydantic import BaseModel
            from tether import Agent
            from tether.testing import ScriptedModel, call

            class Verdict(BaseModel):
                ok: bool
                why: str

            agent = Agent(ScriptedModel([call("final_result", ok=False, why="late")]), name="judge",
                          output_type=Verdict)
            """
        )
    )
    tether = Path(sys.executable).with_name("tether")
    url = f"file:{tmp_path / 'runs'}"
    done = subprocess.run(
        [str(tether), "run", "judge_agent.py:agent", "judge it", "--id", "v2", "--store", url],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    store = FileStore(tmp_path / "runs")
    assert str(store.load("v2").history[-1].output_type).startswith("_tether_agent_")  # type: ignore[attr-defined]
    resumed = Agent(ScriptedModel([]), name="judge", store=store, output_type=Verdict).resume("v2")
    assert resumed.output == Verdict(ok=False, why="late")


def test_asubmit_creates_a_run_a_worker_drives_without_blocking_the_loop(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "runs.db")
    agent = shop(store, [call("whoami"), "done"])
    seen: list[str] = []

    async def submit_two() -> list[State]:
        return [
            await agent.asubmit("who am I?", id="a1", metadata={"user": "u1"}),
            await agent.asubmit("who am I?", id="a2", metadata={"user": "u2"}),
        ]

    submitted = asyncio.run(submit_two())
    assert [s.id for s in submitted] == ["a1", "a2"]
    assert {i.id: (i.status, i.metadata) for i in store.list()} == {
        "a1": ("running", {"user": "u1"}),
        "a2": ("running", {"user": "u2"}),
    }
    assert store.holder("a1") is None and store.holder("a2") is None  # no process drives them yet
    with pytest.raises(ValueError, match="exists"):
        asyncio.run(agent.asubmit("again", id="a1"))
    Worker([agent], store, deps=lambda info: Deps(info.metadata["user"], seen), poll_interval=0.05).run(
        stop_when_idle=True
    )
    assert sorted(seen) == ["whoami u1 {'user': 'u1'}", "whoami u2 {'user': 'u2'}"]
    assert {store.load(rid).status for rid in ("a1", "a2")} == {"completed"}
    store.close()
