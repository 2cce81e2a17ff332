"""State: a run as the fold of its journal, and the changes a caller makes to it.

Loading is replay and nothing else. The fold (``_fold.py``, which State extends) keeps status, usage, turn,
messages, pending approvals and open calls incrementally, so no per-step cost grows with history, and a
load folds the same way in one pass. Changes made outside a driver
(``add_message``, ``approve``, ``deny``) become inbox items that ``store.save`` or a driver journals.
Writing is not the State's job: a ``tether.writing.JournalWriter`` makes new entries, folds each one into
the State, and appends them.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from . import journal as j
from ._calls import (
    ABORTED_UNKNOWN,
    CallRecord,
    DecisionRecord,
    OpenCall,
    PendingApproval,
    decision_body,
    edited_args,
)
from ._fold import Fold
from .errors import CorruptJournalError
from .journal import Status
from .messages import Message, MessagesView
from .output import typed_output

__all__ = ["ABORTED_UNKNOWN", "OpenCall", "PendingApproval", "State", "Status"]


class State(Fold):
    """A run: its id, journal (``history``) and everything folded from it.

    Make a new run with ``State(id=..., messages=[Message.user(...)])`` or let ``agent.run("...")`` do it;
    get an existing one with ``store.load(id)``.
    """

    def __init__(self, id: str | None = None, messages: Sequence[Message | str] | None = None) -> None:
        super().__init__(j.validate_run_id(id) if id is not None else j.new_run_id())
        self._typed_output: tuple[j.RunStopped, Any] | None = None
        self._output_spec: Any = None  # the driving agent's OutputSpec, which types the output (DESIGN 18)
        self._local: list[dict[str, Any]] = []  # changes not saved yet, as inbox items
        self._decided_children: set[tuple[str | None, str]] = set()
        self.store_identity: str | None = None
        for message in messages or ():
            self.messages.append(Message.user(message) if isinstance(message, str) else message)

    # ----------------------------------------------------------------------------------------------
    # Public read-only views

    @property
    def status(self) -> Status:
        """``running``, ``waiting``, ``completed``, ``failed``, ``cancelled`` or ``stopped`` (DESIGN 7)."""
        if self._stopped is not None:
            return self._stopped.status  # type: ignore[return-value]
        waiting = False
        for call in self._open.values():
            if call.open_round is not None or call.child_id is not None:
                waiting = True
            else:
                return "running"
        return "waiting" if waiting else "running"

    @property
    def answer(self) -> str | None:
        """The final answer's text, once the run completed."""
        return self._stopped.answer if self._stopped is not None else None

    @property
    def output(self) -> Any:
        """The typed output (with ``output_type``), else the answer."""
        if self._stopped is None:
            return None
        if self._stopped.output is None:
            return self._stopped.answer
        if self._typed_output is None or self._typed_output[0] is not self._stopped:
            value = typed_output(self._stopped.output_type, self._stopped.output, self._output_spec)
            self._typed_output = (self._stopped, value)
        return self._typed_output[1]

    def type_output_with(self, spec: Any) -> None:
        """Type ``output`` with ``spec`` (an ``OutputSpec``; the driver passes its agent's), whatever the
        journal names; None goes back to the journal's type, when its module is imported."""
        self._output_spec = spec
        self._typed_output = None

    @property
    def reason(self) -> str | None:
        """Why the run stopped, for ``failed``, ``stopped`` and ``cancelled`` runs."""
        return self._stopped.reason if self._stopped is not None else None

    @property
    def pending_approvals(self) -> list[PendingApproval]:
        """Calls waiting for a decision, oldest first (decisions made on this State not yet saved excluded)."""
        out = []
        for c in self._open.values():
            if c.open_round is not None and c.call_id not in self._decided_locally:
                out.append(
                    PendingApproval(c.call_id, c.tool, c.args, c.asked_at, self.id, c.open_round, c.question)
                )
            for p in c.child_pending or ():
                if (p.get("run_id"), p["call_id"]) not in self._decided_children:
                    out.append(
                        PendingApproval(
                            p["call_id"],
                            p.get("tool", ""),
                            p.get("args"),
                            p.get("asked_at", ""),
                            p.get("run_id") or c.child_id or "",
                            p.get("round", 0),
                            p.get("question"),
                        )
                    )
        return out

    @property
    def open_calls(self) -> list[OpenCall]:
        """Each call without a ``tool_finished``, with what a resume would do."""
        out = []
        for call in self._open.values():
            action, reason = call.plan()
            out.append(
                OpenCall(call.call_id, call.tool, call.args, action, call.attempt, call.effect, reason)
            )
        return out

    @property
    def context_messages(self) -> MessagesView:
        """The messages as the model sees them now (a view, not a copy): after a compaction, the first
        user message, the summary, and the messages since."""
        return MessagesView(self.messages, self._context_start, prefix=self._context_prefix)

    @property
    def context_tokens(self) -> int:
        """An estimate of the next request's input tokens: the last reply's count plus 4 chars a token since."""
        return self._last_tokens + self._chars_since // 4

    def call(self, call_id: str) -> CallRecord | None:
        """The fold's record of one call (internal use by the driver)."""
        return self._calls.get(call_id)

    def is_open(self, call_id: str) -> bool:
        """Whether the call has no ``tool_finished`` yet (internal use by the driver)."""
        return call_id in self._open

    def __repr__(self) -> str:
        return f"State(id={self.id!r}, status={self.status!r}, turn={self.turn}, entries={len(self.history)})"

    # ----------------------------------------------------------------------------------------------
    # Changes made outside a driver

    def add_message(self, message: Message | str) -> None:
        """Add a message; ``agent.run(state)`` continues the conversation with it.

        On a run already in a store the message becomes an inbox item that ``store.save`` or a driver
        journals (after the current tool results).
        """
        msg = Message.user(message) if isinstance(message, str) else message
        if not self.history:
            self.messages.append(msg)
            return
        self._local.append(self._item("message", {"role": msg.role, "content": list(msg.content)}))

    def approve(
        self,
        call_id: str,
        *,
        by: str | None = None,
        reason: str | None = None,
        run_id: str | None = None,
        args: dict[str, Any] | None = None,
    ) -> None:
        """Approve a pending call; ``store.save(state)`` or a driver journals the decision.

        ``args`` replaces the model's arguments: the tool runs with them and the model is told who changed
        them, from what, to what. The driver that consumes the decision validates them against the tool's
        schema (a State does not know the tool); invalid ones close the call ``input_error``.

        Raises:
            ValueError: no such pending call, a decided call, or ``args`` that is not a JSON object.
        """
        self._decide(call_id, True, by, reason, run_id, edited_args(args))

    def deny(
        self, call_id: str, *, by: str | None = None, reason: str | None = None, run_id: str | None = None
    ) -> None:
        """Deny a pending call; the model sees ``reason``."""
        self._decide(call_id, False, by, reason, run_id)

    def _decide(
        self,
        call_id: str,
        approved: bool,
        by: str | None,
        reason: str | None,
        run_id: str | None,
        args: dict[str, Any] | None = None,
    ) -> None:
        in_children = [p for p in self.pending_approvals if p.call_id == call_id and p.run_id != self.id]
        if run_id is None and in_children and call_id in self._calls:
            runs = ", ".join([self.id] + [p.run_id for p in in_children])
            raise ValueError(f"call id {call_id} occurs in runs {runs}. Fix: pass run_id= to say which")
        if run_id is None and len(in_children) > 1:
            runs = ", ".join(p.run_id for p in in_children)
            raise ValueError(f"call id {call_id} occurs in runs {runs}. Fix: pass run_id= to say which")
        if run_id is None and in_children:
            run_id = in_children[0].run_id
        if run_id is not None and run_id != self.id:
            child = [p for p in in_children if p.run_id == run_id]
            if not child:
                raise ValueError(
                    f"run {run_id} has no call {call_id} waiting for a decision in this tree. Fix: pick a call "
                    "id and run id from state.pending_approvals"
                )
            item = self._item("decision", decision_body(call_id, child[0].round, approved, by, reason, args))
            item["run_id"] = run_id  # posted to the child's inbox; its parent's driver journals it there
            self._local.append(item)
            self._decided_children.add((run_id, call_id))
            return
        call = self._calls.get(call_id)
        if call is None:
            raise ValueError(
                f"run {self.id} has no call {call_id}. Fix: pick a call id from state.pending_approvals"
            )
        earlier = self._decided_locally.get(call_id) or (
            call.decision if call.open_round is None and call.decision is not None else None
        )
        if earlier is not None:
            verb = "approved" if earlier.approved else "denied"
            raise ValueError(
                f"call {call_id} was already {verb} by {earlier.by or 'someone'} at {earlier.at}"
            )
        if call.open_round is None:
            raise ValueError(
                f"call {call_id} is not waiting for a decision. Fix: pick a call id from state.pending_approvals"
            )
        body = decision_body(call_id, call.open_round, approved, by, reason, args)
        self._local.append(self._item("decision", body))
        record = DecisionRecord(approved, call.open_round, by, reason, j.now_iso(), args)
        self._decided_locally[call_id] = record

    def _item(self, kind: str, body: dict[str, Any]) -> dict[str, Any]:
        return {"type": kind, "item_id": uuid.uuid4().hex, "seen_seq": len(self.history), **body}

    def take_local_changes(self) -> list[dict[str, Any]]:
        """The inbox items made on this State and not posted yet (the caller posts them)."""
        return list(self._local)

    def local_changes_posted(self) -> None:
        """Mark every local change as posted."""
        self._local.clear()
        self._decided_locally.clear()

    # ----------------------------------------------------------------------------------------------
    # The fold (its handlers are ``Fold``'s)

    @classmethod
    def replay(cls, run_id: str, entries: Sequence[j.Entry]) -> State:
        """The State of a journal: pure replay, nothing written (the fold of ``apply``, done in one pass).

        Raises:
            CorruptJournalError: the journal does not begin with ``run_started``, or an entry cannot follow.
        """
        if not entries or entries[0].kind != "run_started":
            raise CorruptJournalError(
                run_id,
                0,
                "the journal does not begin with run_started (it is empty, or its creation was cut off)",
            )
        state = cls(id=run_id)
        state._fold_all(entries)
        return state

    # ----------------------------------------------------------------------------------------------
    # What stores and drivers need

    def has_item(self, item_id: str) -> bool:
        """Whether an inbox item with this id was journaled."""
        return item_id in self._item_ids

    def info(self) -> dict[str, Any]:
        """The listing record stored with each append (stores never fold entries)."""
        return {
            "agent": self.agent,
            "status": self.status,
            "turn": self.turn,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "first_message": self.first_message,
            "parent_id": self.parent_id,
            "root_id": self.root_id or self.id,
            "inbox_consumed": self.inbox_consumed,
            **({"metadata": self.metadata} if self.metadata else {}),
        }

    def take_sealed(self, sealed: Sequence[j.Entry]) -> None:
        """Hold the sealed copies of the last entries folded (a writer sealed them for an append).

        The fold then keeps exactly the entries a later ``store.load`` returns. Each sealed entry must be
        the folded one with ``w``, ``h`` and ``b`` set (same seq, kind and fields).
        """
        if not sealed:
            return
        start = sealed[0].seq
        if start + len(sealed) != len(self.history):
            raise ValueError(
                f"run {self.id}: sealed seqs {start}..{start + len(sealed) - 1} are not the last entries folded "
                f"(0..{len(self.history) - 1}). Fix: seal the entries the writer added, in order"
            )
        self.history[start:] = sealed
        if self._stopped is not None and self._stopped.seq >= start:
            self._stopped = self.history[self._stopped.seq]  # type: ignore[assignment]
