"""Tests for tether.journal: entry kinds, ids, the codec, checksums and format versions (DESIGN 4)."""

from __future__ import annotations

import dataclasses
import re
import time
from pathlib import Path

import orjson
import pytest

from tether import journal as j
from tether.errors import CorruptJournalError, NewerFormatError
from tether.state import State

RUN = "run-1"


def sample_entries() -> list[j.Entry]:
    """One entry of every kind, with non-default fields, numbered from 0."""
    at = j.now_iso()
    made = [
        j.RunStarted(seq=0, at=at, agent="support", fingerprint={"model": "m"}, budgets={"max_turns": 3}),
        j.RunResumed(seq=0, at=at, writer="ab" * 16, token=7, host="h", pid=123),
        j.MessageAdded(seq=0, at=at, role="user", content=[{"type": "text", "text": "héllo ✓"}], inbox_seq=2),
        j.ModelReplied(
            seq=0,
            at=at,
            content=[{"type": "tool_call", "id": "c3_0", "name": "t", "args": {"x": [1, 2]}}],
            stop_reason="tool_use",
            usage={"input_tokens": 10, "output_tokens": 5},
        ),
        j.ModelFailed(seq=0, at=at, error_type="ModelError", error="overloaded", retryable=True),
        j.ApprovalRequested(seq=0, at=at, call_id="c3_0", round=0, tool="t", args={"x": 1}),
        j.ApprovalDecided(seq=0, at=at, call_id="c3_0", round=0, approved=True, by="alice", reason="ok"),
        j.ToolStarted(
            seq=0,
            at=at,
            call_id="c3_0",
            tool="t",
            effect="idempotent",
            idempotency_key="tether:r:c3_0",
            attempt=2,
        ),
        j.ToolFinished(
            seq=0, at=at, call_id="c3_0", outcome="done", content=[{"type": "text", "text": "42"}]
        ),
        j.ChildWaiting(seq=0, at=at, call_id="c3_0", child_id="child", pending=[{"call_id": "c1_0"}]),
        j.Compacted(seq=0, at=at, summary="so far", upto_seq=4),
        j.AgentChanged(seq=0, at=at, old={"model": "a"}, new={"model": "b"}),
        j.BudgetsChanged(seq=0, at=at, old={}, new={"max_turns": 5}),
        j.CancelRequested(seq=0, at=at, by="bob", inbox_seq=3),
        j.InboxSkipped(seq=0, at=at, inbox_seq=4, item_id="i4", reason="run completed"),
        j.RunReleased(seq=0, at=at, reason="interrupted"),
        j.RunStopped(seq=0, at=at, status="completed", answer="42", usage={"input_tokens": 10}),
    ]
    return [dataclasses.replace(entry, seq=i) for i, entry in enumerate(made)]


def test_every_kind_round_trips_through_the_codec() -> None:
    entries = sample_entries()
    assert {e.kind for e in entries} == set(j.KINDS), "the sample must cover every kind"
    sealed = j.seal(entries, "w" * 32, run_id=RUN)
    decoded = j.decode_journal(RUN, [j.encode_entry(e) for e in sealed])
    assert decoded == sealed
    assert [j.encode_entry(e, RUN) for e in decoded] == [j.encode_entry(e) for e in sealed], (
        "encoded again alike"
    )
    for entry in decoded:
        assert isinstance(entry.seq, int) and entry.kind and entry.at


def test_the_fast_decoder_reads_every_kind_as_decode_entry_does_with_and_without_defaults() -> None:
    from tether.journal import codec

    bare = [cls(seq=0, at=j.now_iso()) for cls in j.KINDS.values()]
    for entries in (sample_entries(), [dataclasses.replace(e, seq=i) for i, e in enumerate(bare)]):
        sealed = j.seal(entries, "w" * 32, run_id=RUN)
        decode = j.LineDecoder(RUN)
        for entry in sealed:
            line = j.encode_entry(entry)
            slow = j.decode_entry(line, RUN, journal_version=j.FORMAT_VERSION)
            assert decode(line, j.FORMAT_VERSION, entry.seq) == slow == entry
            if entry.kind != "run_started":  # the one kind always read by decode_entry
                obj = orjson.loads(line)
                built = codec._FAST[obj.pop("kind")](obj, RUN)
                assert built == entry and built.__class__ is entry.__class__, (
                    f"{entry.kind} took the fast path"
                )


def test_seal_stamps_writer_countdown_and_checksum() -> None:
    sealed = j.seal(sample_entries()[:3], "f" * 32, run_id=RUN)
    assert [e.b for e in sealed] == [2, 1, 0]
    assert all(e.w == "f" * 16 and re.fullmatch(r"[A-Za-z0-9+/]{16}", e.h) for e in sealed)
    assert len({e.h for e in sealed}) == 3


def test_checksum_covers_every_byte_but_its_own_and_the_run_id() -> None:
    (entry,) = j.seal([sample_entries()[2]], "a" * 32, run_id=RUN)
    line = j.encode_entry(entry)
    assert j.decode_entry(line, RUN) == entry
    for field, value in (
        ("w", "b" * 16),
        ("b", 5),
        ("at", 1),
        ("content", []),
        ("inbox_seq", 9),
    ):
        bad = {**orjson.loads(line), field: value}
        with pytest.raises(CorruptJournalError, match=rf"run {RUN} seq 2 .*checksum.*Fix:"):
            j.decode_entry(orjson.dumps(bad), RUN)
    with pytest.raises(
        CorruptJournalError, match=r"run other seq 2 .*checksum \(it is damaged, or of another run\)"
    ):
        j.decode_entry(line, "other")


