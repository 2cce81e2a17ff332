"""Asking ``agent.human`` about the calls that wait for approval, while this process drives (DESIGN 5.2).

The person is asked only after the reply and its ``approval_requested`` entries are durable. The inbox is
read meanwhile: a decision posted elsewhere first wins, is journaled, and the person is told.
"""

from __future__ import annotations

import asyncio

from .. import journal as j
from .._consume import close_denied
from ..humans import ApprovalQuestion, Human
from .inbox import InboxWatch
from .writer import Writer

__all__ = ["HumanStep"]


class HumanStep:
    """Asks one person about each pending approval of one driven run, once per call."""

    def __init__(self, human: Human, writer: Writer, inbox: InboxWatch, poll_interval: float) -> None:
        self.human = human
        self.writer = writer
        self.inbox = inbox
        self.poll_interval = poll_interval
        self._asked: set[str] = set()

    async def ask(self) -> None:
        """Ask about each pending approval not asked yet; answers are queued as ``approval_decided``.

        Denials are closed at once; the starts of approved calls join their decisions in the next append.
        """
        state = self.writer.journal.state
        for call in state.pending_approvals:
            if call.call_id in self._asked:
                continue
            self._asked.add(call.call_id)
            await self.writer.flush()
            record = state.call(call.call_id)
            assert record is not None
            question = ApprovalQuestion(
                state.id, call.call_id, call.tool, call.args, call.round, call.question
            )
            asking = asyncio.ensure_future(self.human.decide(question))
            try:
                while not asking.done():
                    await asyncio.wait({asking}, timeout=self.poll_interval)
                    if not asking.done() and await self.inbox.consume() and record.open_round != call.round:
                        asking.cancel()  # withdrawn: the person is told once it has stopped asking
                        await asyncio.wait({asking}, timeout=self.poll_interval)
                        break
            except BaseException:
                asking.cancel()
                raise
            if state.status == "cancelled":
                return
            if record.open_round != call.round:
                decision = record.decision
                if decision is not None:
                    verb = "approved" if decision.approved else "denied"
                    self.human.notify(
                        f"{call.call_id} was {verb} by {decision.by or 'someone'} from another process; "
                        "nothing to answer"
                    )
                continue
            answer = asking.result()
            self.writer.act()
            self.writer.add(
                j.ApprovalDecided,
                call_id=call.call_id,
                round=call.round,
                approved=answer.approved,
                by=answer.by,
                reason=answer.reason,
            )
            if not answer.approved:
                close_denied(self.writer.journal, call.call_id, call.round, answer.by, answer.reason)
