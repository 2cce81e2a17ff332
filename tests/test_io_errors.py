"""Disk full and I/O errors at the write and at the sync, commit failures, and SIGTERM during a save
(DESIGN 5.3 and 5.4, DURABILITY 5).

The faults are injected where the stores make their system calls: FileStore's byte I/O goes through
``tether.stores.files._lock``, whose ``os`` is replaced by ``Disk`` (it fails chosen ``pwrite``, ``fdatasync``,
``fsync`` or ``ftruncate`` calls on one journal file and passes everything else through); SQLiteStore's
commits go through a connection wrapper. Each test checks that nothing reported durable is lost, that the
run raises the documented error, and that a later save (or resume) completes the journal.
"""

from __future__ import annotations

import errno
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tether import (
    Agent,
    FileStore,
    Message,
    ModelError,
    SQLiteStore,
    State,
    StoreFullError,
    ToolContext,
    tool,
)
from tether import journal as j
from tether.state import ABORTED_UNKNOWN
from tether.stores.files import _lock as fl
from tether.testing import ScriptedModel, call

# --------------------------------------------------------------------------------------------------
# Faults


@dataclass
class Fault:
    """Fail the ``nth`` call of ``op`` on the target file (and every later one when ``stays``)."""

    op: str
    nth: int
    error: int = errno.ENOSPC
    stays: bool = False
    partial: bool = False  # a failing pwrite first writes half its bytes
    loses_pages: bool = False  # a failing sync drops what was written since the last sync (fsyncgate)


