"""Human approval that waits durably, permission rules, and decisions at recovery time (issue 4)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tether import (
    Agent,
    FileStore,
    HumanDecision,
    MemoryStore,
    ScriptedHuman,
    ToolContext,
    allow,
    ask,
    deny,
    tool,
)
from tether.testing import ExecutionLog, ScriptedModel, call

SRC = str(Path(__file__).resolve().parent.parent / "src")

# A module the child processes import: the same agent in every process.
AGENT_MODULE = textwrap.dedent(
    '''
    import os, sys
    from tether import Agent, FileStore, tool, ToolContext
    from tether.testing import ExecutionLog, ScriptedModel, call

    LOG = ExecutionLog(os.environ["SIDE_FILE"])

    @tool(approval=True)
    def send_email(to: str, ctx: ToolContext) -> str:
        """Send an email.

        Args:
            to: The recipient.
        """
        LOG.record(tool="send_email", call_id=ctx.call_id, to=to)
        return f"sent to {to}"

    @tool(approval=True)
    def wire_money(amount: int, ctx: ToolContext) -> str:
        """Wire money.

        Args:
            amount: How much.
        """
        LOG.record(tool="wire_money", call_id=ctx.call_id)
        return "wired"

    @tool(effect="read_only")
    def lookup(name: str, ctx: ToolContext) -> str:
        """Look a name up.

        Args:
            name: The name.
        """
        LOG.record(tool="lookup", call_id=ctx.call_id)
        return f"{name} is at x@example.com"

    def seen(request):
        results = [b for m in request.messages if m.role == "tool" for b in m.content]
        texts = "; ".join(f"{r['name']}={r['outcome']}:" + "".join(c.get("text", "") for c in r["content"]) for r in results)
        return "final: " + texts

    def build():
        model = ScriptedModel([
            [call("lookup", name="ann"), call("send_email", to="ann"), call("wire_money", amount=100)],
            seen,
        ])
        return Agent(model, name="mailer", tools=[lookup, send_email, wire_money], store=FileStore(os.environ["RUNS"]))
    '''
)


def child(tmp_path: Path, code: str) -> subprocess.CompletedProcess[str]:
    env = {
        **{k: v for k, v in os.environ.items() if k != "TETHER_FAILPOINT"},
        "PYTHONPATH": f"{tmp_path}{os.pathsep}{SRC}",
        "SIDE_FILE": str(tmp_path / "side.jsonl"),
        "RUNS": str(tmp_path / "runs"),
    }
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True, timeout=60
    )


def test_a_run_waits_then_other_processes_decide_and_resume(tmp_path: Path) -> None:
    (tmp_path / "mailer_agent.py").write_text(AGENT_MODULE)
    first = child(
        tmp_path,
        """
        from mailer_agent import build
        state = build().run("mail ann and pay her", id="mail-1")
        print(state.status, [p.call_id for p in state.pending_approvals])
        """,
    )
    assert first.returncode == 0, first.stderr
    status, pending = first.stdout.split(" ", 1)
    assert status == "waiting"
    assert "c3_1" in pending and "c3_2" in pending
    log = ExecutionLog(tmp_path / "side.jsonl")
    assert [r["tool"] for r in log.records()] == ["lookup"], "the allowed call ran; the others wait"

    decide = child(
        tmp_path,
        """
        import os
        from tether import FileStore
        store = FileStore(os.environ["RUNS"])
        state = store.load("mail-1")
        state.approve("c3_1", by="alice", reason="ann asked for it")
        state.deny("c3_2", by="bob", reason="no payments on Sundays")
        store.save(state)
        print(state.status)
        """,
    )
    assert decide.returncode == 0, decide.stderr
    assert decide.stdout.strip() == "running", "the approved call can run: someone must resume the run"
    assert [r["tool"] for r in log.records()] == ["lookup"], "deciding runs nothing"

    resume = child(
        tmp_path,
        """
        from mailer_agent import build
        state = build().resume("mail-1")
        print(state.status)
        print(state.answer)
        """,
    )
    assert resume.returncode == 0, resume.stderr
    status, answer = resume.stdout.strip().split("\n")
    assert status == "completed"
    assert "send_email=done:sent to ann" in answer
    assert "wire_money=denied:denied by bob: no payments on Sundays" in answer, "the model saw the reason"
    assert log.count(tool="send_email") == 1 and log.count(tool="wire_money") == 0

    state = FileStore(tmp_path / "runs").load("mail-1")
    decided = {e.call_id: (e.approved, e.by, e.reason) for e in state.history if e.kind == "approval_decided"}
    assert decided == {
        "c3_1": (True, "alice", "ann asked for it"),
        "c3_2": (False, "bob", "no payments on Sundays"),
    }


@tool(approval=True)
def _publish(text: str, ctx: ToolContext) -> str:
    """Publish a post.

    Args:
        text: The post.
    """
    return f"published {text}"


@tool(effect="read_only")
def _slow_draft(topic: str) -> str:
    """Draft a post slowly.

    Args:
        topic: The topic.
    """
    time.sleep(0.6)
    return f"draft about {topic}"


def test_a_decision_posted_while_the_driver_runs_another_call_is_acted_on(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    model = ScriptedModel([[call("_slow_draft", topic="cats"), call("_publish", text="hi")], "done"])
    agent = Agent(model, tools=[_slow_draft, _publish], store=store, poll_interval=0.05)

    def approve_when_asked() -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                state = FileStore(tmp_path).load("post-1")
            except KeyError:
                time.sleep(0.02)
                continue
            if state.pending_approvals:
                state.approve(state.pending_approvals[0].call_id, by="carol")
                FileStore(tmp_path).save(state)  # the driver holds the run: the decision is posted
                return
            time.sleep(0.02)

    helper = threading.Thread(target=approve_when_asked)
    helper.start()
    state = agent.run("write and publish", id="post-1")
    helper.join()
    assert state.status == "completed"
    finished = {e.call_id: e.outcome for e in state.history if e.kind == "tool_finished"}
    assert finished == {"c3_0": "done", "c3_1": "done"}
    kinds = [e.kind for e in state.history]
    decided_at = kinds.index("approval_decided")
    assert kinds[decided_at + 1] == "tool_started", "the decision and the start share an append"
    assert state.history[decided_at].inbox_seq == 0 and state.history[decided_at].by == "carol"
    assert len(model.requests) == 2


def test_in_process_human_approves_and_denies_and_the_answers_are_journaled() -> None:
    human = ScriptedHuman({"_publish": HumanDecision(True, "dana", "looks fine"), "_delete": False})

    @tool(approval=True)
    def _delete(path: str) -> str:
        """Delete a file.

        Args:
            path: The file.
        """
        raise AssertionError("never runs: denied")

    model = ScriptedModel([[call("_publish", text="x"), call("_delete", path="/etc")], "ok"])
    agent = Agent(model, tools=[_publish, _delete], store=MemoryStore(), human=human)
    state = agent.run("go")
    assert state.status == "completed"
    assert [q.tool for q in human.questions] == ["_publish", "_delete"]
    decided = [(e.call_id, e.approved, e.by) for e in state.history if e.kind == "approval_decided"]
    assert decided == [("c3_0", True, "dana"), ("c3_1", False, "scripted")]
    outcomes = {e.call_id: e.outcome for e in state.history if e.kind == "tool_finished"}
    assert outcomes == {"c3_0": "done", "c3_1": "denied"}
    kinds = [e.kind for e in state.history]
    # The reply and its requests are durable before the person is asked; decisions and starts follow.
    assert kinds[3:7] == ["model_replied", "approval_requested", "approval_requested", "approval_decided"]


def test_two_people_decide_one_call_exactly_one_decision_counts(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    human = ScriptedHuman({"_publish": True}, by="erin", delay=2.0)  # slow to answer
    model = ScriptedModel([call("_publish", text="x"), "ok"])
    agent = Agent(model, tools=[_publish], store=store, human=human, poll_interval=0.05)

    def decide_from_elsewhere() -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                state = FileStore(tmp_path).load("two")
            except KeyError:
                time.sleep(0.02)
                continue
            if state.pending_approvals:
                state.deny("c3_0", by="frank", reason="not today")
                FileStore(tmp_path).save(state)
                return
            time.sleep(0.02)

    helper = threading.Thread(target=decide_from_elsewhere)
    helper.start()
    state = agent.run("publish", id="two")
    helper.join()
    decided = [(e.by, e.approved) for e in state.history if e.kind == "approval_decided"]
    assert decided == [("frank", False)], "exactly one decision is journaled"
    assert [e.outcome for e in state.history if e.kind == "tool_finished"] == ["denied"]
    assert human.notes == ["c3_0 was denied by frank from another process; nothing to answer"], (
        "the slower person is told"
    )
    with pytest.raises(ValueError, match="already denied by frank"):
        FileStore(tmp_path).load("two").approve("c3_0", by="erin")


def test_a_decision_for_an_already_decided_call_is_refused_or_skipped(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    model = ScriptedModel([call("_publish", text="x"), "ok"])
    Agent(model, tools=[_publish], store=store).run("go", id="d")
    first, second = store.load("d"), store.load("d")
    first.approve("c3_0", by="gina")
    store.save(first)
    with pytest.raises(ValueError, match=r"call c3_0 was already approved by gina at "):
        store.load("d").deny("c3_0", by="hal")
    second.deny("c3_0", by="hal")  # a State loaded before the approval cannot tell: the holder does
    store.save(second)
    skipped = [e for e in store.load("d").history if e.kind == "inbox_skipped"]
    assert len(skipped) == 1 and skipped[0].reason.startswith("call c3_0 was already approved by gina")


def test_permission_rules_precedence_globs_and_effects() -> None:
    log: list[str] = []

    def make(name: str, effect: str) -> Any:
        def fn(x: int) -> str:
            log.append(name)
            return name

        fn.__name__ = name
        fn.__doc__ = f"{name}.\n\nArgs:\n    x: X.\n"
        return tool(fn, effect=effect)  # type: ignore[call-overload]

    read = make("read_file", "read_only")
    write = make("write_file", "unsafe")
    rm = make("rm_file", "unsafe")
    ping = make("ping", "idempotent")
    model = ScriptedModel([[call(n, x=1) for n in ("read_file", "write_file", "rm_file", "ping")], "ok"])
    agent = Agent(
        model,
        tools=[read, write, rm, ping],
        store=MemoryStore(),
        permissions=[allow("*_file"), ask(effect="unsafe"), deny("rm_*", reason="never delete")],
        default_permission="deny",
    )
    state = agent.run("go")
    # read_file: allow; write_file: allow + ask -> ask; rm_file: deny wins; ping: no rule -> default deny.
    assert state.status == "waiting"
    assert [p.tool for p in state.pending_approvals] == ["write_file"]
    outcomes = {
        e.call_id: (e.outcome, e.content[0]["text"]) for e in state.history if e.kind == "tool_finished"
    }
    assert outcomes["c3_0"][0] == "done"
    assert outcomes["c3_2"] == ("denied", "denied: never delete")
    assert outcomes["c3_3"][0] == "denied" and "not allowed by default" in outcomes["c3_3"][1]
    assert log == ["read_file"]


_UNSAFE_LOG: list[str] = []


def test_on_unknown_ask_lets_a_person_run_a_cut_off_unsafe_call_again(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import os, signal, sys
        from tether import Agent, FileStore, ScriptedHuman, tool, ToolContext
        from tether.testing import ExecutionLog, ScriptedModel, call
        log = ExecutionLog(os.environ["SIDE_FILE"])

        @tool
        def charge(amount: int, ctx: ToolContext) -> str:
            '''Charge a card.

            Args:
                amount: How much.
            '''
            log.record(call_id=ctx.call_id, attempt=ctx.attempt, key=ctx.idempotency_key)
            if len(log.records()) == 1:
                os.kill(os.getpid(), signal.SIGKILL)  # cut off mid-call
            return "charged"

        answer = sys.argv[1]
        human = ScriptedHuman({"charge": answer == "yes"}, by="ivy") if answer != "none" else None
        model = ScriptedModel([call("charge", amount=5), lambda r: "seen: " + r.messages[-1].content[0]["outcome"]])
        agent = Agent(model, tools=[charge], store=FileStore(os.environ["RUNS"]), on_unknown="ask", human=human)
        state = agent.run("pay", id="pay") if answer == "none" else agent.resume("pay")
        print(state.status, state.answer)
        """
    )

    def run(answer: str, folder: str) -> subprocess.CompletedProcess[str]:
        env = {
            **{k: v for k, v in os.environ.items() if k != "TETHER_FAILPOINT"},
            "PYTHONPATH": SRC,
            "SIDE_FILE": str(tmp_path / f"{folder}.jsonl"),
            "RUNS": str(tmp_path / folder),
        }
        return subprocess.run(
            [sys.executable, "-c", script, answer], env=env, capture_output=True, text=True, timeout=60
        )

    for answer, outcome, executions in (("yes", "done", 2), ("no", "aborted", 1)):
        folder = f"runs-{answer}"
        crashed = run("none", folder)
        assert crashed.returncode == -signal.SIGKILL, crashed.stderr
        resumed = run(answer, folder)
        assert resumed.returncode == 0, resumed.stderr
        assert resumed.stdout.strip() == f"completed seen: {outcome}"
        records = ExecutionLog(tmp_path / f"{folder}.jsonl").records()
        assert len(records) == executions
        assert len({r["key"] for r in records}) == 1, "a re-run keeps the journaled key"
        assert [r["attempt"] for r in records] == list(range(1, executions + 1))
        state = FileStore(tmp_path / folder).load("pay")
        asked = [e for e in state.history if e.kind == "approval_requested"]
        assert [(e.call_id, e.round) for e in asked] == [("c3_0", 1)], "an on_unknown question is round 1"


