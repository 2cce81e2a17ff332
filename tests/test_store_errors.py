"""Errors that name what went wrong and the fix (issue 13, item 5): a full disk or SQLite file, a SQLite file
another process keeps locked, a SQLite path that cannot be created.

A full disk is a real one where this machine allows it (a tiny tmpfs, mounted by root); a full SQLite file
is a real ``SQLITE_FULL`` (``PRAGMA max_page_count``). Each checks that nothing saved is lost: the journal
loads, and a later save and resume complete the run. The injected faults of ``test_io_errors.py`` cover the
same errors at every append of a run.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tether import (
    Agent,
    CorruptJournalError,
    FileStore,
    Message,
    SQLiteStore,
    State,
    StoreFullError,
    StoreLockedError,
    TetherError,
    open_store,
    tool,
)
from tether.testing import ScriptedModel, call

BIG = 300_000  # bytes of one tool result: more than the tiny disk and the small SQLite file hold


def big_agent(store: Any) -> Agent:
    @tool(effect="read_only")
    def fetch(page: str) -> str:
        """Fetch a page."""
        return "x" * BIG

    return Agent(ScriptedModel([call("fetch", page="a"), "done"]), name="fetcher", tools=[fetch], store=store)


def check_full(exc: StoreFullError, path: Path) -> None:
    text = str(exc)
    assert text.startswith(f"run r: no room to write {path} ("), text
    assert "everything saved before it is kept" in text
    assert "Fix: free space on that disk" in text and "tether resume r" in text
    assert exc.errno is not None and exc.filename == str(path) and exc.run_id == "r"


def finish_after(store: Any, state: Any) -> None:
    """The journal loads with what was saved; a save writes the rest; a resume completes the run."""
    loaded = store.load("r")
    assert [e.kind for e in loaded.history][:3] == ["run_started", "message", "run_resumed"]
    assert len(loaded.history) < len(state.history), "the refused write is still in memory"
    store.save(state)
    assert [e.h for e in store.load("r").history] == [e.h for e in state.history]
    done = big_agent(store).resume("r")
    assert done.status == "completed" and done.answer == "done"


# --------------------------------------------------------------------------------------------------
# A full disk (FileStore) and a full SQLite file


@contextlib.contextmanager
def tiny_disk(where: Path, size: str) -> Iterator[Path]:
    where.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount command")
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True, check=False
    )
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {made.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def test_a_full_disk_names_the_run_file_and_fix_and_a_save_after_freeing_space_completes(
    tmp_path: Path,
) -> None:
    with tiny_disk(tmp_path / "disk", "128k") as disk:
        store = FileStore(disk / "runs")
        agent = big_agent(store)
        state = State(id="r", messages=[Message.user("fetch a")])
        with pytest.raises(StoreFullError) as caught:
            agent.run(state)
        check_full(caught.value, disk / "runs" / "r.jsonl")
        assert isinstance(caught.value, OSError)
        subprocess.run(["mount", "-o", "remount,size=8m", str(disk)], check=True)  # space comes back
        finish_after(FileStore(disk / "runs"), state)


class SmallSQLite(SQLiteStore):
    """A SQLiteStore whose file may grow to ``limit`` pages (``PRAGMA max_page_count``; None: no limit)."""

    limit: int | None = None

    def _conn(self) -> Any:
        conn = super()._conn()
        conn.execute(f"PRAGMA max_page_count = {self.limit or 1073741823}")
        return conn


def test_a_full_sqlite_file_names_the_run_file_and_fix_and_a_later_save_completes(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    store = SmallSQLite(path)
    (pages,) = store._conn().execute("PRAGMA page_count").fetchone()
    store.limit = pages + 8  # room for the run's small appends, not for the 300 KB result
    state = State(id="r", messages=[Message.user("fetch a")])
    with pytest.raises(StoreFullError) as caught:
        big_agent(store).run(state)
    check_full(caught.value, path)
    assert "(database or disk is full)" in str(caught.value)
    store.limit = None
    finish_after(store, state)


# --------------------------------------------------------------------------------------------------
# A SQLite file another process keeps locked

HOLDER = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
print("held", flush=True)
time.sleep(float(sys.argv[2]))
conn.execute("COMMIT")
"""


