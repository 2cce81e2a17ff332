"""Tests for tether.state: the fold, what a resume would do, and changes made outside a driver."""

from __future__ import annotations

from typing import Any

import pytest

from tether import Message, State
from tether import journal as j
from tether._harness.conformance.support import writer_of
from tether.errors import CorruptJournalError
from tether.state import ABORTED_UNKNOWN


def started(*texts: str) -> State:
    state = State(id="r1")
    writer_of(state).add(j.RunStarted, agent="a", root_id="r1")
    for text in texts or ("hi",):
        writer_of(state).add(j.MessageAdded, role="user", content=[{"type": "text", "text": text}])
    return state


def reply(
    state: State, *names: str, text: str | None = None, usage: dict[str, int] | None = None
) -> list[str]:
    """Queue a model_replied with one tool call per name; returns the call ids."""
    seq = len(state.history)
    content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    ids = [j.call_id_for(seq, i) for i in range(len(names))]
    content += [
        {"type": "tool_call", "id": cid, "name": n, "args": {"n": i}}
        for i, (cid, n) in enumerate(zip(ids, names, strict=True))
    ]
    writer_of(state).add(
        j.ModelReplied, content=content, usage=usage or {"input_tokens": 10, "output_tokens": 5}
    )
    return ids


def start(
    state: State, call_id: str, tool: str = "t", effect: str = "unsafe", attempt: int = 1, limit: int = 3
) -> None:
    writer_of(state).add(
        j.ToolStarted,
        call_id=call_id,
        tool=tool,
        effect=effect,
        idempotency_key=j.idempotency_key_for(state.id, call_id),
        attempt=attempt,
        max_attempts=limit,
    )


def finish(state: State, call_id: str, text: str, outcome: str = "done") -> None:
    writer_of(state).add(
        j.ToolFinished, call_id=call_id, outcome=outcome, content=[{"type": "text", "text": text}]
    )


def roles(state: State) -> list[str]:
    return [m.role for m in state.messages]


def test_results_follow_call_order_and_messages_added_meanwhile_come_after_them() -> None:
    state = started()
    first, second = reply(state, "a", "b")
    start(state, first)
    start(state, second)
    finish(state, second, "B")  # finishes first
    writer_of(state).add(
        j.MessageAdded, role="user", content=[{"type": "text", "text": "by the way"}], inbox_seq=0
    )
    assert roles(state) == ["user", "assistant"], (
        "a message added while calls are open waits for their results"
    )
    finish(state, first, "A")
    assert roles(state) == ["user", "assistant", "tool", "user"]
    results = state.messages[2].content
    assert [r["call_id"] for r in results] == [first, second]
    assert [r["content"][0]["text"] for r in results] == ["A", "B"]
    assert state.messages[3].text == "by the way"
    assert state.inbox_consumed == 0


def test_replay_is_the_same_fold() -> None:
    state = started()
    (cid,) = reply(state, "a")
    start(state, cid)
    finish(state, cid, "x")
    writer_of(state).add(
        j.ModelReplied, content=[{"type": "text", "text": "done"}], usage={"input_tokens": 1}
    )
    writer_of(state).add(j.RunStopped, status="completed", answer="done")
    again = State.replay("r1", state.history)
    assert again.messages == state.messages
    assert (again.status, again.answer, again.turn, again.usage) == ("completed", "done", 2, state.usage)
    assert again.history == state.history and writer_of(state).unsaved == len(state.history)


def test_turns_usage_and_the_request_index_are_totals() -> None:
    state = started()
    (cid,) = reply(state, "a", usage={"input_tokens": 10, "output_tokens": 5})
    start(state, cid)
    finish(state, cid, "x")
    assert state.requests == 1
    writer_of(state).add(j.ModelFailed, error_type="ModelError", error="overloaded", retryable=True)
    assert state.requests == 2 and state.turn == 1
    writer_of(state).add(
        j.ModelReplied,
        content=[{"type": "text", "text": "ok"}],
        usage={"input_tokens": 7, "output_tokens": 1},
    )
    assert state.turn == 2 and state.requests == 3
    assert state.usage == {"input_tokens": 17, "output_tokens": 6}


