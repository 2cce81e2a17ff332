"""People who decide approvals while a driver waits (``Agent(human=...)``, DESIGN 5.2 and 9).

A human's answers are journaled exactly like decisions posted from elsewhere (``approval_decided`` with
who, when and why). While a person is being asked, the driver keeps reading the run's inbox: a decision
posted from another process first wins, and the person is told who decided.
"""

from __future__ import annotations

import asyncio
import getpass
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TextIO, runtime_checkable

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
        """Answer ``question``; may take as long as it needs (the driver watches the inbox meanwhile)."""
        ...

    def notify(self, text: str) -> None:
        """Tell the person something (that another person decided first)."""
        ...


class TerminalHuman:
    """Asks on the terminal: ``y`` approves, anything else denies; an optional reason follows.

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

    async def decide(self, question: ApprovalQuestion) -> HumanDecision:
        return await asyncio.to_thread(self._ask, question)

    def _ask(self, question: ApprovalQuestion) -> HumanDecision:
        args = json.dumps(question.args, ensure_ascii=False, default=str)
        header = question.question or f"run {question.run_id} wants to call {question.tool}"
        self.stdout.write(f"{header}\n  {question.call_id} {question.tool}({args})\nApprove? [y/N] ")
        self.stdout.flush()
        answer = self.stdin.readline().strip().lower()
        approved = answer in ("y", "yes")
        self.stdout.write("Reason (optional): ")
        self.stdout.flush()
        reason = self.stdin.readline().strip() or None
        return HumanDecision(approved, self.by, reason)

    def notify(self, text: str) -> None:
        self.stdout.write(text + "\n")
        self.stdout.flush()


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
            await asyncio.sleep(self.delay)
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
