"""The reliability suite: each scenario is killed with SIGKILL at every journal boundary (before, after and
torn), resumed in fresh processes until it ends, and checked by the crash harness, on FileStore and
SQLiteStore. The figures (boundaries exercised per scenario and store, violations) are printed at the end.

Beyond the harness's invariants, each test checks what every case's run ended with: the same status as the
uncrashed run, and results a crash can only change in the documented way (an unsafe call cut off is
``aborted``; read-only and idempotent calls are retried to ``done``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tether import State, open_store
from tether._harness.crash.crash_test import CrashReport, crash_test
from tether.state import ABORTED_UNKNOWN

pytestmark = pytest.mark.crash

AGENTS = str(Path(__file__).with_name("_harness_agents.py"))
FIGURES: list[tuple[str, str, int, int, int, int, float]] = []


@pytest.fixture(scope="module", autouse=True)
def figures(pytestconfig: pytest.Config) -> Iterator[None]:
    """After the module: print the figures for the closing note."""
    yield
    reporter = pytestconfig.pluginmanager.getplugin("terminalreporter")
    capture = pytestconfig.pluginmanager.getplugin("capturemanager")
    if reporter is None or capture is None or not FIGURES:
        return
    with capture.global_and_fixture_disabled():
        write_figures(reporter)


def write_figures(reporter: Any) -> None:
    reporter.write("\n")
    reporter.section("crash harness figures", sep="-")
    reporter.write_line(
        f"{'scenario':<12} {'store':<7} {'boundaries':>10} {'exercised':>9} {'cases':>5} {'violations':>10} {'s':>5}"
    )
    for scenario, store, boundaries, exercised, cases, violations, seconds in sorted(FIGURES):
        reporter.write_line(
            f"{scenario:<12} {store:<7} {boundaries:>10} {exercised:>9} {cases:>5} {violations:>10} {seconds:>5.1f}"
        )
    total = sum(row[5] for row in FIGURES)
    reporter.write_line(f"total: {sum(row[4] for row in FIGURES)} cases, {total} violations")


def url_for(kind: str, tmp_path: Path) -> str:
    return f"file:{tmp_path / 'runs'}" if kind == "file" else f"sqlite:///{tmp_path / 'runs.db'}"


def harness(
    scenario: str, kind: str, tmp_path: Path, prompt: str = "go"
) -> tuple[CrashReport, dict[str, State]]:
    """Run the harness on a scenario; check what every scenario must show; return the report and runs."""
    url = url_for(kind, tmp_path)
    report = crash_test(f"{AGENTS}:{scenario}", prompt, store_url=url)
    print(report)
    FIGURES.append(
        (
            scenario,
            kind,
            report.boundaries,
            report.exercised,
            len(report.rows),
            report.violations,
            report.seconds,
        )
    )
    assert report.violations == 0
    assert report.exercised == report.boundaries, f"not reached: {report.not_reached}"
    assert len(report.rows) == 3 * report.boundaries
    assert {row.point for row in report.rows} == {"before_append", "after_append", "torn_append"}
    assert report.baseline is not None
    assert all(row.status == report.baseline.status for row in report.rows), (
        "a crash changed how the run ended"
    )
    store = open_store(url)
    try:
        runs = {row.run_id: store.load(row.run_id) for row in [report.baseline, *report.rows]}
    finally:
        store.close()
    return report, runs


def results(state: State) -> dict[str, list[Any]]:
    """Each tool's results, as (outcome, text) per call, in journal order."""
    names = {}
    out: dict[str, list[Any]] = {}
    for entry in state.history:
        if entry.kind == "tool_started":
            names[entry.call_id] = entry.tool
        if entry.kind == "approval_requested":
            names[entry.call_id] = entry.tool
        if entry.kind == "tool_finished":
            text = "".join(b.get("text", "") for b in entry.content if b.get("type") == "text")
            out.setdefault(names.get(entry.call_id, "?"), []).append((entry.outcome, text))
    return out


STORES = ["file", "sqlite"]
ABORTED = ABORTED_UNKNOWN  # what a resume journals for an unsafe call cut off by a crash


