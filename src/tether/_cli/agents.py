"""``tether run``, ``resume``, ``approve`` and ``deny``: the commands that drive runs or decide their calls.

``run`` and ``resume`` load an Agent from ``module:attribute`` or ``path/file.py:attribute``
(``load_agent``) and use the agent's own store unless ``--store`` is given. ``approve`` and ``deny`` need
no agent: they load the run, decide on the State and save it, which journals the decision now when no one
holds the run, or posts it to the inbox of the process that drives it.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.text import Text

from .. import journal as j
from .._timeline import display_status, format_call, summarize, truncate
from ..agent import Agent
from ..events import EntryEvent, Event, Reset, TextDelta
from ..state import State
from ..stores import Store, open_store
from .common import (
    DEFAULT_STORE,
    STATUS_STYLES,
    STORE_ENV,
    StoreOption,
    app,
    console,
    fail,
    friendly_errors,
    load_agent,
    require_store,
)

__all__ = ["approve", "deny", "resume", "run"]

AgentOption = Annotated[
    str,
    typer.Option(
        "--agent",
        metavar="MODULE:ATTR",
        help="The Agent: module:attribute or path/file.py:attribute (an Agent, or a function returning one).",
    ),
]
AgentStoreOption = Annotated[
    str | None,
    typer.Option(
        "--store",
        metavar="URL",
        help=f"Use this store instead of the agent's own (an agent without one uses ${STORE_ENV}, else "
        f"{DEFAULT_STORE}).",
        show_default=False,
    ),
]


def not_driven(root: str) -> str:
    """What the posting commands say when no one drives a run with work left (DURABILITY 2.1)."""
    return f"run {root} is not being driven. Fix: tether resume {root} --agent ... or start a worker"


# --------------------------------------------------------------------------------------------------
# approve, deny


def _decide(
    approved: bool,
    run_id: str,
    call_id: str,
    by: str,
    reason: str | None,
    child: str | None,
    url: str,
    args: dict[str, Any] | None = None,
) -> None:
    runs = require_store(url)
    target = j.validate_run_id(child if child is not None else run_id)
    state = runs.load(target)
    root = state.root_id or state.id
    if child is not None and run_id not in (state.parent_id, state.root_id):
        fail(f"run {child} is not a subagent run of {run_id}", f"tether ls --parent {run_id} lists them")
    try:
        if approved:
            state.approve(call_id, by=by, reason=reason, run_id=target, args=args)
        else:
            state.deny(call_id, by=by, reason=reason, run_id=target)
    except ValueError as exc:
        fail(str(exc), f"nothing to do; tether show {target} shows its calls and decisions")
    item_id = state.take_local_changes()[-1]["item_id"]
    runs.save(state)
    verb = "approved" if approved else "denied"
    out = console()
    posted = next((i for i in runs.read_inbox(target) if i.item_id == item_id), None)
    journaled = [
        e for e in state.history if posted is not None and getattr(e, "inbox_seq", None) == posted.inbox_seq
    ]
    skipped = next((e for e in journaled if isinstance(e, j.InboxSkipped)), None)
    if skipped is not None:
        fail(skipped.reason, f"nothing to do; tether show {target} shows the decision")
    if journaled:
        out.print(Text(f"call {call_id} of run {target} {verb} by {by}: journaled at seq {journaled[0].seq}"))
    else:
        out.print(Text(f"call {call_id} of run {target} {verb} by {by}: posted to the run's inbox"))
    holder = runs.holder(root)
    if holder is not None:
        out.print(
            Text(
                f"run {root} is driven by {holder.describe()}; it journals the decision within its poll interval"
            )
        )
        return
    if target != root or state.status == "running":
        out.print(Text(not_driven(root)))
    elif state.status == "waiting":
        waiting = ", ".join(p.call_id for p in state.pending_approvals) or "a subagent run"
        out.print(Text(f"run {root} still waits for decisions on: {waiting}"))


ByOption = Annotated[str, typer.Option("--by", metavar="NAME", help="Who decides (journaled).")]
ReasonOption = Annotated[
    str | None, typer.Option("--reason", help="Why (journaled; the model sees a denial's).")
]
RunOption = Annotated[
    str | None,
    typer.Option("--run", metavar="CHILD_ID", help="The call is in this subagent run of ID."),
]


@app.command()
@friendly_errors
def approve(
    run_id: Annotated[str, typer.Argument(metavar="ID", help="The run (the root, for a subagent's call).")],
    call_id: Annotated[str, typer.Argument(metavar="CALL_ID", help="The call (tether show ID lists them).")],
    by: ByOption,
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
    run_id: Annotated[str, typer.Argument(metavar="ID", help="The run (the root, for a subagent's call).")],
    call_id: Annotated[str, typer.Argument(metavar="CALL_ID", help="The call (tether show ID lists them).")],
    by: ByOption,
    reason: ReasonOption = None,
    child: RunOption = None,
    store: StoreOption = DEFAULT_STORE,
) -> None:
    """Deny a call that waits for a decision; the model is told (with the reason)."""
    _decide(False, run_id, call_id, by, reason, child, store)


# --------------------------------------------------------------------------------------------------
# run, resume


def _with_store(agent: Agent, url: str | None, *, must_exist: bool) -> Store:
    """Point the agent at ``--store`` when given; give a store-less agent the default store."""
    if url is not None:
        agent.store = require_store(url) if must_exist else open_store(url)
    elif agent.store is None:
        default = os.environ.get(STORE_ENV) or DEFAULT_STORE
        agent.store = require_store(default) if must_exist else open_store(default)
    return agent.store


class _Printer:
    """Prints a drive as it goes: model text as it streams, and one line per call, decision or stop."""

    def __init__(self, out: Console) -> None:
        self.out = out
        self.mid_line = False
        self.streamed = False
        self.calls: dict[str, str] = {}

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
        self.out.print(Text(text, style=style), overflow="ignore", crop=False)

    def event(self, event: Event) -> None:
        if isinstance(event, TextDelta):
            self.text(event.text)
        elif isinstance(event, Reset):
            self.line("(the model is asked again)", "dim")
            self.streamed = False
        elif isinstance(event, EntryEvent):
            self.entry(event.entry)

    def entry(self, entry: j.Entry) -> None:
        if isinstance(entry, j.ModelReplied):
            summarize(entry, self.calls)  # learns the calls' tools
            if not self.streamed:
                self.text("".join(b.get("text", "") for b in entry.content if b.get("type") == "text"))
            self.streamed = False
            for block in entry.content:
                if block.get("type") == "tool_call":
                    self.line(
                        f"-> {block.get('id')} {format_call(str(block.get('name')), block.get('args'))}"
                    )
        elif isinstance(entry, j.ToolFinished | j.ApprovalRequested | j.ApprovalDecided | j.ChildWaiting):
            self.line(
                f"   {summarize(entry, self.calls)}", "dim" if isinstance(entry, j.ToolFinished) else ""
            )


def _report(out: Console, state: State, store: Store, spec: str) -> None:
    """The run's status after a drive, and what to do next."""
    held = store.holder(state.id) is not None
    status = display_status(state.status, held)
    line = Text.assemble("run ", state.id, " is ", (status, STATUS_STYLES.get(state.status, "")))
    if state.status == "completed":
        line.append(f": {truncate(state.answer or '', 200)}")
    elif state.reason:
        line.append(f": {truncate(state.reason, 200)}")
    out.print(line)
    for pending in state.pending_approvals:
        out.print(
            Text(
                f"  {pending.call_id} {format_call(pending.tool, pending.args)} waits. Decide: tether approve "
                f"{state.id} {pending.call_id} --by NAME (or tether deny ...), then tether resume {state.id} "
                f"--agent {spec}"
            )
        )


