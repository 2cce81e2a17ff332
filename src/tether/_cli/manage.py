"""``tether cancel``, ``rm``, ``prune`` and ``fork``: the commands that end, delete and copy runs."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Annotated

import typer
from rich.console import Console
from rich.text import Text

from .. import journal as j
from .._timeline import (
    without_fix,
)
from ..errors import RunBusyError
from ..stores import RunInfo, Store
from . import ids
from .common import (
    DEFAULT_STORE,
    EXIT_FAILED,
    STATUSES,
    TREE_LIMIT,
    ByOption,
    StoreOption,
    app,
    console,
    decider,
    fail,
    friendly_errors,
    info_of,
    names_for,
    open_cli_store,
    parse_duration,
    print_line,
    require_store,
    resolve_run,
    resume_hint,
    store_flag,
)

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
    tree = runs.list(root_id=root, limit=TREE_LIMIT)
    info = info_of(before, tree)
    names = names_for(runs, tree)
    short, root_short = names.short(found), names.short(root)
    flag = store_flag(runs, store)
    out = console()
    if before.status in j.FINAL_STATUSES and not info.unconsumed:
        print_line(out, f"run {short} is already {before.status}: nothing to cancel, nothing written")
        return
    try:
        after = runs.cancel(found, by=who)
    except RunBusyError:
        after = None
    if after is None and root != found:
        print_line(out, f"run {short} is a subagent run of {root_short}: the cancel was posted to its inbox.")
        holder = runs.holder(root)
        if holder is not None:
            print_line(
                out,
                f"run {root_short} is driven by {holder.describe()}; it journals the cancel within its poll interval",
            )
        else:
            root_agent = next((i.agent for i in tree if i.id == root), None)
            print_line(
                out,
                f"run {root_short} is not being driven. Fix: {resume_hint(root_short, root_agent, flag)}, or start a worker",
            )
        return
    if after is None:
        holder = runs.holder(found)
        who_holds = holder.describe() if holder is not None else "another process"
        print_line(out, f"run {short} is driven by {who_holds}.")
        print_line(
            out, "The cancel was posted to its inbox: that process stops the run within its poll interval."
        )
        print_line(out, f"Check with: tether show {short}{flag}", "dim")
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
        print_line(out, f"run {short} is {after.status}: the cancel was journaled and changed nothing")


# --------------------------------------------------------------------------------------------------
# tether rm, prune, fork

ChildrenOption = Annotated[
    bool, typer.Option("--children", "-r", help="Also delete the subagent runs (each tree goes whole).")
]
DryRunOption = Annotated[bool, typer.Option("--dry-run", "-n", help="Only list what would be deleted.")]


def _tree_of(runs: Store, run_id: str) -> list[RunInfo]:
    return [info for info in runs.list(root_id=run_id, limit=TREE_LIMIT) if info.id != run_id]


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
            print_line(out, f"would delete {_plural(len(chosen), 'run')} (dry run: nothing deleted):")
            for run_id in chosen:
                more = f" and its {_plural(len(trees[run_id]), 'subagent run')}" if trees[run_id] else ""
                print_line(out, f"  {names.short(run_id)}{more}")
            return
        for run_id in chosen:
            runs.delete(run_id, children=children)
            more = f" and its {_plural(len(trees[run_id]), 'subagent run')}" if trees[run_id] else ""
            print_line(out, f"deleted run {names.short(run_id)}{more}")
        return
    cutoff = datetime.now(UTC) - parse_duration(older_than) if older_than is not None else None
    picked, skipped = _select(runs, status, agent, cutoff, children)
    names = names_for(runs, [info for info, _ in picked], *[tree for _, tree in picked])
    if not picked:
        print_line(out, "no runs to delete")
        _skipped_lines(out, skipped)
        return
    count = sum(1 + len(tree) for _, tree in picked)
    print_line(out, f"{'would delete' if dry_run else 'deletes'} {_plural(count, 'run')}:")
    for info, tree in picked:
        more = f" and its {_plural(len(tree), 'subagent run')}" if tree else ""
        print_line(out, f"  {names.short(info.id)}  {info.agent or '-'}  {info.status}{more}")
    _skipped_lines(out, skipped)
    if dry_run:
        print_line(out, "dry run: nothing deleted")
        return
    if not yes:
        try:
            agreed = typer.confirm(f"Delete {_plural(count, 'run')}?", default=False)
        except typer.Abort:
            print_line(out, "no answer: nothing deleted")
            raise typer.Exit(EXIT_FAILED) from None
        if not agreed:
            print_line(out, "nothing deleted")
            return
    gone = 0
    for info, tree in picked:
        try:
            runs.delete(info.id, children=bool(tree))
        except (RunBusyError, ValueError, KeyError) as exc:
            print_line(out, f"kept run {names.short(info.id)}: {without_fix(str(exc))}")
            continue
        gone += 1 + len(tree)
    print_line(out, f"deleted {_plural(gone, 'run')}")


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
    print_line(out, f"skipped {_plural(total, 'run')} that match:")
    for reason, count in skipped.items():
        print_line(out, f"  {count} {_SKIP_REASONS[reason]}")


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
        print_line(out, f"no runs to prune: none is {which}" if not skipped else f"nothing pruned ({which}):")
    else:
        noun = _plural(len(gone), "run")
        print_line(out, f"would delete {noun} (dry run: nothing deleted):" if dry_run else f"deleted {noun}:")
        for run_id in gone:
            print_line(out, f"  {names.short(run_id) if dry_run else run_id}")
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
    print_line(
        out,
        f"forked run {names.short(source)} at seq {boundary} as {names.short(made)}{rounded}; it is {fork_state.status}",
    )
    print_line(
        out,
        f"Continue it: {resume_hint(names.short(made), fork_state.agent, store_flag(runs, store))}",
        "dim",
    )


# --------------------------------------------------------------------------------------------------
