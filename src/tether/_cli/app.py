"""The ``tether`` command: list, show, cancel, delete, prune and fork runs, and watch the crash demo.

Built with typer and rich; only the modules of ``_cli`` (this one, ``common``, ``agents``, which holds
``run``, ``resume``, ``approve`` and ``deny``, and ``workers``) import them, and ``import tether`` never imports them. Every
command takes ``--store URL`` (default: ``$TETHER_STORE``, else ``DEFAULT_STORE``, a SQLite file under the
current folder). Bad input prints one line, ``error: what went wrong. Fix: what to do``, on stderr and exits
with code 2.
"""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from .. import journal as j
from .._timeline import display_status, open_state_lines, timeline_lines, truncate
from ..errors import RunBusyError
from ..state import State
from ..stores import RunInfo
from .common import (
    DEFAULT_STORE,
    STATUS_STYLES,
    STATUSES,
    STORE_ENV,
    JsonOption,
    StoreOption,
    app,
    console,
    fail,
    friendly_errors,
    load_agent,
    open_cli_store,
    parse_duration,
    require_store,
    whoami,
)

__all__ = ["DEFAULT_STORE", "STORE_ENV", "app", "load_agent", "main"]


# --------------------------------------------------------------------------------------------------
# tether demo


_DEMO_STYLES = {"heading": "bold", "ok": "bold green", "error": "bold red", "dim": "dim"}


@app.command()
@friendly_errors
def demo(
    store: Annotated[
        str | None,
        typer.Option(
            "--store",
            metavar="URL",
            help="Keep the demo run here (default: a SQLite file in a temporary folder).",
        ),
    ] = None,
) -> None:
    """Crash a run with SIGKILL, resume it elsewhere: the tool runs once.

    A scripted weather agent starts a run in a child process, which is killed right after its tool's result
    is saved; a second process resumes the run. The journal is shown at each step, and a side file outside
    the store counts the tool's executions. Exits 1 if the tool did not run exactly once.
    """
    from .demo import run_demo

    out = console()

    def printer(line: str, style: str = "") -> None:
        out.print(Text(line, style=_DEMO_STYLES.get(style, "")), overflow="ignore", crop=False)

    code = run_demo(store, printer)
    if code:
        raise typer.Exit(code)


# --------------------------------------------------------------------------------------------------
# tether ls


def _info_dict(info: RunInfo) -> dict[str, Any]:
    return {**dataclasses.asdict(info), "display_status": info.display_status}


def _age(at: str | None, now: datetime) -> str:
    """How long ago an ISO timestamp was: ``12s ago``, ``5m ago``, ``3h ago``, ``2d ago``, else the date."""
    if not at:
        return "-"
    try:
        then = datetime.fromisoformat(at.replace("Z", "+00:00"))
    except ValueError:
        return at
    seconds = int((now - then).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit} ago" if seconds < 30 * 86400 else at[:10]
    return f"{max(seconds, 0)}s ago"


@app.command("ls")
@friendly_errors
def ls(
    status: Annotated[
        str | None, typer.Option("--status", help=f"Only runs with this status: {', '.join(STATUSES)}.")
    ] = None,
    agent: Annotated[
        str | None, typer.Option("--agent", metavar="NAME", help="Only runs of this agent.")
    ] = None,
    parent: Annotated[
        str | None, typer.Option("--parent", metavar="ID", help="Only the subagent runs of this run.")
    ] = None,
    meta: Annotated[
        list[str] | None,
        typer.Option("--meta", metavar="KEY=VALUE", help="Only runs with this metadata pair (repeatable)."),
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, help="At most this many runs, newest first.")] = 50,
    as_json: JsonOption = False,
    store: StoreOption = DEFAULT_STORE,
) -> None:
    """List runs, most recently updated first.

    A running run that no process holds shows as "running (no owner)": a resume or a worker continues it.
    """
    if status is not None and status not in STATUSES:
        fail(f"status {status!r} is not known. Fix: use one of {', '.join(STATUSES)}")
    if parent is not None:
        j.validate_run_id(parent)
    pairs = [pair.partition("=") for pair in meta or ()]
    if any(not key or not sep for key, sep, _ in pairs):
        fail("--meta takes KEY=VALUE", "e.g. tether ls --meta user=u42")
    metadata = {key: value for key, _, value in pairs}
    opened = open_cli_store(store, missing_ok=True)
    runs = (
        opened.list(status=status, agent=agent, parent_id=parent, metadata=metadata, limit=limit)
        if opened is not None
        else []
    )
    out = console()
    if as_json:
        typer.echo(json.dumps([_info_dict(info) for info in runs], indent=2, default=str))
        return
    if not runs:
        which = f"{status} " if status else ""
        missing = "" if opened is not None else " (it does not exist yet)"
        out.print(Text(f"no {which}runs in {store}{missing}"))
        return
    now = datetime.now(UTC)
    with_parent = any(info.parent_id for info in runs)
    rows = [
        (
            info.id,
            info.agent or "-",
            info.display_status,
            str(info.turn),
            _age(info.updated_at, now),
            *([info.parent_id or "-"] if with_parent else []),
        )
        for info in runs
    ]
    headers = ("id", "agent", "status", "turn", "updated", *(["parent"] if with_parent else []))
    fixed = sum(max(len(h), *(len(row[i]) for row in rows)) + 2 for i, h in enumerate(headers))
    room = min(out.width - fixed, 60)  # the first message gets what is left of the line
    table = Table(box=None, pad_edge=False, header_style="bold")
    for header in headers:
        table.add_column(header, no_wrap=True, justify="right" if header == "turn" else "left")
    if room >= 12:
        table.add_column("first message", no_wrap=True, overflow="ellipsis")
    for info, row in zip(runs, rows, strict=True):
        cells: list[str | Text] = [*row]
        cells[2] = Text(row[2], style=STATUS_STYLES.get(info.status, ""))
        if room >= 12:
            cells.append(truncate(info.first_message or "", room))
        table.add_row(*cells)
    out.print(table)


