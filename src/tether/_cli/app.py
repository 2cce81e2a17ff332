"""The ``tether`` command: list, show, follow, cancel, delete, prune and fork runs, and watch the crash demo.

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
from ..errors import RunBusyError
from ..state import State
from ..stores import RunInfo, Store
from . import ids, listing
from .common import (
    DEFAULT_STORE,
    EXIT_FAILED,
    STATUS_STYLES,
    STATUSES,
    STORE_ENV,
    ByOption,
    JsonOption,
    StoreOption,
    app,
    console,
    decide_lines,
    decider,
    fail,
    friendly_errors,
    load_agent,
    names_for,
    open_cli_store,
    parse_duration,
    require_store,
    resolve_run,
    resume_hint,
    store_flag,
    store_url,
)

__all__ = ["DEFAULT_STORE", "STORE_ENV", "app", "load_agent", "main"]

_TREE = 100_000
"""At most this many runs of one tree are listed."""

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


def _print(out: Console, line: str, style: str = "") -> None:
    out.print(Text(line, style=style), overflow="ignore", crop=False, soft_wrap=True)


def _info_of(state: State, tree: Sequence[RunInfo]) -> RunInfo:
    found = next((info for info in tree if info.id == state.id), None)
    if found is not None:
        return found
    return RunInfo(
        id=state.id,
        agent=state.agent,
        status=state.status,
        first_message=state.first_message,
        created_at=state.created_at,
        updated_at=state.updated_at,
        turn=state.turn,
        parent_id=state.parent_id,
        root_id=state.root_id or state.id,
        lease_owner=None,
        lease_expires_at=None,
    )


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
        _print(out, f"no runs in {store_url(store)} (it does not exist yet)")
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
        _print(out, f"no {which}runs in {store_url(store)}")
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
    tree = runs.list(root_id=state.root_id or state.id, limit=_TREE)
    info = _info_of(state, tree)
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
        _print(out, f"subagent run of {names.short(state.parent_id)} (call {state.parent_call_id}){of_root}")
    lines = timeline_lines(state.history, tz=tz, width=_width(out), name=names.short)
    _print(out, lines[0], "dim")
    for line in lines[1:]:
        _print(out, line, "dim" if _DATE_LINE.match(line) else "")
    out.print()
    status_line = Text.assemble("status: ", (display_status(state.status, holder is not None), ""))
    status_line.stylize(STATUS_STYLES.get(state.status, ""), len("status: "))
    if holder is not None:
        status_line.append(f" (held by {holder.describe()})")
    out.print(status_line)
    if state.answer is not None:
        _print(out, f"answer: {truncate(state.answer, 200)}")
    elif state.reason:
        _print(out, f"reason: {truncate(without_fix(state.reason), 200)}")
    if below:
        _print(out, "subagent runs:")
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
        _print(out, line)
    if state.status == "running" and holder is None and state.parent_id is None:
        _print(
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
    names = names_for(runs, runs.list(root_id=runs.load(found).root_id or found, limit=_TREE))
    try:
        asyncio.run(_follow(runs, found, out, names, _zone(utc), as_json, store_flag(runs, store)))
    except KeyboardInterrupt:
        if not as_json:
            _print(out, f"stopped following run {names.short(found)}; it goes on", "dim")
        raise typer.Exit(130) from None


async def _follow(
    runs: Store, run_id: str, out: Console, names: ids.Names, tz: tzinfo | None, as_json: bool, flag: str
) -> None:
    state = State(id=run_id)
    timeline = Timeline(tz=tz, width=_width(out), name=names.short)
    short = names.short(run_id)
    if not as_json:
        _print(
            out, f"following run {short}: entries as they are journaled, until it stops (Ctrl+C: stop)", "dim"
        )
        loaded = runs.load(run_id)
        root = loaded.root_id or run_id
        if loaded.status == "running" and runs.holder(root) is None:
            agent = loaded.agent if root == run_id else None
            hint = resume_hint(names.short(root), agent, flag)
            _print(out, f"no process drives it now; it goes on when one does: {hint}, or a worker", "dim")
        _print(out, timeline.header(), "dim")
    told: str | None = None
    async for entry in runs.follow(run_id):
        state.apply(entry)
        if as_json:
            typer.echo(json.dumps(j.entry_to_dict(entry), default=str))
            continue
        for line in timeline.lines(entry):
            _print(out, line, "dim" if _DATE_LINE.match(line) else "")
        waiting = state.status == "waiting" and entry.kind in (
            "run_released",
            "approval_requested",
            "child_waiting",
        )
        if waiting and told != "waiting":
            told = "waiting"
            _print(out, "  it waits for a decision, and goes on once one is made:", "dim")
            for pending in state.pending_approvals:
                for text in decide_lines(names.short(pending.run_id or run_id), pending.call_id, flag):
                    _print(out, f"  {text}", "dim")
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
# tether cancel


@app.command()
@friendly_errors
def cancel(
    run_id: Annotated[str, typer.Argument(metavar="ID", help="The run's id, or a short form of it.")],
    by: ByOption = None,
    store: StoreOption = DEFAULT_STORE,
) -> None:
    """Cancel a run (and its subagent runs).

    If no process drives the run, the cancel is journaled now and the run is cancelled. Otherwise it is
    posted to the run's inbox, and the driving process stops the run within its poll interval. A run that
    is already completed or cancelled is left as it is: nothing is written.
    """
    runs = require_store(store)
    found = resolve_run(runs, run_id, store)
    who = decider(by)
    before = runs.load(found)
    root = before.root_id or found
    tree = runs.list(root_id=root, limit=_TREE)
    info = _info_of(before, tree)
    names = names_for(runs, tree)
    short, root_short = names.short(found), names.short(root)
    flag = store_flag(runs, store)
    out = console()
    if before.status in j.FINAL_STATUSES and not info.unconsumed:
        _print(out, f"run {short} is already {before.status}: nothing to cancel, nothing written")
        return
    try:
        after = runs.cancel(found, by=who)
    except RunBusyError:
        after = None
    if after is None and root != found:
        _print(out, f"run {short} is a subagent run of {root_short}: the cancel was posted to its inbox.")
        holder = runs.holder(root)
        if holder is not None:
            _print(
                out,
                f"run {root_short} is driven by {holder.describe()}; it journals the cancel within its poll interval",
            )
        else:
            root_agent = next((i.agent for i in tree if i.id == root), None)
            _print(
                out,
                f"run {root_short} is not being driven. Fix: {resume_hint(root_short, root_agent, flag)}, or start a worker",
            )
        return
    if after is None:
        holder = runs.holder(found)
        who_holds = holder.describe() if holder is not None else "another process"
        _print(out, f"run {short} is driven by {who_holds}.")
        _print(
            out, "The cancel was posted to its inbox: that process stops the run within its poll interval."
        )
        _print(out, f"Check with: tether show {short}{flag}", "dim")
        return
    if after.status == "cancelled" and before.status != "cancelled":
        out.print(
            Text.assemble(
                "run ", short, " is ", ("cancelled", "magenta"), f" (journaled at seq {after.stopped_seq})"
            ),
            overflow="ignore",
            crop=False,
        )
    else:
        _print(out, f"run {short} is {after.status}: the cancel was journaled and changed nothing")


# --------------------------------------------------------------------------------------------------
# tether rm, prune, fork

ChildrenOption = Annotated[
    bool, typer.Option("--children", "-r", help="Also delete the subagent runs (each tree goes whole).")
]
DryRunOption = Annotated[bool, typer.Option("--dry-run", "-n", help="Only list what would be deleted.")]


def _tree_of(runs: Store, run_id: str) -> list[RunInfo]:
    return [info for info in runs.list(root_id=run_id, limit=_TREE) if info.id != run_id]


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'s' if count != 1 else ''}"


@app.command("rm")
@friendly_errors
def rm(
    run_ids: Annotated[
        list[str] | None, typer.Argument(metavar="[ID]...", help="The runs (ids, or short forms of them).")
    ] = None,
    children: ChildrenOption = False,
    status: Annotated[
        str | None,
        typer.Option(
            "--status", metavar="STATUS", help="Delete every root run with this status (asks first)."
        ),
    ] = None,
    agent: Annotated[
        str | None,
        typer.Option("--agent", metavar="NAME", help="Delete every root run of this agent (asks first)."),
    ] = None,
    older_than: Annotated[
        str | None,
        typer.Option(
            "--older-than", metavar="AGE", help="Delete every root run last updated longer ago (asks first)."
        ),
    ] = None,
    yes: Annotated[
        bool, typer.Option("--yes", "-y", help="Do not ask before deleting what filters select.")
    ] = False,
    dry_run: DryRunOption = False,
    store: StoreOption = DEFAULT_STORE,
) -> None:
    """Delete runs: their journals and inboxes. Held runs are refused.

    Give run ids, or filters (--status, --agent, --older-than): the runs they select are listed and you
    are asked to confirm (--yes does not ask). A run with subagent runs needs --children (-r), and then
    goes with its whole tree; a subagent run is deleted through its root.
    """
    filters = status is not None or agent is not None or older_than is not None
    if run_ids and filters:
        fail(
            "rm takes run ids or filters, not both",
            "tether rm ID... or tether rm --status S --older-than AGE",
        )
    if not run_ids and not filters:
        fail(
            "rm needs run ids or filters",
            "tether rm ID..., or e.g. tether rm --status failed --older-than 7d",
        )
    if status is not None and status not in STATUSES:
        fail(f"status {status!r} is not known", f"use one of {', '.join(STATUSES)}")
    runs = require_store(store)
    out = console()
    if run_ids:
        chosen = list(dict.fromkeys(resolve_run(runs, text, store) for text in run_ids))
        trees = {run_id: _tree_of(runs, run_id) for run_id in chosen}
        names = names_for(runs, *trees.values())
        for run_id in chosen:
            state = runs.load(run_id)
            if state.parent_id is not None:
                root = names.short(state.root_id or state.parent_id)
                fail(
                    f"run {names.short(run_id)} is a subagent run of {names.short(state.parent_id)}; it goes with its tree",
                    f"tether rm {root} --children",
                )
            holder = runs.holder(run_id)
            if holder is not None:
                fail(
                    f"run {names.short(run_id)} is driven by {holder.describe()}",
                    f"wait for it, or tether cancel {names.short(run_id)}",
                )
            if trees[run_id] and not children:
                fail(
                    f"run {names.short(run_id)} has {_plural(len(trees[run_id]), 'subagent run')}",
                    f"tether rm {' '.join(names.short(r) for r in chosen)} --children",
                )
        if dry_run:
            _print(out, f"would delete {_plural(len(chosen), 'run')} (dry run: nothing deleted):")
            for run_id in chosen:
                more = f" and its {_plural(len(trees[run_id]), 'subagent run')}" if trees[run_id] else ""
                _print(out, f"  {names.short(run_id)}{more}")
            return
        for run_id in chosen:
            runs.delete(run_id, children=children)
            more = f" and its {_plural(len(trees[run_id]), 'subagent run')}" if trees[run_id] else ""
            _print(out, f"deleted run {names.short(run_id)}{more}")
        return
    cutoff = datetime.now(UTC) - parse_duration(older_than) if older_than is not None else None
    picked, skipped = _select(runs, status, agent, cutoff, children)
    names = names_for(runs, [info for info, _ in picked], *[tree for _, tree in picked])
    if not picked:
        _print(out, "no runs to delete")
        _skipped_lines(out, skipped)
        return
    count = sum(1 + len(tree) for _, tree in picked)
    _print(out, f"{'would delete' if dry_run else 'deletes'} {_plural(count, 'run')}:")
    for info, tree in picked:
        more = f" and its {_plural(len(tree), 'subagent run')}" if tree else ""
        _print(out, f"  {names.short(info.id)}  {info.agent or '-'}  {info.status}{more}")
    _skipped_lines(out, skipped)
    if dry_run:
        _print(out, "dry run: nothing deleted")
        return
    if not yes:
        try:
            agreed = typer.confirm(f"Delete {_plural(count, 'run')}?", default=False)
        except typer.Abort:
            _print(out, "no answer: nothing deleted")
            raise typer.Exit(EXIT_FAILED) from None
        if not agreed:
            _print(out, "nothing deleted")
            return
    gone = 0
    for info, tree in picked:
        try:
            runs.delete(info.id, children=bool(tree))
        except (RunBusyError, ValueError, KeyError) as exc:
            _print(out, f"kept run {names.short(info.id)}: {without_fix(str(exc))}")
            continue
        gone += 1 + len(tree)
    _print(out, f"deleted {_plural(gone, 'run')}")


def _select(
    runs: Store, status: str | None, agent: str | None, cutoff: datetime | None, children: bool
) -> tuple[list[tuple[RunInfo, list[RunInfo]]], dict[str, int]]:
    """The root runs that rm's filters select (with their trees), and how many were skipped, by reason."""
    picked: list[tuple[RunInfo, list[RunInfo]]] = []
    skipped: dict[str, int] = {}
    cursor: str | None = None
    while True:
        page, cursor = runs.list_page(
            status=status, agent=agent, updated_before=cutoff, limit=500, cursor=cursor
        )
        for info in page:
            if info.parent_id is not None or any(info.id == p.id for p, _ in picked):
                continue
            tree = _tree_of(runs, info.id)
            if info.lease_owner is not None or any(run.lease_owner for run in tree):
                skipped["held"] = skipped.get("held", 0) + 1
            elif tree and not children:
                skipped["children"] = skipped.get("children", 0) + 1
            else:
                picked.append((info, tree))
        if cursor is None:
            return picked, skipped


