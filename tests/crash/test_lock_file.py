"""A FileStore run's ``<id>.lock`` deleted or replaced from outside never lets a second process in
(DURABILITY 4): process A holds the run mid-tool, the test removes or replaces the lock file, process B's
resume gets ``RunBusyError`` naming A's pid, A notices and locks a new file, and A's run finishes with every
tool executed exactly once."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from _helpers import out, run, spawn, starts, wait_for

from tether import FileStore, RunBusyError
from tether.testing import ExecutionLog

pytestmark = pytest.mark.crash


def _delete(lock: Path) -> None:
    lock.unlink()


def _replace(lock: Path) -> None:
    other = lock.with_name(lock.name + ".new")
    other.write_bytes(b"not a lock\n")
    os.replace(other, lock)


def _copy(lock: Path) -> None:
    other = lock.with_name(lock.name + ".new")
    other.write_bytes(lock.read_bytes())  # the holder's own record, on another inode
    os.replace(other, lock)


@pytest.mark.parametrize("damage", [_delete, _replace, _copy], ids=["deleted", "replaced", "copied"])
def test_a_lock_file_deleted_or_replaced_under_a_live_holder_lets_no_second_driver_in(
    tmp_path: Path, damage: Callable[[Path], None]
) -> None:
    runs, side = tmp_path / "runs", tmp_path / "side.jsonl"
    lock = runs / "lk.lock"
    holder = spawn("start", runs, "lk", side, "sigterm")
    try:
        wait_for(lambda: len(starts(side)) == 2, what="both hold tools of A to start")
        for attempt in range(2):  # A re-locks a new file after the first; the second finds that one
            damage(lock)
            with pytest.raises(RunBusyError, match=f"pid {holder.pid} "):
                FileStore(runs).delete("lk")  # a delete is a take too
            second = run("resume", runs, "lk", side, "sigterm")
            assert second.returncode == 3, second.stderr.decode()[-3000:]
            report = out(side)
            assert report["error"] == "RunBusyError", report
            assert f"pid {holder.pid} " in report["message"] and "Fix:" in report["message"], report
            wait_for(lambda: FileStore(runs).holder("lk") is not None, what="A to lock a new lock file")
            assert FileStore(runs).holder("lk").pid == holder.pid, f"try {attempt}"
        Path(str(side) + ".release").touch()
        holder.wait(60)
    finally:
        if holder.poll() is None:
            holder.kill()
    stderr = holder.stderr.read().decode() if holder.stderr else ""
    assert holder.returncode == 0, stderr[-3000:]
    assert "was deleted or replaced" in stderr  # A noticed, and said so
    assert out(side)["status"] == "completed" and out(side)["pid"] == holder.pid
    records = ExecutionLog(side).records()
    assert sorted(r["call_id"] for r in records if r["event"] == "start") == ["c3_0", "c3_1"]  # once each
    assert {r["pid"] for r in records} == {holder.pid}
    state = FileStore(runs).load("lk")
    outcomes = [e.outcome for e in state.history if e.kind == "tool_finished"]
    assert outcomes == ["done", "done"] and state.status == "completed"
    assert FileStore(runs).holder("lk") is None
