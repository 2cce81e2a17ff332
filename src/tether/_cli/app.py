"""The ``tether`` command: list, show and follow runs, and watch the crash demo.

Built with typer and rich; only the modules of ``_cli`` (this one; ``common``; ``ids``, short run ids;
``listing``, what ``ls`` shows; ``agents``, which holds ``run``, ``resume``, ``approve`` and ``deny``; and
``workers``) import them, and ``import tether`` never imports them. Every command takes ``--store URL``
(default: ``$TETHER_STORE``, else ``DEFAULT_STORE``, a SQLite file under the current folder) and run ids in
short form. Bad input prints one line, ``error: what went wrong. Fix: the command to run``, on stderr and
exits with code 2. docs/cli.md describes the commands and their JSON.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import re
from collections.abc import Sequence
from datetime import UTC, datetime, tzinfo
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.text import Text

from .. import journal as j
from .._timeline import (
    Timeline,
    display_status,
    next_step,
    open_state_lines,
    timeline_lines,
    truncate,
    without_fix,
)
from ..state import State
from ..stores import RunInfo, Store
from . import ids, listing
from .common import (
    DEFAULT_STORE,
    STATUS_STYLES,
    STATUSES,
    STORE_ENV,
    TREE_LIMIT,
    JsonOption,
    StoreOption,
    app,
    console,
    decide_lines,
    fail,
    friendly_errors,
    info_of,
    load_agent,
    names_for,
    open_cli_store,
    print_line,
    require_store,
    resolve_run,
    resume_hint,
    store_flag,
    store_url,
)

__all__ = ["DEFAULT_STORE", "STORE_ENV", "app", "load_agent", "main"]

_DATE_LINE = re.compile(r"\s+\d{4}-\d\d-\d\d ")
"""A timeline's line giving the date and the zone (``Timeline``)."""

UtcOption = Annotated[
    bool, typer.Option("--utc", "-u", help="Show times in UTC (default: your local time zone).")
]


def _zone(utc: bool) -> tzinfo | None:
    return UTC if utc else None


def _width(out: Console) -> int | None:
    """The width to wrap text to: the terminal's (or $COLUMNS), None when the output is neither."""
    return out.width if out.is_terminal or "COLUMNS" in os.environ else None


def _below(run_id: str, tree: Sequence[RunInfo]) -> list[RunInfo]:
    """The runs of ``tree`` under ``run_id`` (its subagent runs, theirs, ...)."""
    under: set[str] = {run_id}
    found: list[RunInfo] = []
    pending = [info for info in tree if info.id != run_id]
    grew = True
    while grew:
        grew = False
        for info in list(pending):
            if info.parent_id in under:
                under.add(info.id)
                found.append(info)
                pending.remove(info)
                grew = True
    return found


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
            "-s",
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

    code = run_demo(store_url(store) if store is not None else None, printer)
    if code:
        raise typer.Exit(code)


# --------------------------------------------------------------------------------------------------
# tether ls


@app.command("ls")
@friendly_errors
def ls(
    status: Annotated[
        str | None,
        typer.Option(
            "--status",
            metavar="STATUS",
            help=f"Only trees whose root has this status: {', '.join(STATUSES)}.",
        ),
    ] = None,
    agent: Annotated[
        str | None, typer.Option("--agent", metavar="NAME", help="Only trees whose root runs this agent.")
    ] = None,
    parent: Annotated[
        str | None,
        typer.Option("--parent", metavar="ID", help="Only the subagent runs of this run, as a flat list."),
    ] = None,
    roots: Annotated[
        bool, typer.Option("--roots", help="Only the roots: leave out the subagent runs folded under them.")
    ] = False,
    limit: Annotated[
        int, typer.Option("--limit", "-n", metavar="N", min=1, help="At most this many trees, newest first.")
    ] = 50,
    meta: Annotated[
        list[str] | None,
        typer.Option(
            "--meta", metavar="KEY=VALUE", help="Only trees whose root has this metadata pair (repeatable)."
        ),
    ] = None,
    as_json: JsonOption = False,
    store: StoreOption = DEFAULT_STORE,
) -> None:
    """List runs, most recently updated first, each subagent run folded under its root.

    Ids are shown in short form (any command takes them). A running run that no process holds shows as
    "running (no owner)": a resume or a worker continues it. At 80 columns the first message goes first,
    then the agent's name is cut; the id and the status are always shown whole.
    """
    if status is not None and status not in STATUSES:
        fail(f"status {status!r} is not known", f"use one of {', '.join(STATUSES)}")
    pairs = [pair.partition("=") for pair in meta or ()]
    if any(not key or not sep for key, sep, _ in pairs):
        fail("--meta takes KEY=VALUE", "e.g. tether ls --meta user=u42")
    metadata = {key: value for key, _, value in pairs}
    opened = open_cli_store(store, missing_ok=True)
    out = console()
    if opened is None:
        if as_json:
            typer.echo("[]")
            return
        print_line(out, f"no runs in {store_url(store)} (it does not exist yet)")
        return
    if parent is not None:
        parent_id = resolve_run(opened, parent, store)
        found: list[tuple[RunInfo, list[RunInfo]]] = [
            (info, [])
            for info in opened.list(
                parent_id=parent_id, status=status, agent=agent, metadata=metadata or None, limit=limit
            )
        ]
        names = names_for(opened, [info for info, _ in found])
    else:
        found, seen, complete = listing.trees(
            opened, status=status, agent=agent, limit=limit, metadata=metadata
        )
        names = ids.Names(seen, complete=complete)
        if roots:
            found = [(root, []) for root, _ in found]
    if as_json:
        rows = listing.rows_of(found, lambda run_id: run_id)
        typer.echo(json.dumps([listing.run_json(row.info) for row in rows], indent=2))
        return
    if not found:
        which = f"{status} " if status else ""
        print_line(out, f"no {which}runs in {store_url(store)}")
        return
    rows = listing.rows_of(found, names.short, unicode=(out.encoding or "").lower().startswith("utf"))
    for line in listing.table_lines(rows, out.width, datetime.now(UTC)):
        out.print(line, overflow="ignore", crop=False, no_wrap=True)