def test_terminal_human_asks_on_the_terminal_and_journals_the_answer() -> None:
    import io

    from tether import TerminalHuman

    stdin = io.StringIO("y\nthe customer asked\nn\n\n")
    stdout = io.StringIO()
    human = TerminalHuman(by="jo", stdin=stdin, stdout=stdout)
    model = ScriptedModel([call("_publish", text="one"), call("_publish", text="two"), "ok"])
    state = Agent(model, tools=[_publish], store=MemoryStore(), human=human).run("go")
    decided = [(e.approved, e.by, e.reason) for e in state.history if e.kind == "approval_decided"]
    assert decided == [(True, "jo", "the customer asked"), (False, "jo", None)]
    shown = stdout.getvalue()
    assert '_publish({"text": "one"})' in shown and "Approve? [y/N]" in shown


def test_sigkill_while_waiting_leaves_the_calls_waiting_never_aborted(tmp_path: Path) -> None:
    (tmp_path / "mailer_agent.py").write_text(AGENT_MODULE)
    env_code = """
        import os
        os.environ["TETHER_FAILPOINT"] = "after_append:approval_requested"
        from mailer_agent import build
        build().run("mail ann and pay her", id="mail-k")
        """
    killed = child(tmp_path, env_code)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    state = FileStore(tmp_path / "runs").load("mail-k")
    assert {p.call_id for p in state.pending_approvals} == {"c3_1", "c3_2"}
    actions = {c.call_id: c.action for c in state.open_calls}
    assert actions["c3_1"] == "wait" and actions["c3_2"] == "wait"
    assert not [e for e in state.history if e.kind == "tool_finished" and e.outcome == "aborted"]