@pytest.mark.parametrize("kind", STORES)
def test_parallel_calls_of_three_effects(kind: str, tmp_path: Path) -> None:
    report, runs = harness("parallel", kind, tmp_path)
    assert 4 <= report.boundaries <= 6  # results finishing together share an append
    for state in runs.values():
        assert state.status == "completed"
        found = results(state)
        assert found["lookup"] == [("done", "found weather")], "read-only: retried until done"
        ((outcome, text),) = found["sync_db"]
        assert outcome == "done" and text.startswith(f"synced users with key tether:{state.id}:c")
        assert found["charge"] in ([("done", "charged 5")], [("aborted", ABORTED)]), (
            "unsafe: done, or cut off"
        )
    assert any(results(s)["charge"][0][0] == "aborted" for s in runs.values()), "some case cut charge off"


@pytest.mark.parametrize("kind", STORES)
def test_a_failing_tool(kind: str, tmp_path: Path) -> None:
    report, runs = harness("failing_tool", kind, tmp_path)
    assert report.boundaries == 4
    for state in runs.values():
        ((outcome, text),) = results(state)["explode"]
        assert (outcome, text) in (("error", "RuntimeError: exploded: boom"), ("aborted", ABORTED))
        assert state.answer == f"answer: {outcome}:{text}"


@pytest.mark.parametrize("kind", STORES)
def test_a_retryable_model_error(kind: str, tmp_path: Path) -> None:
    report, runs = harness("model_error", kind, tmp_path)
    assert report.boundaries == 5
    assert "model_failed" in [row.kind for row in report.rows]
    for state in runs.values():
        kinds = [e.kind for e in state.history]
        assert kinds.count("model_failed") == 1, "the failed request is journaled once, whatever the crash"
        assert state.answer == "answer: done:found status"


@pytest.mark.parametrize("kind", STORES)
def test_an_approval_wait(kind: str, tmp_path: Path) -> None:
    report, runs = harness("approval", kind, tmp_path)
    assert report.boundaries == 4
    assert report.baseline is not None and report.baseline.status == "waiting"
    for state in runs.values():
        assert state.status == "waiting"
        assert [(p.tool, p.args) for p in state.pending_approvals] == [("deploy", {"version": "1.2"})]
        assert results(state)["lookup"] == [("done", "found release notes")]
        assert "deploy" not in results(state), "a call waiting for a person never starts"


@pytest.mark.parametrize("kind", STORES)
def test_a_multi_turn_run(kind: str, tmp_path: Path) -> None:
    report, runs = harness("multi_turn", kind, tmp_path)
    assert report.boundaries == 8
    for state in runs.values():
        assert state.turn == 4
        found = results(state)
        assert found["add"] in ([("done", "5")], [("aborted", ABORTED)]), "unsafe: done, or cut off"
        assert found["charge"] in ([("done", "charged 7")], [("aborted", ABORTED)])
        ((outcome, text),) = found["sync_db"]
        assert outcome == "done" and text.startswith(f"synced orders with key tether:{state.id}:c")
        assert state.answer == f"answer: done:{text}"


@pytest.mark.parametrize("kind", STORES)
def test_a_subagent(kind: str, tmp_path: Path) -> None:
    report, runs = harness("subagent", kind, tmp_path)
    assert report.boundaries == 9, "4 appends of the parent, 5 of the subagent's run"
    assert sorted({row.where for row in report.rows}) == ["root", "subagent 1"]
    assert sum(row.where == "subagent 1" for row in report.rows) == 3 * 5
    store = open_store(url_for(kind, tmp_path))
    try:
        for state in runs.values():
            (child_info,) = [i for i in store.list(root_id=state.id, limit=1000) if i.id != state.id]
            child = store.load(child_info.id)
            assert child.parent_id == state.id and child.status == "completed"
            found = results(child)
            assert found["lookup"] == [("done", "found prices")]
            assert found["charge"] in ([("done", "charged 2")], [("aborted", ABORTED)])
            assert state.answer == f"answer: done:{child.answer}", "the parent got the subagent's answer"
    finally:
        store.close()