@contextlib.contextmanager
def write_lock_held(path: Path, seconds: float) -> Iterator[subprocess.Popen[bytes]]:
    """Another process holding a write transaction on ``path`` for ``seconds`` (killed at the end)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(path), str(seconds)], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"held\n"
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_creating_a_run_waits_out_another_process_write_lock_as_an_append_does(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    store = SQLiteStore(path, busy_timeout_ms=300)  # one try waits 0.3 s; the store waits lock_timeout
    with write_lock_held(path, 2.0) as holder:
        state = Agent(ScriptedModel(["hi"]), name="a", store=store).run("hello", id="r")
        assert holder.wait(30) == 0, "the other process committed, then the run was created"
    assert state.status == "completed" and store.load("r").status == "completed"


def test_a_write_lock_held_past_lock_timeout_names_the_file_and_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    store = SQLiteStore(path, busy_timeout_ms=200, lock_timeout=1.0)
    # raised while the lock is still held: it gave up at lock_timeout rather than waiting it out
    with write_lock_held(path, 120.0), pytest.raises(StoreLockedError) as caught:
        Agent(ScriptedModel(["hi"]), name="a", store=store).run("hello", id="r")
    text = str(caught.value)
    assert text.startswith(f"run r: SQLite file {store.path} stayed locked by another process's write for ")
    assert "(database is locked); nothing was written. Fix: end the process holding" in text
    assert "SQLiteStore(path, lock_timeout=SECONDS)" in text
    assert not store.exists("r")
    assert Agent(ScriptedModel(["hi"]), name="a", store=store).run("hello", id="r").status == "completed"


# --------------------------------------------------------------------------------------------------
# A SQLite path that cannot be created


@pytest.mark.skipif(not Path("/proc/self").exists(), reason="needs Linux's /proc")
def test_a_sqlite_path_that_cannot_be_created_names_the_path() -> None:
    with pytest.raises(TetherError) as caught:
        open_store("sqlite:////proc/x.db")
    text = str(caught.value)
    assert text.startswith("cannot create the SQLite file /proc/x.db (No such file or directory). Fix: ")
    assert "sqlite:///runs.db" in text


def test_a_store_folder_that_cannot_be_created_names_the_folder() -> None:
    store = open_store("file:/proc/x/runs")  # opening creates nothing yet: the first write does
    with pytest.raises(TetherError) as caught:
        store.save(State(id="r1", messages=[Message.user("hello")]))
    text = str(caught.value)
    assert text.startswith("cannot create the store folder /proc/x/runs (No such file or directory). Fix: ")
    assert "file:./runs" in text


# --------------------------------------------------------------------------------------------------
# A stray JSON line in a FileStore journal


@pytest.mark.parametrize("where", ["end", "middle"])
def test_a_stray_json_line_is_named_by_file_and_line_and_removing_it_restores_the_journal(
    tmp_path: Path, where: str
) -> None:
    store = FileStore(tmp_path / "runs")
    Agent(ScriptedModel(["hi"]), name="a", store=store).run("hello", id="r")
    journal = tmp_path / "runs" / "r.jsonl"
    whole = journal.read_bytes()
    lines = whole.splitlines(keepends=True)
    at = len(lines) if where == "end" else 3  # after the first append (2 entries and its listing line)
    journal.write_bytes(b"".join([*lines[:at], b'{"note": "added by hand"}\n', *lines[at:]]))
    for reader in (store, FileStore(tmp_path / "runs")):  # a cached tail, and a fresh store
        with pytest.raises(CorruptJournalError) as caught:
            reader.load("r")
        text = str(caught.value)
        assert f"is damaged: line {at + 1} of {journal} is not a tether journal entry (" in text, text
        assert f"Fix: if something other than tether wrote line {at + 1}, remove that line" in text
        assert "countdown (b=None" not in text
    journal.write_bytes(whole)
    assert FileStore(tmp_path / "runs").load("r").status == "completed"
