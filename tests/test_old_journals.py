"""Journals written by older tethers keep loading, and appending to them keeps them readable (DESIGN 4).

The files in ``tests/fixtures/old_journals/`` were written by the format-2 tether (commit b3899a0, see
``make.py`` there): a run begun in format 1, and two format-2 runs, in a FileStore folder and a SQLiteStore.
Each test works on a copy.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tether import Agent, FileStore, SQLiteStore, tool
from tether import journal as j
from tether.testing import ScriptedModel

FIXTURES = Path(__file__).parent / "fixtures" / "old_journals"


@tool(effect="unsafe", approval=True)
def refund(order: str, amount: int) -> str:
    """Refund an order.

    Args:
        order: The order id.
        amount: How much.
    """
    return f"refunded {amount} on {order}"


@pytest.fixture(params=["file", "sqlite"])
def old_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    if request.param == "file":
        shutil.copytree(FIXTURES / "files", tmp_path / "files")
        store: Any = FileStore(tmp_path / "files")
    else:
        shutil.copy(FIXTURES / "runs.db", tmp_path / "runs.db")
        store = SQLiteStore(tmp_path / "runs.db")
    yield store
    store.close()


def test_a_finished_format_2_run_loads_as_it_was_written(old_store: Any) -> None:
    state = old_store.load("f2-done")
    assert state.status == "completed" and state.answer == "thanks"
    assert state.format_version == 2 and len(state.history) == 17 and state.turn == 3
    assert state.metadata == {"user": "u42"} and state.first_message == "please refund order o1"
    assert [e.kind for e in state.history].count("model_failed") == 1
    decided = next(e for e in state.history if isinstance(e, j.ApprovalDecided))
    assert decided.by == "alice" and decided.args == {"order": "o1", "amount": 50} and decided.inbox_seq == 0
    finished = [e for e in state.history if isinstance(e, j.ToolFinished)]
    assert [e.content[0]["text"] for e in finished] == ["result 1", "refunded 50 on o1"]
    assert all(len(e.w) == 32 and len(e.h) == 16 for e in state.history)
    assert {info.id: info.status for info in old_store.list()} == {
        "f1-waiting": "waiting",
        "f2-done": "completed",
        "f2-waiting": "waiting",
    }


def test_a_run_begun_in_format_1_loads(old_store: Any) -> None:
    state = old_store.load("f1-waiting")
    assert state.format_version == 1 and state.status == "waiting"
    assert [p.tool for p in state.pending_approvals] == ["refund"]
    assert state.history[0].v is None and all(e.v == 2 for e in state.history[2:])


@pytest.mark.parametrize("run_id", ["f1-waiting", "f2-waiting"])
def test_an_old_run_is_approved_and_finished_by_this_tether_and_still_loads(
    old_store: Any, run_id: str
) -> None:
    state = old_store.load(run_id)
    before = len(state.history)
    state.approve(state.pending_approvals[0].call_id, by="bob")
    old_store.save(state)
    agent = Agent(ScriptedModel(["done"] * 5), name=state.agent, tools=[refund], store=old_store)
    done = agent.resume(run_id)
    assert done.status == "completed" and done.answer == "done"
    again = old_store.load(run_id)
    assert [e.kind for e in again.history] == [e.kind for e in done.history]
    assert len(again.history) > before and again.format_version == state.format_version
    results = [e for e in again.history if isinstance(e, j.ToolFinished)]
    assert results[-1].content[0]["text"].startswith("refunded")