# --------------------------------------------------------------------------------------------------
# tether show


def _stopped(state: State) -> j.RunStopped | None:
    last = state.history[-1] if state.history else None
    return last if isinstance(last, j.RunStopped) else None


def show_json(state: State, info: RunInfo, below: Sequence[RunInfo]) -> dict[str, Any]:
    """``tether show --json`` (docs/cli.md)."""
    stopped = _stopped(state)
    return {
        **listing.run_json(info),
        "answer": state.answer,
        "output": stopped.output if stopped is not None else None,
        "reason": state.reason,
        "usage": state.usage,
        "next_step": next_step(state),
        "open_calls": [dataclasses.asdict(call) for call in state.open_calls],
        "pending_approvals": [
            {**dataclasses.asdict(p), "run_id": p.run_id or state.id} for p in state.pending_approvals
        ],
        "subagent_runs": [listing.run_json(run) for run in below],
        "entries": [j.entry_to_dict(entry) for entry in state.history],
    }


@app.command()
@friendly_errors
def show(
    run_id: Annotated[str, typer.Argument(metavar="ID", help="The run's id, or a short form of it.")],
    utc: UtcOption = False,
    as_json: JsonOption = False,
    store: StoreOption = DEFAULT_STORE,
) -> None:
    """Show a run's journal, open calls, pending approvals and what a resume would do.

    One line per journal entry (seq, time, kind, summary), dated, in your local time zone (--utc for UTC);
    then the status, the subagent runs, each call without a result and what a resume does with it, and the
    pending approvals (of the subagent runs too) with the command that decides each.
    """
    runs = require_store(store)
    found = resolve_run(runs, run_id, store)
    state = runs.load(found)
    tree = runs.list(root_id=state.root_id or state.id, limit=TREE_LIMIT)
    info = info_of(state, tree)
    below = _below(state.id, tree)
    if as_json:
        typer.echo(json.dumps(show_json(state, info, below), indent=2, default=str))
        return
    out = console()
    tz = _zone(utc)
    names = names_for(runs, tree)
    flag = store_flag(runs, store)
    holder = runs.holder(found)
    out.print(Text.assemble(("run ", "bold"), (state.id, "bold"), f"  agent {state.agent or '-'}"))
    if state.parent_id is not None:
        root = state.root_id or state.parent_id
        of_root = f"; its root is {names.short(root)}" if root != state.parent_id else ""
        print_line(
            out, f"subagent run of {names.short(state.parent_id)} (call {state.parent_call_id}){of_root}"
        )
    lines = timeline_lines(state.history, tz=tz, width=_width(out), name=names.short)
    print_line(out, lines[0], "dim")
    for line in lines[1:]:
        print_line(out, line, "dim" if _DATE_LINE.match(line) else "")
    out.print()
    status_line = Text.assemble("status: ", (display_status(state.status, holder is not None), ""))
    status_line.stylize(STATUS_STYLES.get(state.status, ""), len("status: "))
    if holder is not None:
        status_line.append(f" (held by {holder.describe()})")
    out.print(status_line)
    if state.answer is not None:
        print_line(out, f"answer: {truncate(state.answer, 200)}")
    elif state.reason:
        print_line(out, f"reason: {truncate(without_fix(state.reason), 200)}")
    if below:
        print_line(out, "subagent runs:")
        rows = listing.rows_of([(info, below)], names.short)[1:]
        width = max(len(row.id_cell) for row in rows)
        for row in rows:
            cells = Text(f"  {row.id_cell:<{width}}  {row.info.agent or '-'}  ")
            cells.append(row.info.display_status, style=STATUS_STYLES.get(row.info.status, ""))
            out.print(cells, overflow="ignore", crop=False)
    for line in open_state_lines(
        state,
        tz=tz,
        name=names.short,
        decide=lambda run, call: decide_lines(names.short(run), call, flag),
        width=_width(out),
    ):
        print_line(out, line)
    if state.status == "running" and holder is None and state.parent_id is None:
        print_line(
            out,
            f"continue: {resume_hint(names.short(state.id), state.agent, flag)}, or start a worker",
            "dim",
        )