# --------------------------------------------------------------------------------------------------
# tether show


def _show_json(state: State, held: bool) -> dict[str, Any]:
    return {
        "id": state.id,
        "agent": state.agent,
        "status": state.status,
        "display_status": display_status(state.status, held),
        "turn": state.turn,
        "answer": state.answer,
        "reason": state.reason,
        "usage": state.usage,
        "parent_id": state.parent_id,
        "root_id": state.root_id,
        "entries": [j.entry_to_dict(entry) for entry in state.history],
        "open_calls": [dataclasses.asdict(call) for call in state.open_calls],
        "pending_approvals": [dataclasses.asdict(p) for p in state.pending_approvals],
    }


@app.command()
@friendly_errors
def show(
    run_id: Annotated[str, typer.Argument(metavar="ID", help="The run's id (tether ls lists them).")],
    as_json: JsonOption = False,
    store: StoreOption = DEFAULT_STORE,
) -> None:
    """Show a run's journal, open calls and what a resume would do.

    One line per journal entry (seq, time, kind, summary), then each call without a result and what a
    resume does with it, the pending approvals, and the status.
    """
    runs = require_store(store)
    state = runs.load(j.validate_run_id(run_id))
    holder = runs.holder(run_id)
    if as_json:
        typer.echo(json.dumps(_show_json(state, holder is not None), indent=2, default=str))
        return
    status = display_status(state.status, holder is not None)
    out = console()
    out.print(Text.assemble(("run ", "bold"), (state.id, "bold"), f"  agent {state.agent or '-'}"))
    lines = timeline_lines(state.history)
    out.print(Text(lines[0], style="dim"), overflow="ignore", crop=False)
    for line in lines[1:]:
        out.print(Text(line), overflow="ignore", crop=False)
    out.print()
    status_line = Text.assemble("status: ", (status, STATUS_STYLES.get(state.status, "")))
    if holder is not None:
        status_line.append(f" (held by {holder.describe()})")
    out.print(status_line)
    if state.answer is not None:
        out.print(Text(f"answer: {truncate(state.answer, 200)}"))
    elif state.reason:
        out.print(Text(f"reason: {truncate(state.reason, 200)}"))
    for line in open_state_lines(state):
        out.print(Text(line), overflow="ignore", crop=False)


# --------------------------------------------------------------------------------------------------
# tether cancel, rm, prune, fork


@app.command()
@friendly_errors
def cancel(
    run_id: Annotated[str, typer.Argument(metavar="ID", help="The run's id.")],
    by: Annotated[
        str | None,
        typer.Option("--by", metavar="NAME", help="Who asks (journaled; default: your user name)."),
    ] = None,
    store: StoreOption = DEFAULT_STORE,
) -> None:
    """Cancel a run.

    If no process drives the run, the cancel is journaled now and the run is cancelled. Otherwise it is
    posted to the run's inbox, and the driving process stops the run within its poll interval.
    """
    runs = require_store(store)
    j.validate_run_id(run_id)
    before = runs.load(run_id)
    try:
        after = runs.cancel(run_id, by=by if by is not None else whoami())
    except RunBusyError:
        after = None
    out = console()
    root = before.root_id or run_id
    if after is None and root != run_id:
        out.print(Text(f"run {run_id} is a subagent run of {root}: the cancel was posted to its inbox."))
        holder = runs.holder(root)
        if holder is not None:
            out.print(
                Text(
                    f"run {root} is driven by {holder.describe()}; it journals the cancel within its poll interval"
                )
            )
        else:
            out.print(
                Text(
                    f"run {root} is not being driven. Fix: tether resume {root} --agent ... or start a worker"
                )
            )
        return
    if after is None:
        holder = runs.holder(run_id)
        who = holder.describe() if holder is not None else "another process"
        out.print(Text(f"run {run_id} is driven by {who}."))
        out.print(
            Text("The cancel was posted to its inbox: that process stops the run within its poll interval.")
        )
        out.print(Text(f"Check with: tether show {run_id}", style="dim"))
        return
    if after.status == "cancelled" and before.status != "cancelled":
        out.print(
            Text.assemble(
                "run ", run_id, " is ", ("cancelled", "magenta"), f" (journaled at seq {after.stopped_seq})"
            )
        )
    else:
        out.print(
            Text(
                f"run {run_id} was already {before.status}; the cancel request was journaled and changed nothing"
            )
        )