_SKIP_REASONS = {
    "children": "have subagent runs: add --children (-r) to delete each whole tree",
    "held": "are held by a process that drives them: they are kept",
    "inbox": "have inbox items not journaled yet, which may reopen them (a resume or a worker journals them)",
    "open": "have a subagent run that is not stopped, or is held",
}


def _skipped_lines(out: Console, skipped: dict[str, int]) -> None:
    total = sum(skipped.values())
    if not total:
        return
    _print(out, f"skipped {_plural(total, 'run')} that match:")
    for reason, count in skipped.items():
        _print(out, f"  {count} {_SKIP_REASONS[reason]}")


@app.command()
@friendly_errors
def prune(
    older_than: Annotated[
        str,
        typer.Option(
            "--older-than", metavar="AGE", help="Only runs last updated longer ago: 30d, 12h, 90m, 0s."
        ),
    ],
    status: Annotated[
        str,
        typer.Option("--status", metavar="S,S", help="Which stopped runs may go (comma-separated)."),
    ] = "completed,cancelled,failed,stopped",
    children: Annotated[
        bool,
        typer.Option("--children", "-r", help="Also prune runs with subagent runs (each tree goes whole)."),
    ] = False,
    dry_run: DryRunOption = False,
    store: StoreOption = DEFAULT_STORE,
) -> None:
    """Delete old stopped runs that no one holds, and say which were kept and why.

    Only completed, cancelled, failed or stopped runs (as --status allows) last updated before the cutoff,
    with nothing unconsumed in their inbox. Held runs are kept. Runs with subagent runs go only with
    --children (-r), and a subagent run never goes while its root is kept.
    """
    age = parse_duration(older_than)
    statuses = [s.strip() for s in status.split(",") if s.strip()]
    runs = open_cli_store(store, missing_ok=True)
    cutoff = datetime.now(UTC) - age
    gone = (
        runs.prune(cutoff, statuses=statuses, children=children, dry_run=dry_run) if runs is not None else []
    )
    skipped = _prune_skipped(runs, statuses, cutoff, set(gone), children) if runs is not None else {}
    out = console()
    which = f"{'/'.join(statuses)} and updated more than {older_than} ago"
    names = names_for(runs) if runs is not None else ids.Names(gone, complete=False)
    if not gone:
        _print(out, f"no runs to prune: none is {which}" if not skipped else f"nothing pruned ({which}):")
    else:
        noun = _plural(len(gone), "run")
        _print(out, f"would delete {noun} (dry run: nothing deleted):" if dry_run else f"deleted {noun}:")
        for run_id in gone:
            _print(out, f"  {names.short(run_id) if dry_run else run_id}")
    _skipped_lines(out, skipped)