class Disk:
    """Stands in for ``os`` inside ``tether.stores.files._lock``: fails chosen calls on one file."""

    def __init__(self, target: Path, *faults: Fault) -> None:
        self.target = str(target)
        self.faults = list(faults)
        self.calls: Counter[str] = Counter()
        self.failed: list[str] = []
        self.unsynced: list[tuple[int, int]] = []
        self.off = False

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    def _ours(self, fd: int) -> bool:
        try:
            return os.readlink(f"/proc/self/fd/{fd}") == self.target
        except OSError:
            return False

    def _fault(self, op: str, fd: int) -> Fault | None:
        if self.off or not self._ours(fd):
            return None
        self.calls[op] += 1
        n = self.calls[op]
        for fault in self.faults:
            if fault.op == op and (n == fault.nth or (fault.stays and n > fault.nth)):
                self.failed.append(f"{op}#{n}")
                return fault
        return None

    def pwrite(self, fd: int, data: bytes, offset: int) -> int:
        fault = self._fault("pwrite", fd)
        if fault is not None:
            if fault.partial:
                half = bytes(data[: len(data) // 2])
                os.pwrite(fd, half, offset)
                self.unsynced.append((offset, len(half)))
            raise OSError(fault.error, os.strerror(fault.error))
        written = os.pwrite(fd, data, offset)
        if self._ours(fd):
            self.unsynced.append((offset, written))
        return written

    def _sync(self, op: str, fd: int) -> None:
        fault = self._fault(op, fd)
        if fault is not None:
            if fault.loses_pages:  # the kernel dropped the dirty pages; a later fsync will "succeed"
                for offset, size in self.unsynced:
                    os.pwrite(fd, b"\0" * size, offset)
            self.unsynced = []
            raise OSError(fault.error, os.strerror(fault.error))
        getattr(os, op)(fd)
        if self._ours(fd):
            self.unsynced = []

    def fdatasync(self, fd: int) -> None:
        self._sync("fdatasync", fd)

    def fsync(self, fd: int) -> None:
        self._sync("fsync", fd)

    def ftruncate(self, fd: int, length: int) -> None:
        fault = self._fault("ftruncate", fd)
        if fault is not None:
            raise OSError(fault.error, os.strerror(fault.error))
        os.ftruncate(fd, length)


class Recording(FileStore):
    """A FileStore that remembers every entry whose append returned (reported durable)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.durable: dict[int, str] = {}

    def append(self, run_id: str, entries: Any, **kwargs: Any) -> None:
        super().append(run_id, entries, **kwargs)
        self.durable.update({e.seq: e.h for e in entries})


def faulty(monkeypatch: pytest.MonkeyPatch, journal: Path, *faults: Fault) -> Disk:
    disk = Disk(journal, *faults)
    monkeypatch.setattr(fl, "os", disk)
    return disk


# --------------------------------------------------------------------------------------------------
# The scenario: one unsafe call, then an answer (appends: 1 run_resumed, 2 reply+start, 3 result, 4 reply+stop)


def build(store: Any, ran: list[str], script: list[Any] | None = None) -> Agent:
    @tool
    def note(text: str, ctx: ToolContext) -> str:
        """Write a note (unsafe)."""
        ran.append(ctx.call_id)
        return f"noted {text}"

    script = script if script is not None else [call("note", text="x"), "done"]
    return Agent(ScriptedModel(script), name="io", tools=[note], store=store, poll_interval=0.05)


def fresh_state(run_id: str = "r") -> State:
    return State(id=run_id, messages=[Message.user("write a note")])


def check_full_message(exc: BaseException, path: Path | None) -> None:
    """A disk-full error names the run, the file (when known) and the fix, and says nothing was lost."""
    text = str(exc)
    assert text.startswith("run r: no room to write "), text
    if path is not None:
        assert f"no room to write {path} (" in text
    assert "everything saved before it is kept" in text
    assert "Fix: free space on that disk" in text and "tether resume r" in text
    assert "[Errno" not in text


def check_durable(store: Recording, run_id: str) -> State:
    """The journal loads with every entry reported durable, and nothing else."""
    loaded = store.load(run_id)
    assert {e.seq: e.h for e in loaded.history[2:]} == store.durable, "exactly what was reported durable"
    return loaded


def finish(store: Any, state: State, ran: list[str]) -> State:
    """Save what the failed run kept in memory, then resume it to its end."""
    saved = store.save(state)
    assert store.length(state.id) == len(saved.history)
    assert [e.h for e in store.load(state.id).history] == [e.h for e in state.history], (
        "the save completed it"
    )
    done = build(store, ran).resume(state.id)
    assert done.status == "completed" and done.answer == "done"
    return done


def check_once(done: State, ran: list[str], *, started_unsaved: bool) -> None:
    """The note tool ran at most once, and its one result says what happened.

    When the failed append was the one holding ``tool_started`` (the call was about to run and never did),
    the later save journals that start, so the resume closes the call ``aborted`` as "may or may not have
    run": safe, never a second run.
    """
    (result,) = [e for e in done.history if isinstance(e, j.ToolFinished)]
    if started_unsaved:
        assert ran == [] and result.outcome == "aborted" and result.content[0]["text"] == ABORTED_UNKNOWN
    else:
        assert ran == [result.call_id] and result.outcome == "done"


# --------------------------------------------------------------------------------------------------
# FileStore: disk full at the write


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_disk_full_at_the_write_of_an_append_loses_nothing_saved_and_a_later_save_completes_the_journal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, n: int
) -> None:
    store, ran = Recording(tmp_path), []
    journal = tmp_path / "r.jsonl"
    disk = faulty(monkeypatch, journal, Fault("pwrite", n, stays=True, partial=True))
    state = fresh_state()
    with pytest.raises(StoreFullError) as caught:
        build(store, ran).run(state)
    assert isinstance(caught.value, OSError) and caught.value.errno == errno.ENOSPC, "still an OSError"
    check_full_message(caught.value, journal)
    assert disk.failed[0] == f"pwrite#{n}"
    loaded = check_durable(store, "r")
    before = journal.read_bytes()
    assert before.endswith(b"}}\n"), "the half-written append was cut off before the error"
    assert len(state.history) > len(loaded.history), "the failed append is still in memory"
    assert ran == ([] if n < 3 else ["c3_0"])
    disk.off = True  # space was freed
    done = finish(store, state, ran)
    check_once(done, ran, started_unsaved=n == 2)


def test_a_full_disk_at_one_tool_result_does_not_stop_the_run_when_space_comes_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, ran = Recording(tmp_path), []
    disk = faulty(monkeypatch, tmp_path / "r.jsonl", Fault("pwrite", 3))
    state = build(store, ran).run("write a note", id="r")
    assert disk.failed == ["pwrite#3"], "the result's append failed once"
    assert state.status == "completed" and ran == ["c3_0"]
    loaded = store.load("r")
    assert [e.kind for e in loaded.history].count("tool_finished") == 1, "retried byte-identical, stored once"
    assert [e.h for e in loaded.history] == [e.h for e in state.history]


# --------------------------------------------------------------------------------------------------
# FileStore: I/O errors at the sync


@pytest.mark.parametrize("n", [1, 2, 4])
def test_a_failed_sync_is_never_trusted_to_a_later_successful_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, n: int
) -> None:
    store, ran = Recording(tmp_path), []
    journal = tmp_path / "r.jsonl"
    disk = faulty(monkeypatch, journal, Fault("fdatasync", n, error=errno.EIO, loses_pages=True))
    state = fresh_state()
    with pytest.raises(OSError) as caught:
        build(store, ran).run(state)
    assert caught.value.errno == errno.EIO and disk.failed == [f"fdatasync#{n}"]
    assert disk.calls["fsync"] >= 1, "the undo synced (and that sync succeeded)"
    assert b"\0" not in journal.read_bytes(), (
        "the write whose sync failed was cut off, not kept as lost pages"
    )
    check_durable(store, "r")
    done = finish(store, state, ran)
    assert b"\0" not in journal.read_bytes()
    check_once(done, ran, started_unsaved=n == 2)
    assert [e.kind for e in done.history].count("model_replied") == 2


def test_a_failed_sync_of_a_tool_result_is_rewritten_by_the_end_of_the_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, ran = Recording(tmp_path), []
    journal = tmp_path / "r.jsonl"
    disk = faulty(monkeypatch, journal, Fault("fdatasync", 3, error=errno.EIO, loses_pages=True))
    state = build(store, ran).run("write a note", id="r")
    assert disk.failed == ["fdatasync#3"] and state.status == "completed" and ran == ["c3_0"]
    assert b"\0" not in journal.read_bytes()
    assert [e.h for e in store.load("r").history] == [e.h for e in state.history]


# --------------------------------------------------------------------------------------------------
# FileStore: a failed write that cannot be undone (in a child process: the refusal lasts for the process)

BROKEN_CHILD = """
import errno, os, sys
from tether import Agent, FileStore, Message, State, StoreBrokenError, tool
from tether.stores.files import _lock as fl
from tether.testing import ScriptedModel, call

folder = sys.argv[1]
target = os.path.join(folder, "r.jsonl")
real = os

class Disk:
    def __getattr__(self, name):
        return getattr(real, name)
    def ours(self, fd):
        try:
            return real.readlink(f"/proc/self/fd/{fd}") == target
        except OSError:
            return False
    def pwrite(self, fd, data, offset):
        if self.ours(fd):  # every append after the creation (which writes a temporary file)
            real.pwrite(fd, bytes(data[: len(data) // 2]), offset)
            raise OSError(errno.ENOSPC, "No space left on device")
        return real.pwrite(fd, data, offset)
    def ftruncate(self, fd, length):
        if self.ours(fd):
            raise OSError(errno.EIO, "Input/output error")
        return real.ftruncate(fd, length)

@tool
def note(text: str) -> str:
    '''Write a note.'''
    return "noted " + text

store = FileStore(folder)
fl.os = Disk()
agent = Agent(ScriptedModel([call("note", text="x"), "done"]), name="io", tools=[note], store=store)
state = State(id="r", messages=[Message.user("write a note")])
try:
    agent.run(state)
except StoreBrokenError as exc:
    print("broken:", exc)
fl.os = real
try:
    store.save(state)
except StoreBrokenError as exc:
    print("save refused:", exc)
try:
    FileStore(folder).save(state)
except StoreBrokenError as exc:
    print("other store refused too")
"""


def test_a_failed_write_that_cannot_be_undone_stops_the_process_and_a_new_one_repairs_it(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "runs"
    done = subprocess.run(
        [sys.executable, "-c", BROKEN_CHILD, str(folder)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("broken: run r: a failed write (") and "could not be undone" in lines[0]
    assert "Fix: stop this process and resume the run from a new one" in lines[0]
    assert lines[1].startswith("save refused: run r: an earlier write to its journal failed and could not be")
    assert lines[2] == "other store refused too"
    journal = folder / "r.jsonl"
    assert not journal.read_bytes().endswith(b"\n"), "part of the failed append is still in the file"
    store, ran = FileStore(folder), []
    kept = [e.kind for e in store.load("r").history]
    assert kept == ["run_started", "message"], "the torn append is left out"
    state = build(store, ran).resume("r")
    assert state.status == "completed" and len(ran) == 1
    assert journal.read_bytes().endswith(b"\n")
    assert [e.h for e in store.load("r").history] == [e.h for e in state.history], "repaired, then completed"


# --------------------------------------------------------------------------------------------------
# A failed save in a run that is already failing


def test_a_failed_save_in_a_failing_run_raises_the_original_error_with_a_note(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, ran = Recording(tmp_path), []
    disk = faulty(monkeypatch, tmp_path / "r.jsonl", Fault("pwrite", 2, stays=True))
    state = fresh_state()
    agent = build(store, ran, [ModelError("invalid api key", retryable=False)])
    with pytest.raises(ModelError) as caught:
        agent.run(state)
    assert str(caught.value) == "invalid api key", "the original error, so `except ModelError` still works"
    notes = getattr(caught.value, "__notes__", [])
    assert notes and notes[0].startswith(
        "saving the run also failed: StoreFullError: run r: no room to write"
    )
    assert disk.failed[0] == "pwrite#2"
    loaded = check_durable(store, "r")
    assert [e.kind for e in loaded.history] == ["run_started", "message", "run_resumed"]
    assert [e.kind for e in state.history][3:] == ["model_failed", "run_stopped"], "kept in memory"
    disk.off = True
    store.save(state)
    again = store.load("r")
    assert again.status == "failed" and "invalid api key" in (again.reason or "")


@pytest.mark.parametrize("failing", [False, True], ids=["healthy run", "failing run"])
def test_a_failed_save_is_not_retried_on_close_nor_noted_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: bool
) -> None:
    store, ran = Recording(tmp_path), []
    disk = faulty(monkeypatch, tmp_path / "r.jsonl", Fault("pwrite", 2, stays=True))
    script = [ModelError("invalid api key", retryable=False)] if failing else None
    with pytest.raises(OSError if not failing else ModelError) as caught:
        build(store, ran, script).run(fresh_state())
    assert disk.failed == ["pwrite#2"], "one attempt: the closing save does not try the same append again"
    assert len(getattr(caught.value, "__notes__", [])) == (1 if failing else 0)


# --------------------------------------------------------------------------------------------------
# SQLiteStore: a commit that fails


class FailingCommits:
    """A connection wrapper whose COMMIT of chosen appends raises ``sqlite3.OperationalError``."""

    def __init__(self, conn: sqlite3.Connection, store: CommitStore) -> None:
        self._conn = conn
        self._store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
        store = self._store
        if sql == "COMMIT" and getattr(store.local, "appending", False):
            store.commits += 1
            if (
                store.fail_from is not None
                and store.commits >= store.fail_from
                and store.commits <= store.fail_to
            ):
                store.failed.append(store.commits)
                raise sqlite3.OperationalError("database or disk is full")
        return self._conn.execute(sql, *args)


class CommitStore(SQLiteStore):
    """A SQLiteStore whose appends' commits fail from ``fail_from`` to ``fail_to``; it records what returned."""

    def __init__(self, path: Path, fail_from: int | None, fail_to: int = 10**9) -> None:
        self.local = threading.local()
        self.commits = 0
        self.fail_from, self.fail_to = fail_from, fail_to
        self.failed: list[int] = []
        self.durable: dict[int, str] = {}
        super().__init__(path)

    def _conn(self) -> Any:
        return FailingCommits(super()._conn(), self)

    def append(self, run_id: str, entries: Any, **kwargs: Any) -> None:
        self.local.appending = True
        try:
            super().append(run_id, entries, **kwargs)
        finally:
            self.local.appending = False
        self.durable.update({e.seq: e.h for e in entries})


def rows(path: Path) -> tuple[int, int]:
    """(the run's length column, its entry rows), read through a connection of our own."""
    with sqlite3.connect(path) as conn:
        length = conn.execute("SELECT length FROM runs WHERE id = 'r'").fetchone()[0]
        count = conn.execute("SELECT count(*) FROM entries WHERE run_id = 'r'").fetchone()[0]
    return length, count


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_a_failed_commit_is_all_or_nothing_and_a_later_save_completes_the_journal(
    tmp_path: Path, n: int
) -> None:
    path = tmp_path / "runs.db"
    store, ran = CommitStore(path, fail_from=n), []
    state = fresh_state()
    with pytest.raises(StoreFullError) as caught:
        build(store, ran).run(state)
    check_full_message(caught.value, path)
    assert "(database or disk is full)" in str(caught.value)
    assert store.failed[0] == n
    loaded = store.load("r")
    assert {e.seq: e.h for e in loaded.history[2:]} == store.durable, "exactly what was reported durable"
    assert rows(path) == (len(loaded.history), len(loaded.history)), "no partial append"
    assert ran == ([] if n < 3 else ["c3_0"])
    store.fail_from = None  # the disk has room again
    done = finish(store, state, ran)
    assert rows(path)[0] == rows(path)[1]
    check_once(done, ran, started_unsaved=n == 2)


def test_a_commit_that_fails_once_at_a_tool_result_is_retried_by_the_end_of_the_batch(tmp_path: Path) -> None:
    store, ran = CommitStore(tmp_path / "runs.db", fail_from=3, fail_to=3), []
    state = build(store, ran).run("write a note", id="r")
    assert store.failed == [3] and state.status == "completed" and ran == ["c3_0"]
    assert [e.h for e in store.load("r").history] == [e.h for e in state.history]


# --------------------------------------------------------------------------------------------------
# SIGTERM during a save: the append completes, then the drive closes and the process exits 143


def test_sigterm_during_a_save_lets_the_append_complete_then_exits_143(tmp_path: Path) -> None:
    code = textwrap.dedent(
        """
        import signal, sys, threading
        from pathlib import Path
        from tether import Agent, FileStore, ToolContext, handle_sigterm, tool
        from tether.testing import ExecutionLog, ScriptedModel, call

        folder, side = sys.argv[1], sys.argv[2]
        marker = Path(side + ".saving")
        handled = threading.Event()

        class SlowStore(FileStore):
            def append(self, run_id, entries, **kwargs):
                if any(e.kind == "tool_finished" for e in entries) and not marker.exists():
                    marker.touch()
                    handled.wait(30)  # the save is in progress when SIGTERM arrives and is handled
                return super().append(run_id, entries, **kwargs)

        @tool
        def charge(amount: int, ctx: ToolContext) -> str:
            '''Charge a card (unsafe).'''
            ExecutionLog(side).record(call_id=ctx.call_id, pid=0)
            return f"charged {amount}"

        handle_sigterm()
        tethers = signal.getsignal(signal.SIGTERM)

        def on_sigterm(signum, frame):
            tethers(signum, frame)  # tether's handler: cancel the drive (the process exits 143 after it)
            handled.set()

        signal.signal(signal.SIGTERM, on_sigterm)
        store = SlowStore(folder)
        agent = Agent(ScriptedModel([call("charge", amount=5), "done"]), name="term", tools=[charge], store=store,
                      poll_interval=0.05)
        agent.run("charge it", id="t")
        print("not interrupted")
        """
    )
    folder, side = tmp_path / "runs", tmp_path / "side.jsonl"
    child = subprocess.Popen(
        [sys.executable, "-c", code, str(folder), str(side)], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        marker = Path(str(side) + ".saving")
        for _ in range(3000):
            if marker.exists() or child.poll() is not None:
                break
            threading.Event().wait(0.01)
        assert marker.exists(), child.stderr.read().decode() if child.stderr else ""
        child.send_signal(signal.SIGTERM)
        child.wait(30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    stdout = child.stdout.read().decode() if child.stdout else ""
    stderr = child.stderr.read().decode() if child.stderr else ""
    assert child.returncode == 143, stderr[-3000:]
    assert "not interrupted" not in stdout
    store = FileStore(folder)
    state = store.load("t")
    kinds = [e.kind for e in state.history]
    assert kinds[-2:] == ["tool_finished", "run_released"], (
        "the append in progress completed, then the release"
    )
    (result,) = [e for e in state.history if isinstance(e, j.ToolFinished)]
    assert result.outcome == "done" and result.content[0]["text"] == "charged 5", "not aborted: it was saved"
    assert state.status == "running" and store.holder("t") is None
    resumed = Agent(
        ScriptedModel([call("charge", amount=5), "done"]),
        name="term",
        tools=[_charge_not_again()],
        store=store,
    ).resume("t")
    assert resumed.status == "completed" and resumed.answer == "done"
    assert len([line for line in side.read_text().splitlines() if line]) == 1, "the tool ran once"


def _charge_not_again() -> Any:
    @tool
    def charge(amount: int) -> str:
        """Charge a card (unsafe)."""
        raise AssertionError("a saved result is never run again")

    return charge


def test_the_disk_stand_in_passes_other_files_through(tmp_path: Path) -> None:
    disk = Disk(tmp_path / "r.jsonl", Fault("pwrite", 1, stays=True))
    fd = os.open(tmp_path / "other", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        assert disk.pwrite(fd, b"abc", 0) == 3
        disk.fdatasync(fd)
    finally:
        os.close(fd)
    assert disk.calls == Counter() and disk.failed == []
    assert (tmp_path / "other").read_bytes() == b"abc"
