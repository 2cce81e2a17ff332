"""Taking a run to drive it: a new run (created held), a State loaded earlier, an id, a claimed lease.

Every way in ends with the run held by this process and a ``JournalWriter`` whose State holds every durable
entry, stamped with the lease owner's writer id (DURABILITY 1.1, 3). A take that fails gives the lease back.
"""

from __future__ import annotations

import asyncio

from .. import journal as j
from .._encodable import clean
from ..errors import ConflictError, RunBusyError, RunNotFoundError
from ..messages import Message, text_of
from ..output import OutputSpec
from ..state import State
from ..stores.base import Lease, Owner, Store
from ..stores.operations import append_missing
from ..writing import JournalWriter
from .agent_spec import DrivenAgent
from .otel_trace import new_run_traceparent

__all__ = [
    "check_run",
    "new_run",
    "take_existing",
    "take_held",
    "take_new",
    "take_or_resume",
    "take_state",
]


def new_run(
    agent: DrivenAgent,
    prompt: str | Message | State,
    run_id: str | None,
    output: OutputSpec | None,
    writer_id: str | None = None,
    metadata: dict[str, str] | None = None,
    *,
    drive: bool = False,
) -> JournalWriter:
    """A new run's first entries (``run_started``, with its metadata, and its messages), not written yet.

    ``drive``: this process drives the run next (its first drive's span may be the trace's root).
    """
    output = output or agent.output
    if isinstance(prompt, State):
        messages, run_id = list(prompt.messages), prompt.id
    else:
        messages = [Message.user(prompt) if isinstance(prompt, str) else prompt]
    writer = JournalWriter(State(id=run_id), writer_id)
    writer.add(
        j.RunStarted,
        output_type=output.type_path if output is not None else None,
        agent=agent.name,
        fingerprint=agent.fingerprint(),
        budgets=agent.budgets(),
        root_id=writer.state.id,
        traceparent=new_run_traceparent(agent, drive),
        metadata=dict(metadata or {}),
    )
    for message in messages:
        writer.add(j.MessageAdded, role=message.role, content=list(message.content))
    return writer


async def take_new(
    agent: DrivenAgent,
    store: Store,
    prompt: str | Message | State,
    run_id: str | None,
    output: OutputSpec | None,
    metadata: dict[str, str] | None = None,
) -> tuple[JournalWriter, Lease]:
    """Create a run held by this process (a State with no history becomes that run).

    Raises:
        ValueError: the id exists (before any model request), or the State belongs to another store.
    """
    if isinstance(prompt, State):
        store.check_state(prompt)
    owner = Owner.here()
    writer = new_run(agent, prompt, run_id, output, owner.writer, metadata, drive=True)
    state = writer.state
    batch = writer.next_batch()
    lease = await store.acreate(state.id, batch, state.info(), owner=owner, ttl=agent.lease_ttl_for(store))
    assert lease is not None
    writer.batch_saved()
    state.store_identity = store.identity
    if isinstance(prompt, State):  # the caller's State object is the run from now on
        prompt.__dict__.update(state.__dict__)
        writer.state = prompt
    return writer, lease


async def take_state(agent: DrivenAgent, store: Store, state: State) -> tuple[JournalWriter, Lease]:
    """Drive a State loaded earlier: post its changes, take the run, refuse it if stale (DURABILITY 1.4).

    Raises:
        ValueError: the State belongs to another store or agent, or is a subagent's run.
        RunBusyError: another process drives the run.
        ConflictError: the journal holds entries this State has not seen (other than its own posts).
    """
    store.check_state(state)
    check_run(agent, state)
    posted: set[int] = set()
    for item in state.take_local_changes():
        if item.get("run_id") not in (None, state.id):  # a subagent's call: its own inbox
            body = {k: v for k, v in item.items() if k != "run_id"}
            await store.apost(item["run_id"], body, item_id=item["item_id"])
            continue
        seq = await store.apost(state.id, {**item, "run_h": state.history[0].h}, item_id=item["item_id"])
        posted.add(seq)
    state.local_changes_posted()
    owner = Owner.here()
    lease = await store.aclaim(state.id, owner, agent.lease_ttl_for(store))
    try:
        await store.aoperate(append_missing, state, lease)  # what a failed drive kept in memory
        fresh = await store.aread(state.id, len(state.history) - 1)
        foreign = _foreign_entries(fresh, posted)
        if foreign:
            raise ConflictError(
                f"run {state.id} has {len(foreign)} entries this State has not seen. Fix: store.load(id) again",
                run_id=state.id,
                seq=foreign[0].seq,
            )
        for entry in fresh:
            state.apply(entry)
    except BaseException:
        await store.aabandon(lease)
        raise
    return JournalWriter(state, owner.writer), lease


