"""Damaged and newer journals in a FileStore: a torn tail is repaired by the next append, anything else is
refused with a clear error naming run and seq (DESIGN 4, DURABILITY 5)."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from _helpers import finished, killed, kinds, ok, out, run, snapshot, starts

from tether import CorruptJournalError, FileStore, NewerFormatError
from tether import journal as j

pytestmark = pytest.mark.crash


def lines_of(path: Path) -> list[bytes]:
    return path.read_bytes().split(b"\n")[:-1]


def entry_line(path: Path, seq: int) -> int:
    """The line number of the entry with this seq."""
    for n, line in enumerate(lines_of(path)):
        if line.startswith((b'{"kind"', b'{"h"')) and orjson.loads(line)["seq"] == seq:
            return n
    raise AssertionError(f"no entry {seq}")


def rewrite_line(path: Path, n: int, new: bytes) -> None:
    lines = lines_of(path)
    lines[n] = new
    path.write_bytes(b"\n".join(lines) + b"\n")


@pytest.fixture
def finished_run(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A completed run 'r' made by a real process: (store folder, side file, journal path)."""
    runs, side = tmp_path / "runs", tmp_path / "side.jsonl"
    ok(run("start", runs, "r", side, "basic"))
    return runs, side, runs / "r.jsonl"


def test_a_torn_append_is_left_out_by_load_and_cut_off_by_the_next_append(tmp_path: Path) -> None:
    runs, side = tmp_path / "runs", tmp_path / "side.jsonl"
    assert killed(run("start", runs, "t", side, "basic", TETHER_FAILPOINT="torn_append:tool_finished"))
    journal = runs / "t.jsonl"
    torn = journal.read_bytes()
    cut_at = torn.rfind(b"\n", 0, torn.find(b'"kind":"tool_finished"')) + 1  # where that line begins
    assert cut_at > 0 and not torn.endswith(b"\n"), "half an append was written"
    before = snapshot(runs)
    state = FileStore(runs).load("t")
    assert kinds(state)[-1] == "tool_started" and len(state.history) == 5, "load shows the valid prefix"
    assert snapshot(runs) == before, "load never repairs"
    assert len(FileStore(runs).read("t")) == 5
    ok(run("resume", runs, "t", side, "basic"))
    assert len(starts(side, call_id="c3_0")) == 1
    repaired = FileStore(runs).load("t")
    assert repaired.status == "completed"
    (result,) = finished(repaired)["c3_0"]
    assert result.outcome == "aborted"
    assert [e.kind for e in repaired.history[5:7]] == ["run_resumed", "tool_finished"], (
        "seqs go on from the prefix"
    )
    after = journal.read_bytes()
    assert after.startswith(torn[:cut_at]) and not after.startswith(torn), "the torn bytes were cut off"
    assert out(side)["answer"].startswith("answer: aborted:")


@pytest.mark.parametrize("cut", [1, 20, 200])
def test_a_truncated_last_append_is_left_out_and_repaired_on_resume(
    finished_run: tuple[Path, Path, Path], cut: int
) -> None:
    runs, side, journal = finished_run
    data = journal.read_bytes()
    journal.write_bytes(data[:-cut])
    before = snapshot(runs)
    state = FileStore(runs).load("r")
    assert len(state.history) == 6 and kinds(state)[-1] == "tool_finished", (
        "the last append (reply + stop) is torn"
    )
    assert state.status == "running"
    assert snapshot(runs) == before
    ok(run("resume", runs, "r", side, "basic"))
    assert len(starts(side, call_id="c3_0")) == 1
    again = FileStore(runs).load("r")
    assert again.status == "completed" and again.answer == "answer: done:5"
    assert [e.seq for e in again.history] == list(range(len(again.history)))
    assert journal.read_bytes().startswith(
        data[: data.rfind(b"\n", 0, data.find(b'"kind":"model_replied","seq":6')) + 1]
    )


@pytest.mark.parametrize("where", ["value", "structure"])
def test_a_bit_flip_in_a_middle_line_is_corruption_naming_run_and_seq(
    finished_run: tuple[Path, Path, Path], where: str
) -> None:
    runs, side, journal = finished_run
    n = entry_line(journal, 3)
    line = bytearray(lines_of(journal)[n])
    at = line.index(b"tool_use") if where == "value" else 0
    line[at] ^= 0x01  # 't' -> 'u' in a value, or '{' -> 'z' at the start of the line
    rewrite_line(journal, n, bytes(line))
    before = snapshot(runs)
    with pytest.raises(CorruptJournalError) as info:
        FileStore(runs).load("r")
    message = str(info.value)
    assert info.value.seq == 3 and "run r seq 3" in message and "Fix:" in message
    resumed = run("resume", runs, "r", side, "basic")
    assert resumed.returncode == 3, resumed.stderr.decode()[-2000:]
    report = out(side)
    assert report["error"] == "CorruptJournalError" and report["message"] == message
    assert snapshot(runs) == before, "a damaged line is never truncated or rewritten"


def test_a_damaged_last_append_does_not_break_the_listing(finished_run: tuple[Path, Path, Path]) -> None:
    runs, side, journal = finished_run
    ok(run("start", runs, "other", side, "chat"))
    n = entry_line(journal, 7)
    line = bytearray(lines_of(journal)[n])
    line[line.index(b"answer")] ^= 0x02
    rewrite_line(journal, n, bytes(line))
    listed = {info.id: info.status for info in FileStore(runs).list()}
    assert listed["other"] == "completed"
    assert listed["r"] != "completed"
    with pytest.raises(CorruptJournalError, match="run r seq 7"):
        FileStore(runs).load("r")


@pytest.mark.parametrize("seq", [0, 3])
def test_a_newer_format_is_refused_naming_run_seq_and_both_versions(
    finished_run: tuple[Path, Path, Path], seq: int
) -> None:
    runs, side, journal = finished_run
    n = entry_line(journal, seq)
    obj = orjson.loads(lines_of(journal)[n])
    newer = j.FORMAT_VERSION + 1
    if seq == 0:
        obj["version"] = newer
    else:
        obj["v"] = newer
    obj["h"] = j.checksum(obj, "r")
    rewrite_line(journal, n, orjson.dumps(obj))
    before = snapshot(runs)
    with pytest.raises(NewerFormatError) as info:
        FileStore(runs).load("r")
    assert str(info.value) == (
        f"run r seq {seq} was written by format {newer}; this tether reads up to {j.FORMAT_VERSION}. "
        "Fix: upgrade tether"
    )
    resumed = run("resume", runs, "r", side, "basic")
    assert resumed.returncode == 3
    assert out(side)["error"] == "NewerFormatError" and out(side)["message"] == str(info.value)
    assert snapshot(runs) == before
