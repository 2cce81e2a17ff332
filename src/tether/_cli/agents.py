"""``tether run``, ``resume``, ``approve`` and ``deny``: the commands that drive runs or decide their calls.

``run`` and ``resume`` load an Agent from ``module:attribute`` or ``path/file.py:attribute`` (``load_agent``),
the first argument of both, use the agent's own store unless ``--store`` is given, and print the drive as
it goes through one live view (``LiveView``, fed by ``agent.stream``): model text as it streams, a line
per call, result, decision and retry, then where the run stands and the command that continues it.
``approve`` and ``deny`` need no agent: they load the run that holds the call, decide on its State and save
it, which journals the decision now when no one holds the run, or posts it to the inbox of the process
that drives it.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import traceback
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.text import Text

from .. import journal as j
from .._timeline import display_status, format_call, retry_text, summarize, truncate, without_fix
from ..agent import Agent
from ..errors import ModelError, TetherError
from ..events import EntryEvent, Event, Reset, Retrying, TextDelta
from ..state import State
from ..stores import Store, open_store
from . import ids
from .common import (
    DEFAULT_STORE,
    EXIT_FAILED,
    STATUS_STYLES,
    STORE_ENV,
    STORE_HELP,
    ByOption,
    StoreOption,
    app,
    console,
    decide_lines,
    decider,
    fail,
    friendly_errors,
    load_agent,
    names_for,
    print_line,
    require_store,
    resolve_run,
    resume_hint,
    store_flag,
    store_url,
)

__all__ = ["AgentArgument", "AgentStoreOption", "LiveView", "approve", "deny", "resume", "run", "with_store"]

AgentArgument = Annotated[
    str,
    typer.Argument(
        metavar="AGENT",
        help="The Agent: module:attribute or path/file.py:attribute (an Agent, or a function returning one).",
    ),
]
AgentStoreOption = Annotated[
    str | None,
    typer.Option(
        "--store",
        "-s",
        metavar="URL",
        help=f"Use this store instead of the agent's own (an agent without one uses ${STORE_ENV}, else "
        f"{DEFAULT_STORE}). {STORE_HELP.split(' [')[0]}.",
        show_default=False,
    ),
]


def not_driven(root: str, agent: str | None, flag: str = "") -> str:
    """What the posting commands say when no one drives a run with work left (DURABILITY 2.1)."""
    return f"run {root} is not being driven. Fix: {resume_hint(root, agent, flag)}, or start a worker"


# --------------------------------------------------------------------------------------------------
# approve, deny


def _decide(
    approved: bool,
    run_id: str,
    call_id: str,
    by: str | None,
    reason: str | None,
    child: str | None,
    url: str,
    args: dict[str, Any] | None = None,
) -> None:
    runs = require_store(url)
    who = decider(by)
    named = resolve_run(runs, run_id, url)
    state = runs.load(named)
    tree = runs.list(root_id=state.root_id or state.id, limit=100_000)
    names = names_for(runs, tree)
    in_run = resolve_run(runs, child, url) if child is not None else None
    if in_run is not None and all(info.id != in_run for info in tree):
        fail(
            f"run {names.short(in_run)} is not in the tree of {names.short(named)}",
            f"tether show {names.short(named)} lists its subagent runs",
        )
    matches = [
        p
        for p in state.pending_approvals
        if p.call_id == call_id and (in_run is None or (p.run_id or state.id) == in_run)
    ]
    if len(matches) > 1:
        where = ", ".join(names.short(p.run_id or state.id) for p in matches)
        first = names.short(matches[0].run_id or state.id)
        fail(
            f"call {call_id} waits for a decision in {len(matches)} runs of this tree: {where}",
            f"name the run that holds it, e.g. tether {'approve' if approved else 'deny'} {first} {call_id}",
        )
    target = (matches[0].run_id or state.id) if matches else (in_run or named)
    if target != state.id:
        state = runs.load(target)
    try:
        if approved:
            state.approve(call_id, by=who, reason=reason, run_id=target, args=args)
        else:
            state.deny(call_id, by=who, reason=reason, run_id=target)
    except ValueError as exc:
        already = "already" in str(exc).partition(" Fix:")[0]
        fix = (
            f"nothing to do; tether show {names.short(target)} shows the decision"
            if already
            else f"tether show {names.short(named)} lists the calls that wait, with the command for each"
        )
        fail(str(exc), fix)
    item_id = state.take_local_changes()[-1]["item_id"]
    runs.save(state)
    verb = "approved" if approved else "denied"
    out = console()
    short = names.short(target)
    posted = next((i for i in runs.read_inbox(target) if i.item_id == item_id), None)
    journaled = [
        e for e in state.history if posted is not None and getattr(e, "inbox_seq", None) == posted.inbox_seq
    ]
    skipped = next((e for e in journaled if isinstance(e, j.InboxSkipped)), None)
    if skipped is not None:
        fail(skipped.reason, f"nothing to do; tether show {short} shows the decision")
    if journaled:
        print_line(out, f"call {call_id} of run {short} {verb} by {who}: journaled at seq {journaled[0].seq}")
    else:
        print_line(out, f"call {call_id} of run {short} {verb} by {who}: posted to the run's inbox")
    root = state.root_id or state.id
    root_short = names.short(root)
    holder = runs.holder(root)
    if holder is not None:
        print_line(
            out,
            f"run {root_short} is driven by {holder.describe()}; it journals the decision within its poll interval",
        )
        return
    root_agent = next((info.agent for info in tree if info.id == root), state.agent)
    if target != root or state.status == "running":
        print_line(out, not_driven(root_short, root_agent, store_flag(runs, url)))
    elif state.status == "waiting":
        waiting = ", ".join(p.call_id for p in state.pending_approvals) or "a subagent run"
        print_line(out, f"run {root_short} still waits for decisions on: {waiting}")


ReasonOption = Annotated[
    str | None, typer.Option("--reason", "-m", help="Why (journaled; the model sees a denial's).")
]
RunOption = Annotated[
    str | None,
    typer.Option(
        "--run",
        metavar="RUN_ID",
        help="The run of ID's tree that holds the call, when the call id is in several (ID's pending "
        "approvals name it).",
    ),
]
IdArgument = Annotated[
    str,
    typer.Argument(
        metavar="ID", help="The run, or its root (a root's pending approvals include its subagent runs')."
    ),
]
CallArgument = Annotated[
    str, typer.Argument(metavar="CALL_ID", help="The call (tether show ID lists the calls that wait).")
]


@app.command()
@friendly_errors
def approve(
    run_id: IdArgument,
    call_id: CallArgument,
    by: ByOption = None,
    reason: ReasonOption = None,
    child: RunOption = None,
    args: Annotated[
        str | None,
        typer.Option(
            "--args", metavar="JSON", help="Run the call with these arguments instead (a JSON object)."
        ),
    ] = None,
    store: StoreOption = DEFAULT_STORE,
) -> None:
    """Approve a call that waits for a decision.

    Journaled now if no process holds the run; otherwise posted to its inbox, and the holder journals it.
    A second decision on the same call is refused. With --args the tool runs with those arguments
    (validated by the driver that starts the call) and the model is told who changed them.
    """
    edited = None
    if args is not None:
        try:
            edited = json.loads(args)
        except ValueError as exc:
            fail(f"--args is not JSON ({exc})", """pass an object, e.g. --args '{"amount": 50}'""")
        if not isinstance(edited, dict):
            fail("--args is not a JSON object", """pass an object, e.g. --args '{"amount": 50}'""")
    _decide(True, run_id, call_id, by, reason, child, store, edited)


@app.command()
@friendly_errors
def deny(
    run_id: IdArgument,
    call_id: CallArgument,
    by: ByOption = None,
    reason: ReasonOption = None,
    child: RunOption = None,
    store: StoreOption = DEFAULT_STORE,
) -> None:
    """Deny a call that waits for a decision; the model is told (with the reason)."""
    _decide(False, run_id, call_id, by, reason, child, store)


# --------------------------------------------------------------------------------------------------
# run, resume


def with_store(agent: Agent, url: str | None, *, must_exist: bool) -> Store:
    """Point the agent at ``--store`` when given; give a store-less agent the default store."""
    if url is not None:
        agent.store = require_store(url) if must_exist else open_store(store_url(url))
    elif agent.store is None:
        default = os.environ.get(STORE_ENV) or DEFAULT_STORE
        agent.store = require_store(default) if must_exist else open_store(store_url(default))
    return agent.store


class LiveView:
    """What ``run`` and ``resume`` print as the drive goes: model text as it streams, and one line per call,
    result, decision, inbox item and retry (``agent.stream``'s events)."""

    def __init__(
        self, out: Console, store: Store, *, announce: str | None = None, given: str | None = None
    ) -> None:
        self.out = out
        self.store = store
        self.given = given
        """``--store`` as the user gave it, for the commands printed at the end."""
        self.announce = announce
        """A new run's id: its ``run_started`` is shown as a first line naming it."""
        self._names: ids.Names | None = None
        self.seen = False
        self.mid_line = False
        self.streamed = False
        self.answered = False
        """The final answer's text was shown (so the closing line does not repeat it)."""
        self.calls: dict[str, str] = {}

    def resume(self, spec: str, run_id: str) -> str:
        """The command that continues the run (the agent brings its store, unless ``--store`` was given)."""
        flag = f" --store {shlex.quote(self.given)}" if self.given is not None else ""
        return f"tether resume {spec} {run_id}{flag}"

    def name(self, run_id: str) -> str:
        """The short form of a run id (the store's ids are read again for an id not seen yet)."""
        if self._names is None or run_id not in self._names.known:
            self._names = names_for(self.store)
        return self._names.short(run_id)

    def text(self, text: str) -> None:
        if not text:
            return
        typer.echo(text, nl=False)
        self.mid_line = not text.endswith("\n")
        self.streamed = True

    def end_line(self) -> None:
        if self.mid_line:
            typer.echo("")
            self.mid_line = False

    def line(self, text: str, style: str = "") -> None:
        self.end_line()
        print_line(self.out, text, style)

    def event(self, event: Event) -> None:
        self.seen = True
        if isinstance(event, TextDelta):
            self.text(event.text)
        elif isinstance(event, Retrying):
            self.line(
                "   "
                + retry_text(
                    event.error_type,
                    event.error,
                    event.status_code,
                    event.delay,
                    event.attempt,
                    event.attempts,
                ),
                "yellow",
            )
        elif isinstance(event, Reset):
            self.end_line()  # the retry was said; the text shown for the failed request stays as it is
            self.streamed = False
        elif isinstance(event, EntryEvent):
            self.entry(event.entry)

    def entry(self, entry: j.Entry) -> None:
        if isinstance(entry, j.RunStarted) and self.announce is not None:
            self.line(f"run {self.name(self.announce)} started (agent {entry.agent or '-'})", "dim")
        elif isinstance(entry, j.ModelReplied):
            summarize(entry, self.calls)  # learns the calls' tools
            text = "".join(b.get("text", "") for b in entry.content if b.get("type") == "text")
            if not self.streamed:
                self.text(text)
            self.streamed = False
            calls = [block for block in entry.content if block.get("type") == "tool_call"]
            if text.strip() and not calls:
                self.answered = True
            for block in calls:
                self.line(f"-> {block.get('id')} {format_call(str(block.get('name')), block.get('args'))}")
        elif isinstance(entry, j.ToolFinished | j.ApprovalRequested | j.ApprovalDecided | j.ChildWaiting):
            self.line(
                f"   {summarize(entry, self.calls, self.name)}",
                "dim" if isinstance(entry, j.ToolFinished) else "",
            )
        elif isinstance(entry, j.MessageAdded) and entry.inbox_seq is not None:
            self.line(f"   {summarize(entry, self.calls)}", "dim")
        elif isinstance(entry, j.CancelRequested | j.Compacted | j.AgentChanged | j.BudgetsChanged):
            self.line(f"   {entry.kind}: {summarize(entry, self.calls)}", "dim")


def _report(out: Console, state: State, store: Store, spec: str, view: LiveView) -> int:
    """Where the run stands after a drive, and the command that continues it; returns the exit code."""
    names = names_for(store, store.list(root_id=state.id, limit=100_000))
    short = names.short(state.id)
    held = store.holder(state.id) is not None
    status = display_status(state.status, held)
    line = Text.assemble("run ", short, " is ", (status, STATUS_STYLES.get(state.status, "")))
    again = view.resume(spec, short)
    flag = store_flag(store, view.given)
    if state.status == "completed":
        if state.answer and not view.answered:
            line.append(f": {truncate(state.answer, 200)}")
        out.print(line, overflow="ignore", crop=False)
        return 0
    if state.reason:
        line.append(f": {truncate(without_fix(state.reason), 200)}")
    out.print(line, overflow="ignore", crop=False)
    for pending in state.pending_approvals:
        run_id = pending.run_id or state.id
        where = "" if run_id == state.id else f" (in subagent run {names.short(run_id)})"
        print_line(out, f"  {pending.call_id} {format_call(pending.tool, pending.args)} waits{where}")
        for text in decide_lines(names.short(run_id), pending.call_id, flag):
            print_line(out, f"    {text}")
    if state.pending_approvals:
        print_line(out, f"  then continue: {again}")
    elif state.status == "failed":
        print_line(out, f"Continue: {again} (it asks the model again)")
        return EXIT_FAILED
    elif state.status == "stopped":
        print_line(out, f"Continue: raise the agent's budget, then {again}")
    elif state.status == "running" and not held:
        print_line(out, f"Continue: {again}")
    return 0


def _failed(out: Console, exc: BaseException, state: State, store: Store, spec: str, view: LiveView) -> int:
    """The drive raised after the run began: say why, where the run stands, and how to continue."""
    view.end_line()
    if not isinstance(exc, TetherError):
        traceback.print_exception(exc)
    message = str(exc) or type(exc).__name__
    what, _, fix = message.partition(" Fix: ")
    retried = isinstance(exc, ModelError) and exc.retryable
    attempts = (
        f" (after {state.failures_since_reply} attempts)"
        if retried and state.failures_since_reply > 1
        else ""
    )
    names = names_for(store)
    short = names.short(state.id)
    if state.status != "failed":  # the error did not stop the run (a store error, a bug): say so first
        print_line(out, f"error: {type(exc).__name__}: {truncate(what.rstrip('.'), 300)}", "red")
        _report(out, state, store, spec, view)
        print_line(out, f"Continue: {view.resume(spec, short)}")
        return EXIT_FAILED
    print_line(
        out, f"run {short} failed: {type(exc).__name__}: {truncate(what.rstrip('.'), 300)}{attempts}", "red"
    )
    if fix and not retried:
        print_line(out, f"Fix: {fix.rstrip('.')}, then {view.resume(spec, short)}")
    else:
        print_line(out, f"Continue: {view.resume(spec, short)} (it asks the model again)")
    return EXIT_FAILED


async def _drive(agent: Agent, prompt: str | State, run_id: str | None, view: LiveView) -> None:
    try:
        async for event in agent.stream(prompt, id=run_id):
            view.event(event)
    finally:
        if agent.store is not None:
            await agent.store.aclose_loop()  # this loop ends with asyncio.run


def _live(made: Agent, runs: Store, spec: str, run_id: str, prompt: str | None, given: str | None) -> None:
    """Drive a new run (``prompt``) or an existing one through the live view, then report where it stands."""
    out = console()
    view = LiveView(out, runs, announce=run_id if prompt is not None else None, given=given)
    try:
        if prompt is not None:
            asyncio.run(_drive(made, prompt, run_id, view))
        else:
            state = runs.load(run_id)
            for entry in state.history:
                summarize(entry, view.calls)  # the tools of calls made before this drive
            asyncio.run(_drive(made, state, None, view))
    except KeyboardInterrupt:
        short = names_for(runs).short(run_id) if runs.exists(run_id) else run_id
        view.line(f"interrupted: run {short} was saved. Continue: {view.resume(spec, short)}")
        raise typer.Exit(130) from None
    except Exception as exc:
        if not view.seen or not runs.exists(run_id):
            raise
        raise typer.Exit(_failed(out, exc, runs.load(run_id), runs, spec, view)) from None
    view.end_line()
    code = _report(out, runs.load(run_id), runs, spec, view)
    if code:
        raise typer.Exit(code)


@app.command()
@friendly_errors
def resume(
    agent: AgentArgument,
    run_id: Annotated[
        str, typer.Argument(metavar="ID", help="The run to continue (an id, or a short form).")
    ],
    store: AgentStoreOption = None,
) -> None:
    """Continue a run from its journal with AGENT: finished tools never run again.

    Prints the drive as run does; a run that is completed, or waits for a decision, is shown as it is.
    """
    made = load_agent(agent)
    runs = with_store(made, store, must_exist=True)
    found = resolve_run(runs, run_id, store if store is not None else runs.identity)
    _live(made, runs, agent, found, None, store)


@app.command("run")
@friendly_errors
def run(
    agent: AgentArgument,
    prompt: Annotated[str, typer.Argument(metavar="PROMPT", help="The first user message.")],
    run_id: Annotated[str | None, typer.Option("--id", metavar="ID", help="The new run's id.")] = None,
    store: AgentStoreOption = None,
) -> None:
    """Start a run of AGENT and print it as it goes: the answer as it streams, and a line per tool call.

    At the end: where the run stands and the command that continues it (exit code 1 when it failed).
    """
    made = load_agent(agent)
    runs = with_store(made, store, must_exist=False)
    new_id = j.validate_run_id(run_id) if run_id is not None else j.new_run_id()
    if runs.exists(new_id):
        flag = f" --store {shlex.quote(store)}" if store is not None else ""
        fail(f"run {new_id} already exists", f"tether resume {agent} {new_id}{flag}, or pass another --id")
    _live(made, runs, agent, new_id, prompt, store)