def test_a_flipped_byte_in_a_value_fails_the_checksum_naming_run_and_seq() -> None:
    entries = j.seal(sample_entries()[:4], "a" * 32, run_id=RUN)
    raws = [j.encode_entry(e) for e in entries]
    raws[2] = raws[2].replace(b"h\xc3\xa9llo", b"hallo")
    with pytest.raises(CorruptJournalError) as info:
        j.decode_journal(RUN, raws)
    assert info.value.run_id == RUN and info.value.seq == 2
    assert f"run {RUN} seq 2" in str(info.value) and "Fix:" in str(info.value)


def test_an_undecodable_line_names_run_and_seq() -> None:
    entries = j.seal(sample_entries()[:4], "a" * 32, run_id=RUN)
    raws = [j.encode_entry(e) for e in entries]
    raws[1] = raws[1][:-3]  # no longer JSON
    with pytest.raises(CorruptJournalError) as info:
        j.decode_journal(RUN, raws)
    assert info.value.seq == 1
    assert f"run {RUN} seq 1" in str(info.value)


def test_unknown_kind_and_unknown_field_are_corruption() -> None:
    (entry,) = j.seal([sample_entries()[0]], "a" * 32, run_id=RUN)
    obj = orjson.loads(j.encode_entry(entry))
    for change in ({"kind": "tool_exploded"}, {"surprise": 1}):
        bad = {**obj, **change}
        bad["h"] = j.checksum(bad, RUN)
        with pytest.raises(CorruptJournalError, match=rf"run {RUN} seq 0"):
            j.decode_entry(orjson.dumps(bad), RUN)


def test_seqs_must_count_from_zero_without_gaps() -> None:
    entries = j.seal(sample_entries()[:3], "a" * 32, run_id=RUN)
    raws = [j.encode_entry(entries[0]), j.encode_entry(entries[2])]
    with pytest.raises(CorruptJournalError, match=rf"run {RUN} seq 2 .*expected seq 1"):
        j.decode_journal(RUN, raws)


def _newer(entry: j.Entry, **change: object) -> bytes:
    obj = {**orjson.loads(j.encode_entry(entry)), **change}
    obj["h"] = j.checksum(obj, RUN)
    return orjson.dumps(obj)


def test_an_entry_of_a_newer_format_is_refused_with_both_versions() -> None:
    entries = j.seal(sample_entries()[:4], "a" * 32, run_id=RUN)
    raws = [j.encode_entry(e) for e in entries]
    raws[3] = _newer(entries[3], v=j.FORMAT_VERSION + 1)
    with pytest.raises(NewerFormatError) as info:
        j.decode_journal(RUN, raws)
    assert str(info.value) == (
        f"run {RUN} seq 3 was written by format {j.FORMAT_VERSION + 1}; this tether reads up to "
        f"{j.FORMAT_VERSION}. Fix: upgrade tether"
    )
    assert isinstance(info.value, ValueError)


def test_a_journal_started_by_a_newer_format_is_refused_at_its_run_started() -> None:
    entries = j.seal(sample_entries()[:2], "a" * 32, run_id=RUN)
    raws = [_newer(entries[0], version=j.FORMAT_VERSION + 1), j.encode_entry(entries[1])]
    with pytest.raises(
        NewerFormatError, match=rf"run {RUN} seq 0 was written by format {j.FORMAT_VERSION + 1}"
    ):
        j.decode_journal(RUN, raws)


def test_run_ids_are_validated() -> None:
    for good in ("a", "nightly-report", "A_b-9", "x" * 128):
        assert j.validate_run_id(good) == good
    for bad in ("", "x" * 129, "../etc", "a b", "a/b", "é", None, 5):
        with pytest.raises(ValueError, match="Fix:"):
            j.validate_run_id(bad)


def test_new_run_ids_are_32_hex_and_start_with_the_time() -> None:
    before = time.time_ns() // 1_000_000
    made = {j.new_run_id() for _ in range(100)}
    after = time.time_ns() // 1_000_000
    assert len(made) == 100
    for run_id in made:
        assert re.fullmatch(r"[0-9a-f]{32}", run_id)
        assert before <= int(run_id[:12], 16) <= after


def test_call_ids_and_keys() -> None:
    assert j.call_id_for(7, 1) == "c7_1"
    assert j.idempotency_key_for("r1", "c7_1") == "tether:r1:c7_1"
    assert re.fullmatch(r"[0-9a-f]{32}", j.new_writer_id())


def test_a_format_1_journal_loads_and_what_this_tether_appends_is_format_2_marked_newer(
    tmp_path: Path,
) -> None:
    from tether import Agent, FileStore
    from tether.testing import ScriptedModel
    from tether.writing import JournalWriter

    store = FileStore(tmp_path)
    old = JournalWriter(State(id=RUN))  # entries as a format-1 tether wrote them: no v, no new fields
    old.add(j.RunStarted, version=1, agent="agent", root_id=RUN)
    old.state.apply(
        j.MessageAdded(seq=1, at=j.now_iso(), role="user", content=[{"type": "text", "text": "hi"}])
    )
    store.create(RUN, old.next_batch(), old.state.info())
    assert store.load(RUN).format_version == 1 and all(e.v is None for e in store.load(RUN).history)
    done = Agent(ScriptedModel(["hello"]), store=store).resume(RUN)
    assert done.status == "completed" and done.answer == "hello"
    appended = store.read(RUN)[2:]
    assert appended and all(e.v == j.LEGACY_VERSION == 2 and len(e.w) == 32 for e in appended)
    raws = (tmp_path / f"{RUN}.jsonl").read_bytes().splitlines()
    assert all(raw.startswith((b'{"kind"', b'{"info"')) for raw in raws), "format-2 lines, full listing lines"
