"""People asked while a driver waits: TerminalHuman on a real terminal (a pty), and a decision that arrives
from another process while the terminal asks (issue 13, item 6)."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tether import FileStore

pytestmark = pytest.mark.slow

DRIVER = str(Path(__file__).with_name("_terminal_driver.py"))


class Terminal:
    """The master side of a pty: what the program printed (echoed input included), and typing into it."""

    def __init__(self, master: int) -> None:
        self.master = master
        self.screen = ""

    def wait_for(self, text: str, start: int = 0, timeout: float = 60) -> int:
        """Read until ``text`` appears at or after ``start``; returns where it begins."""
        deadline = time.monotonic() + timeout
        while (found := self.screen.find(text, start)) < 0:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"the terminal never showed {text!r}; it shows:\n{self.screen}")
            ready, _, _ = select.select([self.master], [], [], min(left, 0.5))
            if ready:
                try:
                    chunk = os.read(self.master, 4096)
                except OSError:  # the program ended and closed the terminal
                    chunk = b""
                if not chunk:
                    raise AssertionError(f"the terminal closed before showing {text!r}:\n{self.screen}")
                self.screen += chunk.decode(errors="replace").replace("\r\n", "\n")
        return found

    def type(self, text: str) -> None:
        os.write(self.master, text.encode())


def test_a_decision_from_another_process_withdraws_the_terminal_s_question(tmp_path: Path) -> None:
    runs, release, side = tmp_path / "runs", tmp_path / "release", tmp_path / "side.txt"
    master, slave = pty.openpty()
    driver = subprocess.Popen(
        [sys.executable, DRIVER, str(runs), str(release), str(side)],
        stdin=slave,
        stdout=slave,
        stderr=subprocess.PIPE,
    )
    os.close(slave)
    terminal = Terminal(master)
    try:
        asked = terminal.wait_for('c3_0 publish({"text": "first"})\nApprove? [y/N] ')
        state = FileStore(runs).load("tty")
        state.approve("c3_0", by="bob", reason="ship it")
        FileStore(runs).save(state)  # the driver holds the run: posted to its inbox

        withdrawn = terminal.wait_for(
            "\nc3_0 was approved by bob from another process; nothing to answer\n", asked
        )
        terminal.type("n\nstale reason\n")  # typed for the withdrawn question: never an answer
        release.touch()
        second = terminal.wait_for('publish({"text": "second"})\nApprove? [y/N] ', withdrawn)
        terminal.type("y\nsecond ok\n")
        terminal.wait_for("STATUS completed", second)
        assert driver.wait(timeout=60) == 0, driver.stderr.read().decode() if driver.stderr else ""
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
        os.close(master)

    between = terminal.screen[withdrawn:second]
    assert "Reason (optional)" not in between and "Approve?" not in between, terminal.screen
    final = FileStore(runs).load("tty")
    decided = [(e.call_id, e.approved, e.by, e.reason) for e in final.history if e.kind == "approval_decided"]
    second_call = decided[-1][0]
    assert decided == [("c3_0", True, "bob", "ship it"), (second_call, True, "alice", "second ok")]
    assert [e.kind for e in final.history].count("inbox_skipped") == 0
    assert side.read_text().splitlines() == ["first", "second"], "each call ran once"
    assert final.status == "completed"
