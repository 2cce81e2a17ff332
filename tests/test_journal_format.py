"""Format 3 (DESIGN 4, 13; docs/journal-format.md): compact lines, each bound to its run id, read by raw bytes."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import orjson
import pytest

from tether import Agent, CorruptJournalError, FileStore, SQLiteStore, tool
from tether import journal as j
from tether.errors import ConflictError
from tether.state import State
from tether.stores.base import Owner
from tether.testing import ScriptedModel, call
from tether.writing import JournalWriter


@tool(effect="read_only")
def lookup(n: int) -> str:
    """Look a number up.

    Args:
        n: The number.
    """
    return f"result {n}"


def _drive(store: Any, run_id: str = "r1", turns: int = 3) -> Any:
    script: list[object] = [call("lookup", n=i) for i in range(turns)] + ["done"]
    return Agent(ScriptedModel(script), name="bench", tools=[lookup], store=store).run("go", id=run_id)


def test_a_line_begins_with_h_and_holds_no_field_longer_than_it_must_be(tmp_path: Path) -> None:
    state = _drive(FileStore(tmp_path))
    lines = [line for line in (tmp_path / "r1.jsonl").read_bytes().splitlines() if line.startswith(b'{"h"')]
    assert len(lines) == len(state.history)
    started = orjson.loads(next(line for line in lines if b'"kind":"tool_started"' in line))
    assert list(started)[:5] == ["h", "kind", "seq", "at", "w"]
    assert isinstance(started["at"], int) and len(started["w"]) == 16 and len(started["h"]) == 16
    assert "idempotency_key" not in started and "b" not in started and "attempt" not in started  # derivable
    loaded = FileStore(tmp_path).load("r1")
    assert loaded.history == state.history
    first = next(e for e in loaded.history if isinstance(e, j.ToolStarted))
    assert first.idempotency_key == f"tether:r1:{first.call_id}" and first.attempt == 1
    assert all(e.at.endswith("Z") and j.micros_from_iso(e.at) is not None for e in loaded.history)


def test_an_entry_copied_into_another_run_fails_its_checksum(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    _drive(store, "r1")
    _drive(store, "r2")
    lines = (tmp_path / "r2.jsonl").read_bytes().split(b"\n")
    theirs = (tmp_path / "r1.jsonl").read_bytes().split(b"\n")
    n = next(i for i, line in enumerate(lines) if b'"kind":"tool_finished"' in line)
    lines[n] = theirs[n]  # the same entry (same seq, same kind) from run r1
    (tmp_path / "r2.jsonl").write_bytes(b"\n".join(lines))
    with pytest.raises(
        CorruptJournalError,
        match=r"run r2 seq \d+ is damaged: (the entry|line \d+ of \S+) fails its checksum \(it is damaged, or of another run\)",
    ):
        FileStore(tmp_path).load("r2")


@pytest.mark.parametrize("kind", ["file", "sqlite"])
def test_a_whole_journal_copied_under_another_run_id_is_corruption(tmp_path: Path, kind: str) -> None:
    if kind == "file":
        _drive(FileStore(tmp_path / "a"), "r1")
        (tmp_path / "b").mkdir(mode=0o700)
        shutil.copy(tmp_path / "a" / "r1.jsonl", tmp_path / "b" / "copy.jsonl")
        (tmp_path / "b" / "copy.inbox.jsonl").write_bytes(b"")
        store: Any = FileStore(tmp_path / "b")
    else:
        store = SQLiteStore(tmp_path / "runs.db")
        _drive(store, "r1")
        import sqlite3

        conn = sqlite3.connect(tmp_path / "runs.db")
        with conn:
            conn.execute("UPDATE entries SET run_id = 'copy' WHERE run_id = 'r1'")  # no FK check by default
            conn.execute("UPDATE runs SET id = 'copy' WHERE id = 'r1'")
        conn.close()
    with pytest.raises(
        CorruptJournalError,
        match=r"run copy seq 0 is damaged: (the entry|line \d+ of \S+) fails its checksum",
    ):
        store.load("copy")
    store.close()


def test_a_legacy_line_in_a_format_3_journal_is_corruption() -> None:
    (started,) = j.seal([j.RunStarted(seq=0, at=j.now_iso(), agent="a")], "w" * 32, run_id="r")
    (old,) = j.seal([j.MessageAdded(seq=1, at=j.now_iso())], "w" * 32, run_id="r", version=2)
    with pytest.raises(
        CorruptJournalError, match=r"run r seq 1 is damaged: a format-2 entry in a format-3 journal"
    ):
        j.decode_journal("r", [j.encode_entry(started), j.encode_entry(old)])


def test_times_round_trip_exactly_and_other_text_stays_text() -> None:
    at = j.now_iso()
    assert j.iso_from_micros(j.micros_from_iso(at) or 0) == at
    for odd in (
        "2026-12-01T11:39:55Z",
        "2026-12-01T11:39:55.1234567Z",
        "yesterday",
        "2026-12-01 11:39:55.123456Z",
    ):
        assert j.micros_from_iso(odd) is None
        (entry,) = j.seal([j.MessageAdded(seq=0, at=odd)], "w" * 32, run_id="r")
        assert (
            orjson.loads(j.encode_entry(entry))["at"] == odd
            and j.decode_entry(j.encode_entry(entry), "r") == entry
        )


def test_format_3_defaults_are_pinned() -> None:
    # A default left out of a line is part of format 3: changing one changes what old lines decode to.
    pinned = {cls.kind: {name: default for name, default in fields} for cls, fields in j.DEFAULTS.items()}
    assert pinned["tool_started"] == {
        "call_id": "", "tool": "", "effect": "unsafe", "idempotency_key": pinned["tool_started"]["idempotency_key"],
        "attempt": 1, "max_attempts": None,
    }  # fmt: skip
    assert pinned["tool_finished"] == {"call_id": "", "outcome": "done", "content": [], "usage": None}
    assert pinned["message"] == {"role": "user", "content": [], "inbox_seq": None, "item_id": None}
    assert pinned["run_stopped"] == {
        "status": "completed", "answer": None, "output": None, "output_type": None, "reason": None, "usage": None,
    }  # fmt: skip
    assert pinned["approval_decided"]["approved"] is False and pinned["approval_requested"]["round"] == 0
    assert pinned["run_started"]["submitted"] is False
    line = orjson.loads(
        j.encode_entry(j.seal([j.RunStarted(seq=0, at=j.now_iso())], "w" * 32, run_id="r")[0])
    )
    assert line["version"] == j.FORMAT_VERSION == 3, (
        "run_started always says its format (older tethers refuse by it)"
    )


def test_the_writer_field_is_the_writer_ids_first_64_bits_and_tells_writers_apart(tmp_path: Path) -> None:
    # DURABILITY 3: a retried head is skipped only when each stored entry has its w and h. Two writers
    # sealing the very same entry (same seq, kind, fields and microsecond) differ in w, so in h as well.
    store = FileStore(tmp_path)
    state = _drive(store, "r1", turns=0)
    at = j.now_iso()
    mine, theirs = j.new_writer_id(), j.new_writer_id()
    entry = j.MessageAdded(seq=len(state.history), at=at, content=[{"type": "text", "text": "same"}])
    (a,) = j.seal([entry], mine, run_id="r1")
    (b,) = j.seal([entry], theirs, run_id="r1")
    assert a.w == mine[:16] and b.w == theirs[:16] and a.h != b.h
    lease = store.claim("r1", Owner.here(mine))
    store.append("r1", [a], expected_seq=a.seq, writer=mine, lease_token=lease.token, info=state.info())
    store.append(
        "r1", [a], expected_seq=a.seq, writer=mine, lease_token=lease.token, info=state.info()
    )  # retry
    with pytest.raises(ConflictError, match=rf"seq {a.seq} holds a message entry from writer {mine[:8]}"):
        store.append("r1", [b], expected_seq=b.seq, writer=theirs, lease_token=lease.token, info=state.info())
    assert store.length("r1") == a.seq + 1
    store.abandon(lease)


def test_short_listing_lines_keep_the_listing_whole(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    prompt = "What is the weather in London? " * 6
    script: list[object] = [call("lookup", n=i) for i in range(40)] + ["done"]
    agent = Agent(ScriptedModel(script), name="bench", tools=[lookup], store=store)
    state = agent.run(prompt, id="r1", metadata={"user": "u42"})
    lines = (tmp_path / "r1.jsonl").read_bytes().splitlines()
    full = [line for line in lines if line.startswith(b'{"info"')]
    short = [line for line in lines if line.startswith(b'{"i":')]
    assert len(full) >= 2 and len(short) > 10 * len(full), "a full line only every few KiB"
    assert all(len(line) < 60 for line in short)
    (info,) = FileStore(tmp_path).list()
    assert (info.agent, info.status, info.turn, info.first_message, info.metadata) == (
        "bench", "completed", 41, prompt[:200], {"user": "u42"},
    )  # fmt: skip
    assert info.created_at == state.created_at and info.updated_at == state.updated_at
    assert info.length == len(state.history) and info.inbox_consumed == -1


def test_a_fork_of_an_old_run_is_format_3_under_its_own_id(tmp_path: Path) -> None:
    src = Path(__file__).parent / "fixtures" / "old_journals" / "files"
    shutil.copytree(src, tmp_path / "files")
    store = FileStore(tmp_path / "files")
    forked = store.fork("f2-done", at_seq=16)
    state = store.load(forked)
    assert state.format_version == 3 and state.answer == "thanks"
    assert all(len(e.w) == 16 and e.v is None for e in state.history)
    assert (tmp_path / "files" / f"{forked}.jsonl").read_bytes().startswith(b'{"h":"')


def test_a_writer_of_a_format_2_journal_seals_format_2() -> None:
    old = JournalWriter(State(id="r"))
    old.add(j.RunStarted, version=2, agent="a")
    old.add(j.MessageAdded, content=[])
    batch = old.next_batch()
    assert all(len(e.w) == 32 and j.encode_entry(e).startswith(b'{"kind"') for e in batch)
    assert j.decode_journal("r", [j.encode_entry(e) for e in batch]) == batch


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"kind": ["message"]}, "unknown entry kind"),
        ({"seq": "1"}, "no integer seq"),
    ],
)
def test_an_odd_line_with_a_valid_checksum_is_corruption_not_a_crash(
    change: dict[str, Any], problem: str
) -> None:
    (started,) = j.seal([j.RunStarted(seq=0, at=j.now_iso())], "w" * 32, run_id="r")
    (entry,) = j.seal([j.MessageAdded(seq=1, at=j.now_iso())], "w" * 32, run_id="r")
    obj = {**orjson.loads(j.encode_entry(entry)), **change}
    obj["h"] = j.checksum(obj, "r")
    with pytest.raises(CorruptJournalError, match=rf"run r seq \d+ is damaged: .*{problem}"):
        j.decode_journal("r", [j.encode_entry(started), orjson.dumps(obj)])


def _odd_entries(at: str) -> list[j.Entry]:
    """Entries of every kind, some with None where the default is not None, a ``v``, an odd time."""
    out: list[j.Entry] = []
    for i, cls in enumerate(j.KINDS.values()):
        names = [n for n, _ in j.DEFAULTS[cls]]
        nones = {n: None for n in names[::2] if n != "version"}  # None where a default may be other
        out.append(
            cls(seq=i, at=at if i % 3 else "2026-01-01 not a time", v=4 if i % 4 == 1 else None, **nones)
        )
    out.append(
        j.ToolStarted(
            seq=len(out), at=at, call_id="c1_0", tool="t", idempotency_key="tether:r1:c1_0", attempt=1
        )
    )
    out.append(j.ModelReplied(seq=len(out), at=at, content=[{"type": "text", "text": "hi"}], usage={"in": 1}))
    return out


def test_sealing_a_writers_own_entries_in_place_makes_what_seal_makes() -> None:
    at = j.now_iso()
    copies = j.seal(_odd_entries(at), "w" * 32, run_id="r1")
    own = _odd_entries(at)
    assert j.seal_own(own, "w" * 32, run_id="r1") is own
    assert own == copies  # every field, w, h and b included
    assert [j.encode_entry(e) for e in own] == [j.encode_entry(e) for e in copies]
    decoded = [j.decode_entry(j.encode_entry(e), "r1") for e in own[1:]]  # run_started: its own journal
    assert [e.h for e in decoded] == [e.h for e in own[1:]]


def test_a_writer_seals_the_entries_its_state_holds_and_a_retry_resends_the_same_bytes() -> None:
    writer = JournalWriter(State(id="r1"))
    made = writer.add(j.RunStarted, agent="a")
    message = writer.add(j.MessageAdded, role="user", content=[{"type": "text", "text": "go"}])
    batch = writer.next_batch()
    assert batch[0] is made and batch[1] is message and writer.state.history == batch
    assert [e.b for e in batch] == [1, 0] and all(e.h and e.w for e in batch)
    lines = [j.encode_entry(e) for e in batch]
    assert writer.next_batch() is batch and [j.encode_entry(e) for e in batch] == lines  # byte-identical
    loaded = State.replay("r1", [j.decode_entry(line, "r1") for line in lines])
    assert loaded.history == writer.state.history
