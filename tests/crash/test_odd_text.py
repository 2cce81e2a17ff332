"""A run whose tools meet a file name that is not UTF-8 (a lone surrogate from ``os.listdir``), killed with
SIGKILL, decided from another process and resumed in new ones (issue 13, item 2): every string is journaled
with U+FFFD in place of each lone surrogate, no call runs twice, and every process's State equals the load."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import orjson
import pytest
from _helpers import env_with, killed, kinds, ok, out

from tether import FileStore
from tether.testing import ExecutionLog

pytestmark = pytest.mark.crash

SCRIPT = str(Path(__file__).with_name("_odd_text_scenario.py"))
SHOWN = "caf\ufffd.txt"


def drive(mode: str, runs: Path, side: Path, folder: Path, **env: str) -> subprocess.CompletedProcess[bytes]:
    argv = [sys.executable, SCRIPT, mode, str(runs), "odd", str(side), str(folder)]
    return subprocess.run(argv, env=env_with(**env), capture_output=True, timeout=60, check=False)


def test_a_run_meeting_a_non_utf8_file_name_survives_a_kill_a_decision_from_another_process_and_resumes(
    tmp_path: Path,
) -> None:
    runs, side, folder = tmp_path / "runs", tmp_path / "side.jsonl", tmp_path / "files"
    folder.mkdir()
    with open(os.path.join(os.fsencode(folder), b"caf\xe9.txt"), "wb") as file:  # Latin-1, not UTF-8
        file.write(b"abc")

    first = drive("start", runs, side, folder, TETHER_FAILPOINT="after_append:tool_finished")
    assert killed(first), first.stderr.decode(errors="replace")[-2000:]
    state = FileStore(runs).load("odd")
    assert kinds(state)[-1] == "tool_finished" and state.status == "running"
    assert state.metadata == {"file": SHOWN} and state.messages[0].text == f"look at {SHOWN}"

    second = drive("resume", runs, side, folder)
    ok(second)
    assert out(side)["status"] == "waiting" and out(side)["same_as_load"]
    (pending,) = FileStore(runs).load("odd").pending_approvals

    # Another process decides, its reason and name typed in a terminal that is not UTF-8 (argv bytes).
    tether = str(Path(sys.executable).with_name("tether"))
    argv = [tether, "approve", "odd", pending.call_id, "--by", b"b\xf6b", "--reason", b"ok \xe9"]
    decided = subprocess.run(
        [*argv, "--store", f"file:{runs}"], env=env_with(), capture_output=True, timeout=60, check=False
    )
    assert decided.returncode == 0, decided.stderr.decode(errors="replace")[-2000:]

    third = drive("resume", runs, side, folder)
    ok(third)
    report = out(side)
    assert report["status"] == "completed" and report["answer"] == f"found {SHOWN}"
    assert report["same_as_load"], "the State the driver held equals what a load returns"

    final = FileStore(runs).load("odd")
    assert [{"role": m.role, "content": list(m.content)} for m in final.messages] == report["messages"]
    texts = [
        (e.outcome, "".join(b.get("text", "") for b in e.content))
        for e in final.history
        if e.kind == "tool_finished"
    ]
    assert texts == [
        ("done", SHOWN),
        ("done", orjson.dumps({"files": [SHOWN], SHOWN: {"size": 3}}).decode()),
        ("error", f"ValueError: cannot open {SHOWN}"),
        ("done", f"removed {SHOWN}"),
    ]
    (decision,) = [e for e in final.history if e.kind == "approval_decided"]
    assert (decision.by, decision.reason) == ("b\ufffdb", "ok \ufffd")
    starts = Counter(r["call_id"] for r in ExecutionLog(side).records() if r.get("event") == "start")
    assert set(starts.values()) == {1} and len(starts) == 4, f"each call ran once: {starts}"