async def take_existing(agent: DrivenAgent, store: Store, run_id: str) -> tuple[JournalWriter, Lease]:
    """Take the run ``run_id`` and load it.

    Raises:
        ValueError: a run of another agent, or a subagent's run.
        RunBusyError: a live process drives the run.
        RunNotFoundError: no such run.
    """
    j.validate_run_id(run_id)
    owner = Owner.here()
    lease = await store.aclaim(run_id, owner, agent.lease_ttl_for(store))
    return await take_held(agent, store, lease), lease


async def take_held(agent: DrivenAgent, store: Store, lease: Lease) -> JournalWriter:
    """Load a run this process already holds (a Worker's ``claim_next``); the lease is given back on error.

    Raises:
        ValueError: a run of another agent, or a subagent's run.
    """
    try:
        state = await store.aload(lease.run_id)
        check_run(agent, state)
    except BaseException:
        await store.aabandon(lease)
        raise
    return JournalWriter(state, lease.owner.writer)


async def take_or_resume(
    agent: DrivenAgent,
    store: Store,
    prompt: str | Message,
    run_id: str,
    output: OutputSpec | None,
    metadata: dict[str, str] | None,
) -> tuple[JournalWriter, Lease, bool]:
    """``if_exists="resume"``: create run ``run_id``, or take it when it exists and began with ``prompt``.

    A run held by a live process is waited for (every ``poll_interval``) until its holder releases it, so
    two processes racing to start one id both end with the same run: one creates and drives it, the other
    then resumes it (a finished run is returned as it is).

    Returns:
        The writer, the lease, and whether this call created the run.

    Raises:
        ValueError: the run exists with another first message (or other metadata, when given), belongs to
            another agent, or is a subagent's run.
    """
    message = Message.user(prompt) if isinstance(prompt, str) else prompt
    checked = False
    while True:
        try:
            if not await store.aexists(run_id):
                try:
                    writer, lease = await take_new(agent, store, prompt, run_id, output, metadata)
                    return writer, lease, True
                except ValueError:
                    if not await store.aexists(run_id):
                        raise  # a real error, not another process's create of the same id
                    continue
            if not checked:
                _check_same_start(await store.aload(run_id), message, metadata)
                checked = True
            writer, lease = await take_existing(agent, store, run_id)
            return writer, lease, False
        except RunBusyError:  # held (or being created) by a live process: wait for its release
            await asyncio.sleep(agent.poll_interval)
        except RunNotFoundError:  # deleted since: create it
            checked = False


def _check_same_start(state: State, message: Message, metadata: dict[str, str] | None) -> None:
    """Refuse to resume, for ``if_exists="resume"``, a run begun with another message or metadata."""
    first = next((e for e in state.history if isinstance(e, j.MessageAdded)), None)
    if first is None or (first.role, list(first.content)) != (message.role, clean(list(message.content))):
        began = text_of(first.content) if first is not None else ""
        raise ValueError(
            f"run {state.id} exists and began with {_short(began)}, not {_short(message.text)}. Fix: pass "
            "another id=, or the run's own first message"
        )
    if metadata is not None and metadata != state.metadata:
        raise ValueError(
            f"run {state.id} exists with metadata {state.metadata}, not {metadata}. Fix: pass another id=, "
            "or the run's own metadata"
        )


def _short(text: str, limit: int = 80) -> str:
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")


def check_run(agent: DrivenAgent, state: State) -> None:
    """Refuse to drive a subagent's run (its root is driven) or another agent's run.

    Raises:
        ValueError: naming the run to resume, or the agent to resume it with.
    """
    if state.parent_id is not None:
        raise ValueError(
            f"run {state.id} is a subagent of {state.parent_id}. Fix: resume {state.root_id or state.parent_id}"
        )
    if state.agent and state.agent != agent.name:
        raise ValueError(
            f"run {state.id} belongs to agent {state.agent}; this is {agent.name}. Fix: resume it with {state.agent}"
        )


def _foreign_entries(fresh: list[j.Entry], posted: set[int]) -> list[j.Entry]:
    """Entries appended since a State was loaded that did not come from its own posted items.

    A State's own decision may have been journaled by someone else with the denied call's closing
    ``tool_finished`` right after it; those are its own too (DURABILITY 1.4).
    """
    foreign: list[j.Entry] = []
    own_decisions: set[str] = set()
    for entry in fresh:
        if getattr(entry, "inbox_seq", None) in posted:
            if isinstance(entry, j.ApprovalDecided):
                own_decisions.add(entry.call_id)
        elif not (isinstance(entry, j.ToolFinished) and entry.call_id in own_decisions):
            foreign.append(entry)
    return foreign