def test_pending_approvals_and_status_waiting() -> None:
    state = started()
    risky, safe = reply(state, "risky", "safe")
    writer_of(state).add(j.ApprovalRequested, call_id=risky, round=0, tool="risky", args={"n": 0})
    start(state, safe)
    assert state.status == "running", "a started call can still run"
    finish(state, safe, "ok")
    assert state.status == "waiting"
    (pending,) = state.pending_approvals
    assert (pending.call_id, pending.tool, pending.args, pending.run_id, pending.round) == (
        risky,
        "risky",
        {"n": 0},
        "r1",
        0,
    )
    assert pending.asked_at == state.history[-3].at
    assert [(c.call_id, c.action) for c in state.open_calls] == [(risky, "wait")]


def test_approve_and_deny_become_inbox_items_and_refuse_a_second_decision() -> None:
    state = started()
    (risky,) = reply(state, "risky")
    writer_of(state).add(j.ApprovalRequested, call_id=risky, round=0, tool="risky", args={})
    state.approve(risky, by="alice", reason="fine")
    assert state.pending_approvals == []
    (item,) = state.take_local_changes()
    assert item["type"] == "decision" and item["call_id"] == risky and item["approved"] is True
    assert item["round"] == 0 and item["seen_seq"] == len(state.history) and item["item_id"]
    with pytest.raises(ValueError, match=rf"call {risky} was already approved by alice at "):
        state.deny(risky, by="bob")
    with pytest.raises(ValueError, match=r"has no call c99_0\. Fix:"):
        state.approve("c99_0")
    with pytest.raises(ValueError, match="Fix:"):
        state.approve(risky, run_id="another-run")


def test_a_journaled_decision_is_refused_again_by_the_state() -> None:
    state = started()
    (risky,) = reply(state, "risky")
    writer_of(state).add(j.ApprovalRequested, call_id=risky, round=0, tool="risky", args={})
    writer_of(state).add(j.ApprovalDecided, call_id=risky, round=0, approved=False, by="bob", reason="no")
    with pytest.raises(ValueError, match=rf"call {risky} was already denied by bob"):
        state.approve(risky)


def test_open_calls_say_what_a_resume_would_do() -> None:
    state = started()
    ids = reply(state, "fresh", "unsafe", "idem", "idem_last", "pending", "denied", "approved")
    fresh, unsafe, idem, idem_last, pending, denied, approved = ids
    start(state, unsafe, effect="unsafe")
    start(state, idem, effect="idempotent", attempt=1)
    start(state, idem_last, effect="read_only", attempt=3, limit=3)
    writer_of(state).add(j.ApprovalRequested, call_id=pending, round=0, tool="pending", args={})
    writer_of(state).add(j.ApprovalRequested, call_id=denied, round=0, tool="denied", args={})
    writer_of(state).add(
        j.ApprovalDecided, call_id=denied, round=0, approved=False, by="bob", reason="too risky"
    )
    writer_of(state).add(j.ApprovalRequested, call_id=approved, round=0, tool="approved", args={})
    writer_of(state).add(j.ApprovalDecided, call_id=approved, round=0, approved=True, by="alice")
    plan = {c.call_id: c for c in state.open_calls}
    assert [c.call_id for c in state.open_calls] == ids, "open calls are listed in call order"
    assert plan[fresh].action == "run" and plan[fresh].attempt == 0
    assert plan[unsafe].action == "abort" and plan[unsafe].reason == ABORTED_UNKNOWN
    assert "may or may not have run" in ABORTED_UNKNOWN
    assert plan[idem].action == "retry" and plan[idem].attempt == 1 and plan[idem].effect == "idempotent"
    assert plan[idem_last].action == "abort" and "gave up after 3 attempts" in plan[idem_last].reason
    assert plan[pending].action == "wait"
    assert plan[denied].action == "deny"
    assert plan[approved].action == "run"
    assert state.status == "running"


