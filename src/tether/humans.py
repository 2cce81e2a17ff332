"""People who decide approvals while a driver waits (``Agent(human=...)``, DESIGN 5.2 and 9).

A human's answers are journaled exactly like decisions posted from elsewhere (``approval_decided`` with
who, when and why). While a person is being asked, the driver keeps reading the run's inbox: a decision
posted from another process first wins, and the person is told who decided.
"""

from __future__ import annotations

import getpass
import json
import os
import select
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TextIO, runtime_checkable

from ._threads import Threads

__all__ = ["ApprovalQuestion", "Human", "HumanDecision", "ScriptedHuman", "TerminalHuman"]


@dataclass(frozen=True, slots=True)
class ApprovalQuestion:
    """What a person is asked: may this call run?

    ``round`` is 0 for a rule or ``approval=True``; 1, 2, ... when a cut-off ``unsafe`` call may be run
    again (``Agent(on_unknown="ask")``), where ``question`` says so.
    """

    run_id: str
    call_id: str
    tool: str
    args: Any
    round: int = 0
    question: str | None = None


@dataclass(frozen=True, slots=True)
class HumanDecision:
    """A person's answer: approved or not, by whom, and why (the model sees the reason of a denial)."""

    approved: bool
    by: str | None = None
    reason: str | None = None


@runtime_checkable
class Human(Protocol):
    """Someone the driver can ask."""

    async def decide(self, question: ApprovalQuestion) -> HumanDecision:
        """Answer ``question``; may take as long as it needs (the driver watches the inbox meanwhile).

        When a decision arrives from elsewhere first, the driver cancels this call (the question is
        withdrawn: stop asking, and take nothing typed since as an answer), then calls ``notify``.
        """
        ...

    def notify(self, text: str) -> None:
        """Tell the person something (that a question was withdrawn: another person decided first)."""
        ...


class TerminalHuman:
    """Asks on the terminal: ``y`` approves, anything else denies; an optional reason follows.

    When a decision arrives from elsewhere while it asks, the question is withdrawn: nothing more is
    asked, and the person is told who decided. On a terminal, what is typed for a withdrawn question is
    never taken as an answer: keys typed before a question is shown are discarded, so a keystroke meant
    for an earlier prompt never answers this one. Piped answers are read in order (a line read while its
    question was withdrawn is dropped).

    Args:
        by: the name journaled with each decision (default: the login name).
        stdin, stdout: where to read and write (default: the process's).
    """

    def __init__(
        self, by: str | None = None, *, stdin: TextIO | None = None, stdout: TextIO | None = None
    ) -> None:
        self.by = by or getpass.getuser()
        self.stdin = stdin or sys.stdin
        self.stdout = stdout or sys.stdout
        self._lock = threading.Lock()  # one writer at a time: the asking thread, or a withdrawal
        self._mid_line = False  # a prompt is shown and its line not ended

    async def decide(self, question: ApprovalQuestion) -> HumanDecision:
        from asyncio import CancelledError  # here, not at the top: ``import tether`` loads no asyncio

        withdrawn = threading.Event()
        try:
            decision = await _THREADS.run(self._ask, question, withdrawn)
        except CancelledError:  # decided elsewhere: the asking thread stops asking
            with self._lock:
                withdrawn.set()
            raise
        assert decision is not None  # None only once withdrawn, and then no one awaits it
        return decision

    def _ask(self, question: ApprovalQuestion, withdrawn: threading.Event) -> HumanDecision | None:
        args = json.dumps(question.args, ensure_ascii=False, default=str)
        header = question.question or f"run {question.run_id} wants to call {question.tool}"
        _discard_typed_ahead(self.stdin)
        if not self._prompt(
            f"{header}\n  {question.call_id} {question.tool}({args})\nApprove? [y/N] ", withdrawn
        ):
            return None
        answer = self._readline(withdrawn)
        if answer is None or not self._prompt("Reason (optional): ", withdrawn):
            return None
        reason = self._readline(withdrawn)
        if reason is None:
            return None
        return HumanDecision(answer.strip().lower() in ("y", "yes"), self.by, reason.strip() or None)

    def _prompt(self, text: str, withdrawn: threading.Event) -> bool:
        """Show a prompt, unless the question was withdrawn (then False)."""
        with self._lock:
            if withdrawn.is_set():
                return False
            self.stdout.write(text)
            self.stdout.flush()
            self._mid_line = True
            return True

    def _readline(self, withdrawn: threading.Event) -> str | None:
        """The next line typed, or None once the question is withdrawn (what was typed for it is dropped).

        A terminal is polled, so a withdrawn question stops reading at once; other streams are read as
        they come (a pipe's answers are in order, and a line read for a withdrawn question is dropped).
        """
        fd = _terminal_fd(self.stdin)
        while fd is not None and not withdrawn.is_set():
            if select.select([fd], [], [], _POLL_SECONDS)[0]:
                break
        if withdrawn.is_set():
            return None
        line = self.stdin.readline()  # a terminal in canonical mode gives one line per read: none is kept
        with self._lock:
            self._mid_line = False
            return None if withdrawn.is_set() else line

    def notify(self, text: str) -> None:
        with self._lock:
            if self._mid_line:  # the prompt's line was never ended: the message goes on a line of its own
                self.stdout.write("\n")
                self._mid_line = False
            self.stdout.write(text + "\n")
            self.stdout.flush()