@app.command()
@friendly_errors
def resume(
    run_id: Annotated[str, typer.Argument(metavar="ID", help="The run to continue.")],
    agent: AgentOption,
    store: AgentStoreOption = None,
) -> None:
    """Continue a run from its journal with AGENT: finished tools never run again."""
    made = load_agent(agent)
    runs = _with_store(made, store, must_exist=True)
    out = console()
    printer = _Printer(out)
    made.on_text = printer.text
    try:
        state = made.resume(j.validate_run_id(run_id))
    except KeyboardInterrupt:
        printer.line(f"interrupted: run {run_id} was saved. Continue: tether resume {run_id} --agent {agent}")
        raise typer.Exit(130) from None
    printer.end_line()
    _report(out, state, runs, agent)


async def _stream(agent: Agent, prompt: str, run_id: str, printer: _Printer) -> None:
    async for event in agent.stream(prompt, id=run_id):
        printer.event(event)


@app.command("run")
@friendly_errors
def run(
    agent: Annotated[
        str, typer.Argument(metavar="AGENT", help="module:attribute or path/file.py:attribute.")
    ],
    prompt: Annotated[str, typer.Argument(metavar="PROMPT", help="The first user message.")],
    run_id: Annotated[str | None, typer.Option("--id", metavar="ID", help="The new run's id.")] = None,
    store: AgentStoreOption = None,
) -> None:
    """Start a run of AGENT and print it as it goes: the answer as it streams, and a line per tool call."""
    made = load_agent(agent)
    runs = _with_store(made, store, must_exist=False)
    new_id = j.validate_run_id(run_id) if run_id is not None else j.new_run_id()
    out = console()
    printer = _Printer(out)
    try:
        asyncio.run(_stream(made, prompt, new_id, printer))
    except KeyboardInterrupt:
        printer.line(f"interrupted: run {new_id} was saved. Continue: tether resume {new_id} --agent {agent}")
        raise typer.Exit(130) from None
    printer.end_line()
    _report(out, runs.load(new_id), runs, agent)