ChildrenOption = Annotated[
    bool, typer.Option("--children", help="Also delete the run's subagent runs (a tree goes whole).")
]


@app.command("rm")
@friendly_errors
def rm(
    run_id: Annotated[str, typer.Argument(metavar="ID", help="The run's id.")],
    children: ChildrenOption = False,
    store: StoreOption = DEFAULT_STORE,
) -> None:
    """Delete a run: its journal and inbox. A held run is refused.

    A run with subagent runs needs --children; a subagent run is deleted through its root.
    """
    runs = require_store(store)
    j.validate_run_id(run_id)
    kids = [info.id for info in runs.list(root_id=run_id, limit=1_000_000) if info.id != run_id]
    runs.delete(run_id, children=children)
    more = f" and its {len(kids)} subagent run{'s' if len(kids) != 1 else ''}" if children and kids else ""
    console().print(Text(f"deleted run {run_id}{more}"))


@app.command()
@friendly_errors
def prune(
    older_than: Annotated[
        str,
        typer.Option("--older-than", metavar="AGE", help="Only runs last updated longer ago: 30d, 12h, 90m."),
    ],
    status: Annotated[
        str,
        typer.Option("--status", metavar="S,S", help="Which stopped runs may go (comma-separated)."),
    ] = "completed,cancelled,failed,stopped",
    children: Annotated[
        bool, typer.Option("--children", help="Also prune runs with subagent runs (each tree goes whole).")
    ] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Only list what would be deleted.")] = False,
    store: StoreOption = DEFAULT_STORE,
) -> None:
    """Delete old stopped runs that no one holds.

    Only completed, cancelled, failed or stopped runs (as --status allows) last updated before the cutoff, with
    nothing unconsumed in their inbox. Held runs are kept. Runs with subagent runs go only with --children, and
    a subagent run never goes while its root is kept.
    """
    age = parse_duration(older_than)
    statuses = [s.strip() for s in status.split(",") if s.strip()]
    runs = open_cli_store(store, missing_ok=True)
    gone = runs.prune(age, statuses=statuses, children=children, dry_run=dry_run) if runs is not None else []
    out = console()
    if not gone:
        out.print(Text(f"no runs to prune: none {'/'.join(statuses)} and updated more than {older_than} ago"))
        return
    noun = f"{len(gone)} run{'s' if len(gone) != 1 else ''}"
    out.print(Text(f"would delete {noun} (dry run: nothing deleted):" if dry_run else f"deleted {noun}:"))
    for run_id in gone:
        out.print(Text(f"  {run_id}"))


@app.command()
@friendly_errors
def fork(
    run_id: Annotated[str, typer.Argument(metavar="ID", help="The run to fork.")],
    at: Annotated[
        int | None,
        typer.Option(
            "--at", metavar="SEQ", help="Fork after this seq (rounded down to a turn; default: the end)."
        ),
    ] = None,
    new_id: Annotated[str | None, typer.Option("--id", metavar="NEW", help="The new run's id.")] = None,
    store: StoreOption = DEFAULT_STORE,
) -> None:
    """Copy a run up to a turn into a new run that can be resumed on its own.

    The new run's journal is the source's up to SEQ, rounded down to a point where no call is open.
    """
    runs = require_store(store)
    made = runs.fork(j.validate_run_id(run_id), at_seq=at, new_id=new_id)
    fork_state = runs.load(made)
    started = fork_state.history[0]
    boundary = started.forked_from["seq"] if isinstance(started, j.RunStarted) and started.forked_from else 0
    rounded = (
        f" (seq {at} rounded down to the turn ending at seq {boundary})"
        if at is not None and at != boundary
        else ""
    )
    out = console()
    out.print(Text(f"forked run {run_id} at seq {boundary} as {made}{rounded}; it is {fork_state.status}"))
    named = f" (the Agent named {fork_state.agent})" if fork_state.agent else ""
    out.print(Text(f"Continue it: tether resume {made} --agent MODULE:ATTRIBUTE{named}", style="dim"))


# --------------------------------------------------------------------------------------------------

from . import agents as agents  # noqa: E402  (registers run, resume, approve, deny)
from . import ui as ui  # noqa: E402  (registers ui, the run inspector)
from . import workers as workers  # noqa: E402  (registers submit, worker, db migrate, crashtest)


def main() -> None:
    """The console-script entry point (``tether``)."""
    app()


if __name__ == "__main__":
    main()