_THREADS = Threads("tether-human")
_POLL_SECONDS = 0.05


def _terminal_fd(stream: TextIO) -> int | None:
    """The file descriptor of ``stream`` when it is a terminal, else None."""
    try:
        fd = stream.fileno()
        return fd if os.isatty(fd) else None
    except (AttributeError, OSError, ValueError):
        return None


def _discard_typed_ahead(stream: TextIO) -> None:
    """Drop what was typed on the terminal before the question was shown; nothing for other streams."""
    fd = _terminal_fd(stream)
    if fd is None:
        return
    import termios  # POSIX only, as terminals are

    try:
        termios.tcflush(fd, termios.TCIFLUSH)
    except (termios.error, OSError):
        pass


Answer = bool | HumanDecision | Callable[[ApprovalQuestion], bool | HumanDecision]


class ScriptedHuman:
    """Answers from a script, for tests: by call id or tool name, else from a list in order.

    Args:
        answers: a mapping from call id or tool name to an answer, or a sequence of answers used in turn.
            An answer is a bool, a HumanDecision, or a callable taking the question.
        by: the name journaled with bool answers.
        delay: seconds to wait before answering (to let a decision from elsewhere arrive first).
    """

    def __init__(
        self, answers: Mapping[str, Answer] | Sequence[Answer], *, by: str = "scripted", delay: float = 0.0
    ) -> None:
        self.answers = answers
        self.by = by
        self.delay = delay
        self.questions: list[ApprovalQuestion] = []
        self.notes: list[str] = []

    async def decide(self, question: ApprovalQuestion) -> HumanDecision:
        self.questions.append(question)
        if self.delay:
            from asyncio import sleep

            await sleep(self.delay)
        if isinstance(self.answers, Mapping):
            answer = self.answers.get(question.call_id, self.answers.get(question.tool))
            if answer is None:
                raise AssertionError(f"ScriptedHuman has no answer for {question.call_id} ({question.tool})")
        else:
            index = len(self.questions) - 1
            if index >= len(self.answers):
                raise AssertionError(
                    f"ScriptedHuman has {len(self.answers)} answers; question {index + 1} asked"
                )
            answer = self.answers[index]
        if callable(answer) and not isinstance(answer, HumanDecision):
            answer = answer(question)
        if isinstance(answer, HumanDecision):
            return answer
        return HumanDecision(bool(answer), self.by, None if answer else "denied by script")

    def notify(self, text: str) -> None:
        self.notes.append(text)
