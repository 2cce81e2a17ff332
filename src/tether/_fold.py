"""The fold: how each journal entry changes a run's State (``state.py`` holds the views and the changes).

One handler a kind, shared by the live fold (``apply``: an entry at a time, as a writer adds them) and a
load (``_fold_all``: a whole journal, the per-entry bookkeeping only a live fold needs done once), so a
loaded State is the State its live drive folded (``tests/test_replay.py`` compares them field by field).
The fold keeps status, usage, turn, messages, pending approvals and open calls incrementally, so no
per-step cost grows with history.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from . import journal as j
from ._calls import CallRecord, DecisionRecord, edited_note
from .errors import CorruptJournalError
from .messages import Message

__all__ = ["Fold"]

_KEEP_STOPPED = frozenset(
    {"inbox_skipped", "run_released", "run_resumed", "run_stopped", "cancel_requested", "compacted"}
)
_new = object.__new__
_set_role = Message.__dict__["role"].__set__
_set_content = Message.__dict__["content"].__set__


def _message(role: str, content: tuple[dict[str, Any], ...]) -> Message:
    """``Message(role, content)`` made by setting its two slots (the fold makes two a turn, a load 20,000)."""
    msg: Message = _new(Message)
    _set_role(msg, role)
    _set_content(msg, content)
    return msg


class Fold:
    """A run's folded facts, and the fold of each entry kind (``State`` adds the views and the changes)."""

    def __init__(self, id: str) -> None:
        self.id = id
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
        self.resumes_since_progress = 0  # run_resumed entries since progress (a reply, a result, a stop)
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
        self._decided_locally: dict[str, DecisionRecord] = {}  # decisions made on the State, not saved

    def _fold_all(self, entries: Sequence[j.Entry]) -> None:
        """Fold a whole journal into this new (empty) fold, as ``apply`` on each entry would.

        The handlers are ``apply``'s; what only a live fold needs an entry at a time is done once: the
        history is taken whole, and the times from its two ends.

        Raises:
            CorruptJournalError: an entry is out of place or cannot follow.
        """
        handlers = _HANDLERS
        for expected, entry in enumerate(entries):
            if entry.seq != expected:
                raise CorruptJournalError(self.id, entry.seq, f"expected seq {expected} here")
            handler = handlers.get(entry.kind)
            if handler is not None:
                handler(self, entry)
            if self._stopped is not None:
                self._reopen(entry)
        self.history = list(entries)
        if entries:
            self.created_at = entries[0].at
            self.updated_at = entries[-1].at

    def apply(self, entry: j.Entry) -> None:
        """Fold one entry (its seq must be the next one)."""
        history = self.history
        if entry.seq != len(history):
            raise CorruptJournalError(self.id, entry.seq, f"expected seq {len(history)} here")
        handler = _HANDLERS.get(entry.kind)
        if handler is not None:
            handler(self, entry)
        history.append(entry)
        if self._stopped is not None:
            self._reopen(entry)
        if self.created_at is None:
            self.created_at = entry.at
        self.updated_at = entry.at

    def _reopen(self, entry: j.Entry) -> None:
        """A stopped run is running again after any entry but those that leave it stopped."""
        kind = entry.kind
        if kind not in _KEEP_STOPPED and not (
            kind == "model_failed" and getattr(entry, "purpose", None) == "compaction"
        ):
            self._stopped = None
            self.stopped_seq = -1

    def _fail(self, entry: j.Entry, problem: str) -> None:
        raise CorruptJournalError(self.id, entry.seq, problem)

    def _on_run_started(self, e: j.RunStarted) -> None:
        if e.seq:  # the fold checked it is the next seq: there are entries before it
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

    def _on_run_resumed(self, e: j.RunResumed) -> None:
        self.resumes_since_progress += 1

    def _on_run_released(self, e: j.RunReleased) -> None:
        self.resumes_since_progress = 0  # progress: a driver stopped cleanly

    def _count(self, blocks: Sequence[dict[str, Any]]) -> None:
        chars = self._chars_since
        for block in blocks:
            chars += len(block.get("text", ""))
            if "content" in block:
                chars += len(str(block["content"])) // 2
        self._chars_since = chars

    def _on_compacted(self, e: j.Compacted) -> None:
        if self._open:
            self._fail(e, "a compaction while calls have no result")
        self.requests += 1
        first = next((m for m in self.messages if m.role == "user"), None)
        summary = Message.user(f"Summary of the conversation so far:\n{e.summary}")
        self._context_prefix = (first, summary) if first is not None else (summary,)
        self._context_start = len(self.messages)
        self._add_usage(e.usage)
        self._last_tokens = len(e.summary) // 4
        self._chars_since = 0

    def _add_usage(self, usage: dict[str, int] | None) -> None:
        if not usage:
            return
        totals = self.usage
        for name, value in usage.items():
            if isinstance(value, int):
                totals[name] = totals.get(name, 0) + value

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
        self._add_message(_message(e.role, tuple(e.content)))

    def _on_model_replied(self, e: j.ModelReplied) -> None:
        if self._open:
            self._fail(e, f"a model reply while calls {sorted(self._open)} have no result")
        self.turn += 1
        self.requests += 1
        self.resumes_since_progress = 0
        self.failures_since_reply = 0
        usage = e.usage
        if usage:
            self._add_usage(usage)
            get = usage.get
            self._last_tokens = (
                0
                + get("input_tokens", 0)
                + get("output_tokens", 0)
                + get("cache_read_input_tokens", 0)
                + get("cache_creation_input_tokens", 0)
            )
        else:
            self._last_tokens = 0
        self._chars_since = 0
        content = e.content
        self.messages.append(_message("assistant", tuple(content)))
        reply_calls: list[str] = []
        self._reply_calls = reply_calls
        self._results = {}
        calls, opened = self._calls, self._open
        for block in content:
            if block.get("type") != "tool_call":
                continue
            cid = block["id"]
            if cid in calls:
                self._fail(e, f"call id {cid} used twice")
            call = CallRecord(
                cid, block.get("name", ""), block.get("args"), block.get("provider_call_id"), len(reply_calls)
            )
            calls[cid] = call
            opened[cid] = call
            reply_calls.append(cid)

    def _on_model_failed(self, e: j.ModelFailed) -> None:
        self.requests += 1
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
        self.resumes_since_progress = 0
        call.open_round = None
        call.decision = DecisionRecord(e.approved, e.round, e.by, e.reason, e.at, e.args)
        call.started_after_decision = False
        self._decided_locally.pop(e.call_id, None)

    def _on_tool_started(self, e: j.ToolStarted) -> None:
        call = self._open.get(e.call_id) or self._open_call(e, e.call_id)
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
        cid = e.call_id
        opened = self._open
        call = opened.pop(cid, None) or self._open_call(e, cid)
        call.outcome = outcome = e.outcome
        call.open_round = None
        self.resumes_since_progress = 0
        self._add_usage(e.usage)
        content = e.content
        self._count(content)
        # a person changed the arguments: the model is told with the result
        note = edited_note(call) if call.decision is not None else None
        result = {
            "type": "tool_result",
            "call_id": cid,
            "name": call.tool,
            "provider_call_id": call.provider_call_id,
            "outcome": outcome,
            "content": content if note is None else [note, *content],
        }
        if opened:
            self._results[cid] = result
            return
        reply_calls, results = self._reply_calls, self._results
        if not results and len(reply_calls) == 1 and reply_calls[0] == cid:  # the usual one-call reply
            self.messages.append(_message("tool", (result,)))
        else:
            results[cid] = result
            self.messages.append(_message("tool", tuple([results[c] for c in reply_calls if c in results])))
            self._results = {}
        if self._held:
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
        self.resumes_since_progress = 0
        self._stopped = e
        self.stopped_seq = e.seq

    def _note_inbox(self, inbox_seq: int | None, item_id: str | None) -> None:
        if inbox_seq is not None:
            self.inbox_consumed = max(self.inbox_consumed, inbox_seq)
        if item_id is not None:
            self._item_ids.add(item_id)


_HANDLERS: dict[str, Any] = {
    "run_started": Fold._on_run_started,
    "run_resumed": Fold._on_run_resumed,
    "run_released": Fold._on_run_released,
    "message": Fold._on_message,
    "model_replied": Fold._on_model_replied,
    "model_failed": Fold._on_model_failed,
    "approval_requested": Fold._on_approval_requested,
    "approval_decided": Fold._on_approval_decided,
    "tool_started": Fold._on_tool_started,
    "tool_finished": Fold._on_tool_finished,
    "child_waiting": Fold._on_child_waiting,
    "compacted": Fold._on_compacted,
    "cancel_requested": Fold._on_cancel_requested,
    "inbox_skipped": Fold._on_inbox_skipped,
    "budgets_changed": Fold._on_budgets_changed,
    "agent_changed": Fold._on_agent_changed,
    "run_stopped": Fold._on_run_stopped,
}