# --------------------------------------------------------------------------------------------------
# tether follow


@app.command()
@friendly_errors
def follow(
    run_id: Annotated[str, typer.Argument(metavar="ID", help="The run's id, or a short form of it.")],
    utc: UtcOption = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print each entry as a line of JSON (docs/cli.md).")
    ] = False,
    store: StoreOption = DEFAULT_STORE,
) -> None:
    """Print a run's journal, then each entry as it is journaled, until the run stops.

    For a run driven elsewhere (a worker, another terminal): the entries already journaled, then the new
    ones as they come. A run that waits for a decision is followed on (the command to decide is printed);
    Ctrl+C stops following, and the run goes on.
    """
    runs = require_store(store)
    found = resolve_run(runs, run_id, store)
    out = console()
    names = names_for(runs, runs.list(root_id=runs.load(found).root_id or found, limit=TREE_LIMIT))
    try:
        asyncio.run(_follow(runs, found, out, names, _zone(utc), as_json, store_flag(runs, store)))
    except KeyboardInterrupt:
        if not as_json:
            print_line(out, f"stopped following run {names.short(found)}; it goes on", "dim")
        raise typer.Exit(130) from None


async def _follow(
    runs: Store, run_id: str, out: Console, names: ids.Names, tz: tzinfo | None, as_json: bool, flag: str
) -> None:
    state = State(id=run_id)
    timeline = Timeline(tz=tz, width=_width(out), name=names.short)
    short = names.short(run_id)
    if not as_json:
        print_line(
            out, f"following run {short}: entries as they are journaled, until it stops (Ctrl+C: stop)", "dim"
        )
        loaded = runs.load(run_id)
        root = loaded.root_id or run_id
        if loaded.status == "running" and runs.holder(root) is None:
            agent = loaded.agent if root == run_id else None
            hint = resume_hint(names.short(root), agent, flag)
            print_line(out, f"no process drives it now; it goes on when one does: {hint}, or a worker", "dim")
        print_line(out, timeline.header(), "dim")
    told: str | None = None
    async for entry in runs.follow(run_id):
        state.apply(entry)
        if as_json:
            typer.echo(json.dumps(j.entry_to_dict(entry), default=str))
            continue
        for line in timeline.lines(entry):
            print_line(out, line, "dim" if _DATE_LINE.match(line) else "")
        waiting = state.status == "waiting" and entry.kind in (
            "run_released",
            "approval_requested",
            "child_waiting",
        )
        if waiting and told != "waiting":
            told = "waiting"
            print_line(out, "  it waits for a decision, and goes on once one is made:", "dim")
            for pending in state.pending_approvals:
                for text in decide_lines(names.short(pending.run_id or run_id), pending.call_id, flag):
                    print_line(out, f"  {text}", "dim")
        elif state.status != "waiting":
            told = None
    if not as_json:
        end = Text.assemble("run ", short, " is ", (state.status, STATUS_STYLES.get(state.status, "")))
        if state.answer is not None:
            end.append(f": {truncate(state.answer, 200)}")
        elif state.reason:
            end.append(f": {truncate(without_fix(state.reason), 200)}")
        out.print(end, overflow="ignore", crop=False)


# --------------------------------------------------------------------------------------------------

from . import agents as agents  # noqa: E402  (registers run, resume, approve, deny)
from . import manage as manage  # noqa: E402  (registers cancel, rm, prune, fork)
from . import ui as ui  # noqa: E402  (registers ui, the run inspector)
from . import workers as workers  # noqa: E402  (registers submit, worker, db migrate, crashtest)


def main() -> None:
    """The console-script entry point (``tether``)."""
    app()


if __name__ == "__main__":
    main()