def _prune_skipped(
    runs: Store, statuses: Sequence[str], cutoff: datetime, gone: set[str], children: bool
) -> dict[str, int]:
    """The root runs prune's age and statuses select that it kept, counted by why (``Store.prune``'s rules)."""
    skipped: dict[str, int] = {}
    cursor: str | None = None
    while True:
        page, cursor = runs.list_page(updated_before=cutoff, limit=500, cursor=cursor)
        for info in page:
            if info.parent_id is not None or info.id in gone or info.status not in statuses:
                continue
            tree = _tree_of(runs, info.id)
            if info.lease_owner is not None:
                reason = "held"
            elif info.unconsumed:
                reason = "inbox"
            elif tree and not children:
                reason = "children"
            elif tree and any(run.lease_owner or run.status not in j.STOP_STATUSES for run in tree):
                reason = "open"
            else:
                continue  # updated meanwhile, or deleted by another prune
            skipped[reason] = skipped.get(reason, 0) + 1
        if cursor is None:
            return skipped


@app.command()
@friendly_errors
def fork(
    run_id: Annotated[str, typer.Argument(metavar="ID", help="The run to fork (an id, or a short form).")],
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
    source = resolve_run(runs, run_id, store)
    state = runs.load(source)
    if state.parent_id is not None:
        root = state.root_id or state.parent_id
        fail(
            f"run {source} is a subagent run of {state.parent_id}; a tree is forked from its root",
            f"tether fork {root}",
        )
    if new_id is not None and runs.exists(j.validate_run_id(new_id)):
        fail(f"run {new_id} already exists", "pass another --id, or leave --id out for a new one")
    made = runs.fork(source, at_seq=at, new_id=new_id)
    fork_state = runs.load(made)
    started = fork_state.history[0]
    boundary = started.forked_from["seq"] if isinstance(started, j.RunStarted) and started.forked_from else 0
    rounded = (
        f" (seq {at} rounded down to the turn ending at seq {boundary})"
        if at is not None and at != boundary
        else ""
    )
    out = console()
    names = names_for(runs)
    _print(
        out,
        f"forked run {names.short(source)} at seq {boundary} as {names.short(made)}{rounded}; it is {fork_state.status}",
    )
    _print(
        out,
        f"Continue it: {resume_hint(names.short(made), fork_state.agent, store_flag(runs, store))}",
        "dim",
    )


# --------------------------------------------------------------------------------------------------

from . import agents as agents  # noqa: E402  (registers run, resume, approve, deny)
from . import ui as ui  # noqa: E402  (registers ui, the run inspector)
from . import workers as workers  # noqa: E402  (registers submit, worker, db migrate, crashtest)


def main() -> None:
    """The console-script entry point (``tether``)."""
    app()


if __name__ == "__main__":
    main()