def test_sigkill_after_a_decision_and_before_its_start_runs_the_tool_once(tmp_path: Path) -> None:
    (tmp_path / "mailer_agent.py").write_text(AGENT_MODULE)
    first = child(
        tmp_path, 'from mailer_agent import build\nbuild().run("mail ann and pay her", id="mail-d")'
    )
    assert first.returncode == 0, first.stderr
    store = FileStore(tmp_path / "runs")
    state = store.load("mail-d")
    state.approve("c3_1", by="alice")
    state.deny("c3_2", by="bob")
    store.save(state)  # approval_decided journaled alone: the start is the next driver's
    decided = store.load("mail-d")
    assert [e.kind for e in decided.history][-3:] == ["approval_decided", "approval_decided", "tool_finished"]
    killed = child(
        tmp_path,
        """
        import os
        os.environ["TETHER_FAILPOINT"] = "before_append:tool_started"
        from mailer_agent import build
        build().resume("mail-d")
        """,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    log = ExecutionLog(tmp_path / "side.jsonl")
    assert log.count(tool="send_email") == 0, "killed before the start was durable: the tool never ran"
    resumed = child(tmp_path, 'from mailer_agent import build\nprint(build().resume("mail-d").status)')
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.strip() == "completed"
    assert log.count(tool="send_email") == 1
