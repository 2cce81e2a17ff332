"""State: a run as the fold of its journal, and the changes a caller makes to it.

Loading is replay and nothing else. The fold keeps status, usage, turn, messages, pending approvals and
open calls incrementally, so no per-step cost grows with history. Changes made outside a driver
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
    edited_note,
)
from .errors import CorruptJournalError
from .journal import Status
from .messages import Message, MessagesView
from .output import typed_output

__all__ = ["ABORTED_UNKNOWN", "OpenCall", "PendingApproval", "State", "Status"]

_PROGRESS_KINDS = frozenset(
    {"model_replied", "tool_finished", "approval_decided", "run_released", "run_stopped"}
)
_KEEP_STOPPED = frozenset(
    {"inbox_skipped", "run_released", "run_resumed", "run_stopped", "cancel_requested", "compacted"}
)
_REQUEST_KINDS = frozenset({"model_replied", "model_failed", "compacted"})


class State:
    """A run: its id, journal (``history``) and everything folded from it.

    Make a new run with ``State(id=..., messages=[Message.user(...)])`` or let ``agent.run("...")`` do it;
    get an existing one with ``store.load(id)``.
    """

    def __init__(self, id: str | None = None, messages: Sequence[Message | str] | None = None) -> None:
        self.id: str = j.validate_run_id(id) if id is not None else j.new_run_id()
        self.history: list[j.Entry] = []
        self.messages: list[Message] = []
        self.agent: str | None = None
        self.fingerprint: dict[str, Any] | None = None
        self.budgets: dict[str, Any] = {}
        self.output_type: str | None = None  # the output type a run was started with (module:qualname)
        self.parent_id: str | None = None
        self.root_id: str | None = None
        self.parent_call_id: str | None = None
        self.metadata: dict[str, str] = {}  # run_started's metadata (DESIGN 18)
        self.turn = 0
        self.usage: dict[str, int] = {}
        self.requests = 0  # model_replied + model_failed + compacted: the next request's index
        self.inbox_consumed = -1
        self.resumes_since_progress = 0
        self.subagent_calls = 0  # entries into subagent calls: a run without any has no child runs
        self.failures_since_reply = 0
        self.created_at: str | None = None
        self.updated_at: str | None = None
        self.first_message: str | None = None
        self._stopped: j.RunStopped | None = None
        self._context_start = 0  # after a compaction, the first message the model still sees
        self._context_prefix: tuple[Message, ...] = ()
        self._last_tokens = 0  # the provider's count of the last request's input and output
        self._chars_since = 0  # characters added since that reply
        self._typed_output: tuple[j.RunStopped, Any] | None = None
        self._output_spec: Any = None  # the driving agent's OutputSpec, which types the output (DESIGN 18)
        self.stopped_seq = -1
        """The seq of the ``run_stopped`` in force, or -1 (a later entry that reopens the run resets it)."""
        self.format_version = j.FORMAT_VERSION
        """The journal's format (its ``run_started.version``); a writer marks newer entries with ``v``."""
        self._calls: dict[str, CallRecord] = {}
        self._open: dict[str, CallRecord] = {}  # calls without tool_finished, in call order
        self._reply_calls: list[str] = []  # the calls of the last reply, for ordering results
        self._results: dict[str, dict[str, Any]] = {}
        self._held: list[Message] = []  # messages added while calls were open
        self._item_ids: set[str] = set()
        self._local: list[dict[str, Any]] = []  # changes not saved yet, as inbox items
        self._decided_locally: dict[str, DecisionRecord] = {}
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
    # The fold

    @classmethod
    def replay(cls, run_id: str, entries: Sequence[j.Entry]) -> State:
        """The State of a journal: pure replay, nothing written.

        Raises:
            CorruptJournalError: the journal does not begin with ``run_started``.
        """
        if not entries or entries[0].kind != "run_started":
            raise CorruptJournalError(
                run_id,
                0,
                "the journal does not begin with run_started (it is empty, or its creation was cut off)",
            )
        state = cls(id=run_id)
        for entry in entries:
            state.apply(entry)
        return state

    def apply(self, entry: j.Entry) -> None:
        """Fold one entry (its seq must be the next one)."""
        if entry.seq != len(self.history):
            raise CorruptJournalError(self.id, entry.seq, f"expected seq {len(self.history)} here")
        kind = entry.kind
        handler = _HANDLERS.get(kind)
        if handler is not None:
            handler(self, entry)
        self.history.append(entry)
        if (
            self._stopped is not None
            and kind not in _KEEP_STOPPED
            and not (kind == "model_failed" and getattr(entry, "purpose", None) == "compaction")
        ):
            self._stopped = None
            self.stopped_seq = -1
        if kind in _REQUEST_KINDS:
            self.requests += 1
        if kind == "run_resumed":
            self.resumes_since_progress += 1
        elif kind in _PROGRESS_KINDS:
            self.resumes_since_progress = 0
        if self.created_at is None:
            self.created_at = entry.at
        self.updated_at = entry.at

    def _fail(self, entry: j.Entry, problem: str) -> None:
        raise CorruptJournalError(self.id, entry.seq, problem)

    def _on_run_started(self, e: j.RunStarted) -> None:
        if self.history:
            self._fail(e, "a second run_started")
        self.agent = e.agent
        self.fingerprint = e.fingerprint
        self.budgets = dict(e.budgets or {})
        self.output_type = e.output_type
        self.parent_id = e.parent_id
        self.root_id = e.root_id or self.id
        self.parent_call_id = e.parent_call_id
        self.metadata = dict(e.metadata or {})
        self.format_version = e.version
        self.messages = []

    def _count(self, blocks: Sequence[dict[str, Any]]) -> None:
        for block in blocks:
            self._chars_since += len(block.get("text", "")) + len(str(block.get("content", ""))) // 2

    def _on_compacted(self, e: j.Compacted) -> None:
        if self._open:
            self._fail(e, "a compaction while calls have no result")
        first = next((m for m in self.messages if m.role == "user"), None)
        summary = Message.user(f"Summary of the conversation so far:\n{e.summary}")
        self._context_prefix = (first, summary) if first is not None else (summary,)
        self._context_start = len(self.messages)
        self._add_usage(e.usage)
        self._last_tokens = len(e.summary) // 4
        self._chars_since = 0

    def _add_usage(self, usage: dict[str, int] | None) -> None:
        for name, value in (usage or {}).items():
            if isinstance(value, int):
                self.usage[name] = self.usage.get(name, 0) + value

    def _add_message(self, msg: Message) -> None:
        self._count(msg.content)
        if self._open:
            self._held.append(msg)
        else:
            self.messages.append(msg)
        if self.first_message is None and msg.role == "user":
            self.first_message = msg.text[:200]

    def _on_message(self, e: j.MessageAdded) -> None:
        self._note_inbox(e.inbox_seq, e.item_id)
        self._add_message(Message(e.role, tuple(e.content)))  # type: ignore[arg-type]

    def _on_model_replied(self, e: j.ModelReplied) -> None:
        if self._open:
            self._fail(e, f"a model reply while calls {sorted(self._open)} have no result")
        self.turn += 1
        self.failures_since_reply = 0
        self._add_usage(e.usage)
        usage = e.usage or {}
        self._last_tokens = sum(
            usage.get(name, 0)
            for name in (
                "input_tokens",
                "output_tokens",
                "cache_read_input_tokens",
                "cache_creation_input_tokens",
            )
        )
        self._chars_since = 0
        self.messages.append(Message("assistant", tuple(e.content)))
        self._reply_calls = []
        self._results = {}
        for block in e.content:
            if block.get("type") != "tool_call":
                continue
            cid = block["id"]
            if cid in self._calls:
                self._fail(e, f"call id {cid} used twice")
            call = CallRecord(
                cid,
                block.get("name", ""),
                block.get("args"),
                block.get("provider_call_id"),
                len(self._reply_calls),
            )
            self._calls[cid] = call
            self._open[cid] = call
            self._reply_calls.append(cid)

    def _on_model_failed(self, e: j.ModelFailed) -> None:
        self.failures_since_reply += 1

    def _open_call(self, e: j.Entry, call_id: str) -> CallRecord:
        call = self._open.get(call_id)
        if call is None:
            what = "a closed" if call_id in self._calls else "an unknown"
            self._fail(e, f"a {e.kind} for {what} call {call_id}")
            raise AssertionError  # unreachable: _fail raises
        return call

    def _on_approval_requested(self, e: j.ApprovalRequested) -> None:
        call = self._open_call(e, e.call_id)
        if call.open_round is not None or e.round <= call.last_round:
            self._fail(e, f"approval round {e.round} of call {e.call_id} cannot follow")
        call.open_round = e.round
        call.last_round = e.round
        call.asked_at = e.at
        call.question = e.question

    def _on_approval_decided(self, e: j.ApprovalDecided) -> None:
        call = self._open_call(e, e.call_id)
        if call.open_round != e.round:
            self._fail(e, f"a decision for call {e.call_id} round {e.round}, which is not open")
        self._note_inbox(e.inbox_seq, None)
        call.open_round = None
        call.decision = DecisionRecord(e.approved, e.round, e.by, e.reason, e.at, e.args)
        call.started_after_decision = False
        self._decided_locally.pop(e.call_id, None)

    def _on_tool_started(self, e: j.ToolStarted) -> None:
        call = self._open_call(e, e.call_id)
        if call.open_round is not None:
            self._fail(e, f"call {e.call_id} started while its approval is pending")
        call.attempt = e.attempt
        call.effect = e.effect
        call.key = e.idempotency_key
        call.max_attempts = e.max_attempts
        call.started_after_decision = True
        if e.effect == "resumable":
            self.subagent_calls += 1
        call.child_id = None  # a re-entered subagent call runs again
        call.child_pending = None

    def _on_tool_finished(self, e: j.ToolFinished) -> None:
        call = self._open_call(e, e.call_id)
        call.outcome = e.outcome
        call.open_round = None
        del self._open[e.call_id]
        self._add_usage(e.usage)
        self._count(e.content)
        note = edited_note(call)  # a person changed the arguments: the model is told with the result
        self._results[e.call_id] = {
            "type": "tool_result",
            "call_id": e.call_id,
            "name": call.tool,
            "provider_call_id": call.provider_call_id,
            "outcome": e.outcome,
            "content": e.content if note is None else [note, *e.content],
        }
        if not self._open:
            results = [self._results[cid] for cid in self._reply_calls if cid in self._results]
            self.messages.append(Message("tool", tuple(results)))
            self._results = {}
            held, self._held = self._held, []
            self.messages.extend(held)

    def _on_child_waiting(self, e: j.ChildWaiting) -> None:
        call = self._open_call(e, e.call_id)
        call.child_id = e.child_id
        call.child_pending = list(e.pending)

    def _on_cancel_requested(self, e: j.CancelRequested) -> None:
        self._note_inbox(e.inbox_seq, None)

    def _on_inbox_skipped(self, e: j.InboxSkipped) -> None:
        self._note_inbox(e.inbox_seq, e.item_id)

    def _on_budgets_changed(self, e: j.BudgetsChanged) -> None:
        self.budgets = dict(e.new or {})

    def _on_agent_changed(self, e: j.AgentChanged) -> None:
        self.fingerprint = e.new

    def _on_run_stopped(self, e: j.RunStopped) -> None:
        self._stopped = e
        self.stopped_seq = e.seq

    def _note_inbox(self, inbox_seq: int | None, item_id: str | None) -> None:
        if inbox_seq is not None:
            self.inbox_consumed = max(self.inbox_consumed, inbox_seq)
        if item_id is not None:
            self._item_ids.add(item_id)

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


_HANDLERS: dict[str, Any] = {
    "run_started": State._on_run_started,
    "message": State._on_message,
    "model_replied": State._on_model_replied,
    "model_failed": State._on_model_failed,
    "approval_requested": State._on_approval_requested,
    "approval_decided": State._on_approval_decided,
    "tool_started": State._on_tool_started,
    "tool_finished": State._on_tool_finished,
    "child_waiting": State._on_child_waiting,
    "compacted": State._on_compacted,
    "cancel_requested": State._on_cancel_requested,
    "inbox_skipped": State._on_inbox_skipped,
    "budgets_changed": State._on_budgets_changed,
    "agent_changed": State._on_agent_changed,
    "run_stopped": State._on_run_stopped,
}