def test_stopped_statuses_and_what_reopens_them() -> None:
    for status in ("completed", "failed", "cancelled", "stopped"):
        state = started()
        writer_of(state).add(j.ModelReplied, content=[{"type": "text", "text": "x"}])
        writer_of(state).add(
            j.RunStopped, status=status, answer="x" if status == "completed" else None, reason="why"
        )
        assert state.status == status
        writer_of(state).add(j.InboxSkipped, inbox_seq=0, reason="no effect")
        assert state.status == status, "an inbox_skipped leaves the run stopped"
        writer_of(state).add(
            j.MessageAdded, role="user", content=[{"type": "text", "text": "more"}], inbox_seq=1
        )
        assert state.status == "running", "a message reopens a stopped run"
        assert state.answer is None


def test_add_message_on_a_new_state_is_a_message_and_on_a_stored_one_an_inbox_item() -> None:
    fresh = State(id="new", messages=["hello"])
    fresh.add_message(Message.user("and more"))
    assert [m.text for m in fresh.messages] == ["hello", "and more"]
    assert fresh.take_local_changes() == []
    state = started()
    state.add_message("later")
    (item,) = state.take_local_changes()
    assert item["type"] == "message" and item["content"] == [{"type": "text", "text": "later"}]
    assert [m.text for m in state.messages] == ["hi"], "not in the context until a driver journals it"


@pytest.mark.parametrize(
    "damage",
    ["second_result", "unknown_call", "reply_with_open_calls", "second_decision", "second_run_started"],
)
def test_entries_that_cannot_follow_are_corruption_naming_run_and_seq(damage: str) -> None:
    state = started()
    (cid,) = reply(state, "a")
    if damage == "second_result":
        finish(state, cid, "x")
        call = lambda: finish(state, cid, "again")  # noqa: E731
    elif damage == "unknown_call":
        finish(state, cid, "x")
        call = lambda: finish(state, "c99_0", "who?")  # noqa: E731
    elif damage == "reply_with_open_calls":
        start(state, cid)
        call = lambda: reply(state, "b")  # noqa: E731
    elif damage == "second_decision":
        writer_of(state).add(j.ApprovalRequested, call_id=cid, round=0, tool="a", args={})
        decide = dict(call_id=cid, round=0, approved=True, by="alice")
        writer_of(state).add(j.ApprovalDecided, **decide)
        call = lambda: writer_of(state).add(j.ApprovalDecided, **decide)  # noqa: E731
    else:
        writer_of(state).add(j.MessageAdded, role="user", content=[])
        call = lambda: writer_of(state).add(j.RunStarted, agent="a")  # noqa: E731
    bad_seq = len(state.history)
    with pytest.raises(CorruptJournalError) as info:
        call()
    assert info.value.seq == bad_seq and f"run r1 seq {bad_seq}" in str(info.value)


def test_crash_loop_counter_counts_resumes_since_progress() -> None:
    state = started()
    for n in (1, 2):
        writer_of(state).add(j.RunResumed, writer="w", pid=1)
        assert state.resumes_since_progress == n
    (cid,) = reply(state, "a")
    assert state.resumes_since_progress == 0
    writer_of(state).add(j.RunResumed, writer="w", pid=1)
    start(state, cid)
    assert state.resumes_since_progress == 1, "a tool_started is not progress"
    writer_of(state).add(j.RunReleased, reason="interrupted")
    assert state.resumes_since_progress == 0


def test_invalid_state_id_is_refused() -> None:
    with pytest.raises(ValueError, match="Fix:"):
        State(id="no spaces please")
    assert len(State().id) == 32
