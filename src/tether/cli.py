"""The ``tether`` command: look at runs, cancel them, and watch the crash-and-resume demo.

Built with typer and rich; this is the only module that imports them, and ``import tether`` never
imports it. Every command takes ``--store URL`` (default: ``$TETHER_STORE``, else ``DEFAULT_STORE``). Bad
input prints one line, ``error: what went wrong. Fix: what to do``, on stderr and exits with code 2.
"""

from __future__ import annotations

import dataclasses
import functools
import getpass
import json
import os
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, NoReturn, ParamSpec, TypeVar

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from . import journal as j
from ._timeline import display_status, open_state_lines, timeline_lines, truncate
from .errors import RunBusyError, TetherError
from .state import State
from .stores import RunInfo, Store, open_store

__all__ = ["DEFAULT_STORE", "STORE_ENV", "app", "main"]

DEFAULT_STORE = "file:.tether/runs"
"""The store used when neither ``--store`` nor ``$TETHER_STORE`` names one."""

STORE_ENV = "TETHER_STORE"
"""The environment variable holding the default store URL."""

EXIT_BAD_INPUT = 2
STATUSES = ("running", "waiting", "completed", "failed", "cancelled", "stopped")

app = typer.Typer(
    name="tether",
    help="Durable LLM agent runs: every step journaled, any process resumes, no tool runs twice.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _console(*, stderr: bool = False) -> Console:
    """A console on the current stdout (or stderr); wide when it is not a terminal, so ids are never cut."""
    console = Console(stderr=stderr, highlight=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = 500
    return console


StoreOption = Annotated[
    str,
    typer.Option(
        "--store",
        envvar=STORE_ENV,
        metavar="URL",
        help=f"Where runs are kept: file:PATH, memory:, ... [env {STORE_ENV}; default {DEFAULT_STORE}]",
        show_default=False,
        show_envvar=False,
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]

P = ParamSpec("P")
R = TypeVar("R")


def fail(message: str) -> NoReturn:
    """Print ``error: message`` on stderr (with a Fix when the message has none) and exit with code 2."""
    if "Fix:" not in message:
        message = f"{message.rstrip('.')}. Fix: check the command's arguments (tether --help)"
    _console(stderr=True).print(Text(f"error: {message}", style="red"), soft_wrap=True)
    raise typer.Exit(EXIT_BAD_INPUT)


def _message(exc: BaseException) -> str:
    if isinstance(exc, KeyError) and type(exc).__str__ is KeyError.__str__ and exc.args:
        return str(exc.args[0])  # a plain KeyError quotes its message
    return str(exc) or type(exc).__name__


def friendly_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Turn tether's errors and bad input into ``fail(...)``: one line on stderr, exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except (TetherError, ValueError, KeyError) as exc:
            fail(_message(exc))
        except OSError as exc:
            where = f" ({exc.filename})" if exc.filename else ""
            fail(f"{exc.strerror or exc}{where}. Fix: check the store path and its permissions")

    return wrapper


def _file_folder(url: str) -> Path | None:
    """The folder of a ``file:`` store URL (None for other stores)."""
    if not url.startswith("file:"):
        return None
    rest = url[len("file:") :]
    path = rest[2:] if rest.startswith("//") else rest
    return Path(path) if path else None


def _open(url: str | None, *, missing_ok: bool = False) -> Store | None:
    """The store at ``url``; looking creates nothing, so a file store's folder must exist.

    Args:
        url: the store URL (None: ``DEFAULT_STORE``).
        missing_ok: return None, instead of raising, for a file store whose folder does not exist yet.

    Raises:
        ValueError: the URL is bad, or names a folder that does not exist.
    """
    url = url if url is not None else DEFAULT_STORE
    folder = _file_folder(url)
    if folder is not None and not folder.is_dir():
        if missing_ok and not folder.exists():
            return None
        problem = "is not a folder" if folder.exists() else "does not exist"
        raise ValueError(
            f"store folder {folder} {problem}, so it holds no runs. Fix: pass --store file:PATH (or set "
            f"{STORE_ENV}) to the folder your agent's FileStore writes"
        )
    return open_store(url)


def _require(url: str | None) -> Store:
    store = _open(url)
    assert store is not None
    return store


# --------------------------------------------------------------------------------------------------
# tether demo


_DEMO_STYLES = {"heading": "bold", "ok": "bold green", "error": "bold red", "dim": "dim"}


@app.command()
@friendly_errors
def demo(
    store: Annotated[
        str | None,
        typer.Option("--store", metavar="URL", help="Keep the demo run here (default: a temporary folder)."),
    ] = None,
) -> None:
    """Crash a run with SIGKILL, resume it elsewhere: the tool runs once.

    A scripted weather agent starts a run in a child process, which is killed right after its tool's result
    is saved; a second process resumes the run. The journal is shown at each step, and a side file outside
    the store counts the tool's executions. Exits 1 if the tool did not run exactly once.
    """
    from ._demo import run_demo

    out = _console()

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


_STATUS_STYLES = {
    "completed": "green",
    "running": "cyan",
    "waiting": "yellow",
    "failed": "red",
    "cancelled": "magenta",
    "stopped": "yellow",
}


@app.command("ls")
@friendly_errors
def ls(
    status: Annotated[
        str | None, typer.Option("--status", help=f"Only runs with this status: {', '.join(STATUSES)}.")
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
    opened = _open(store, missing_ok=True)
    runs = opened.list(status=status, limit=limit) if opened is not None else []
    out = _console()
    if as_json:
        typer.echo(json.dumps([_info_dict(info) for info in runs], indent=2, default=str))
        return
    if not runs:
        which = f"{status} " if status else ""
        missing = "" if opened is not None else " (its folder does not exist yet)"
        out.print(Text(f"no {which}runs in {store}{missing}"))
        return
    now = datetime.now(UTC)
    rows = [
        (info.id, info.agent or "-", info.display_status, str(info.turn), _age(info.updated_at, now))
        for info in runs
    ]
    headers = ("id", "agent", "status", "turn", "updated")
    fixed = sum(max(len(h), *(len(row[i]) for row in rows)) + 2 for i, h in enumerate(headers))
    room = min(out.width - fixed, 60)  # the first message gets what is left of the line
    table = Table(box=None, pad_edge=False, header_style="bold")
    for header in headers:
        table.add_column(header, no_wrap=True, justify="right" if header == "turn" else "left")
    if room >= 12:
        table.add_column("first message", no_wrap=True, overflow="ellipsis")
    for info, row in zip(runs, rows, strict=True):
        cells: list[str | Text] = [*row]
        cells[2] = Text(row[2], style=_STATUS_STYLES.get(info.status, ""))
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
    runs = _require(store)
    state = runs.load(j.validate_run_id(run_id))
    holder = runs.holder(run_id)
    if as_json:
        typer.echo(json.dumps(_show_json(state, holder is not None), indent=2, default=str))
        return
    status = display_status(state.status, holder is not None)
    out = _console()
    out.print(Text.assemble(("run ", "bold"), (state.id, "bold"), f"  agent {state.agent or '-'}"))
    lines = timeline_lines(state.history)
    out.print(Text(lines[0], style="dim"), overflow="ignore", crop=False)
    for line in lines[1:]:
        out.print(Text(line), overflow="ignore", crop=False)
    out.print()
    status_line = Text.assemble("status: ", (status, _STATUS_STYLES.get(state.status, "")))
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
# tether cancel


def _whoami() -> str | None:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return None


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
    runs = _require(store)
    j.validate_run_id(run_id)
    before = runs.load(run_id)
    try:
        after = runs.cancel(run_id, by=by if by is not None else _whoami())
    except RunBusyError:
        after = None
    out = _console()
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


# --------------------------------------------------------------------------------------------------


def main() -> None:
    """The console-script entry point (``tether``)."""
    app()


if __name__ == "__main__":
    main()
