"""``tether submit``, ``worker``, ``db migrate`` and ``crashtest``: runs for workers, and proving recovery."""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.text import Text

from ..stores import open_store
from .agents import AgentArgument, AgentStoreOption, with_store
from .common import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    STORE_ENV,
    STORE_HELP,
    app,
    console,
    fail,
    friendly_errors,
    load_agent,
    store_url,
)

if TYPE_CHECKING:
    from .._harness.crash.crash_test import CrashReport

__all__ = ["crashtest", "db_migrate", "run_crashtest", "submit", "worker"]


@app.command()
@friendly_errors
def submit(
    agent_spec: AgentArgument,
    prompt: Annotated[str, typer.Argument(metavar="PROMPT", help="The run's first message.")],
    run_id: Annotated[
        str | None, typer.Option("--id", metavar="ID", help="The run's id (default: a new one).")
    ] = None,
    store: AgentStoreOption = None,
) -> None:
    """Create a run that no process drives yet, and print its id: a worker (tether worker) picks it up."""
    agent = load_agent(agent_spec)
    with_store(agent, store, must_exist=False)
    typer.echo(agent.submit(prompt, id=run_id).id)


@app.command()
@friendly_errors
def worker(
    agent_specs: Annotated[
        list[str],
        typer.Argument(
            metavar="AGENT...",
            help="The Agents whose runs it drives: module:attribute or path/file.py:attribute.",
        ),
    ],
    store: AgentStoreOption = None,
    concurrency: Annotated[int, typer.Option("--concurrency", "-c", min=1, help="Runs driven at once.")] = 4,
    lease_ttl: Annotated[
        float | None,
        typer.Option(
            "--lease-ttl", metavar="S", min=0.5, help="Lease length in seconds (default: the store's)."
        ),
    ] = None,
    poll_interval: Annotated[
        float,
        typer.Option(
            "--poll-interval", metavar="S", min=0.05, help="Seconds between claims when nothing wakes it."
        ),
    ] = 2.0,
) -> None:
    """Claim runs of these agents that need work and drive them, until SIGTERM or Ctrl+C.

    Wakes on PostgreSQL LISTEN/NOTIFY and polls too; logs a line per claim and per stop on stderr. On
    SIGTERM it stops claiming, closes its steps, saves and releases every run it holds, then exits 0.
    """
    import logging

    from ..worker import Worker

    agents = [load_agent(spec) for spec in agent_specs]
    runs = with_store(agents[0], store, must_exist=False)
    for agent in agents[1:]:
        agent.store = runs
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    made = Worker(agents, runs, concurrency=concurrency, lease_ttl=lease_ttl, poll_interval=poll_interval)
    try:
        made.run(install_signal_handlers=True)
    except KeyboardInterrupt:  # the drives were closed and released before this is raised
        raise typer.Exit(130) from None
    finally:
        runs.close()


db_app = typer.Typer(
    name="db",
    help="A store's database schema.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
)
app.add_typer(db_app, name="db")


@db_app.command("migrate")
@friendly_errors
def db_migrate(
    store: Annotated[
        str | None,
        typer.Option("--store", "-s", envvar=STORE_ENV, metavar="URL", help=STORE_HELP, show_envvar=False),
    ] = None,
    move_from: Annotated[
        str | None,
        typer.Option(
            "--move-from",
            metavar="SCHEMA",
            help="First move tether's tables out of this PostgreSQL schema (e.g. public, where a tether before "
            "schemas kept them) into the store's (?schema=NAME, default tether), in the same transaction.",
        ),
    ] = None,
) -> None:
    """Create or upgrade the store's schema: PostgreSQL's (a SQLite file is migrated whenever it is opened).

    Needs --store (or $TETHER_STORE): the database to migrate, e.g. --store postgresql://USER@HOST/DB, or
    postgresql://USER@HOST/DB?schema=NAME for tables in schema NAME (default: tether).
    """
    if store is None:
        fail(
            "db migrate needs the store whose schema to create or upgrade",
            f"tether db migrate --store postgresql://USER@HOST/DB (or set {STORE_ENV})",
        )
    runs = open_store(store_url(store))
    try:
        migrate = getattr(runs, "migrate", None)
        if move_from is not None and not callable(migrate):
            fail(f"--move-from moves PostgreSQL tables; {runs.identity} has none",
                 "drop --move-from, or pass --store postgresql://USER@HOST/DB")  # fmt: skip
        version = (migrate(move_from=move_from) if move_from else migrate()) if callable(migrate) else None
        done = (
            f"tether schema {version}"
            if version is not None
            else "nothing to migrate: this store migrates itself whenever it is opened"
        )
        console().print(Text(f"{runs.identity}: {done}"), overflow="ignore", crop=False)
    finally:
        runs.close()


@app.command()
def crashtest(
    agent: AgentArgument,
    prompt: Annotated[str, typer.Argument(metavar="PROMPT", help="The prompt each run starts with.")],
    points: Annotated[
        list[str] | None,
        typer.Option(
            "--points",
            "-p",
            metavar="POINT[,POINT]",
            help="Failpoints to try at each boundary: before_append, after_append, torn_append (default: all).",
        ),
    ] = None,
    approve: Annotated[
        str | None,
        typer.Option(
            "--approve",
            metavar="all",
            help="all: approve every call that asks for approval, so the runs go past their approvals.",
        ),
    ] = None,
    store: Annotated[
        str | None,
        typer.Option(
            "--store",
            "-s",
            metavar="URL",
            help="Keep the runs in this store (default: a temporary SQLite file, deleted unless an "
            "invariant broke).",
        ),
    ] = None,
) -> None:
    """Kill AGENT's run at every journal boundary, resume it in new processes, check the invariants.

    The runs go to a temporary store unless --store is given. A run that stops to wait for a decision has
    ended (nobody answers); --approve all answers every approval, so the boundaries after it are tested too.
    Exits 1 when an invariant breaks, 2 on bad input.
    """
    raise typer.Exit(run_crashtest(agent, prompt, points or [], approve, store))


def run_crashtest(agent: str, prompt: str, points: list[str], approve: str | None, store: str | None) -> int:
    """``tether crashtest``: print the report and what its ends mean; the exit code (0, 1, or 2)."""
    from .._harness.crash.crash_test import POINTS, CrashCase, InvariantViolation, crash_test

    chosen = tuple(p.strip() for item in points for p in item.split(",") if p.strip()) or POINTS
    if approve is not None and approve != "all":
        return _bad(f"--approve {approve} is not known. Fix: pass --approve all, or leave it out")
    unknown = [point for point in chosen if point not in POINTS]
    if unknown:
        return _bad(f"failpoints {unknown} are not known. Fix: use some of {', '.join(POINTS)}")
    if store is not None and store.strip().startswith("memory:"):
        return _bad(
            "a memory: store lives in one process, and the crash test runs many. Fix: pass --store runs.db, "
            "or leave --store out for a temporary one"
        )
    workdir = Path(tempfile.mkdtemp(prefix="tether-crashtest-")) if store is None else None
    url = f"sqlite:///{workdir / 'runs.db'}" if workdir is not None else store_url(store or "")
    where = " (a temporary store; --store URL keeps the runs)" if workdir is not None else ""
    print(f"crash test of {agent}: runs in {url}{where}", file=sys.stderr, flush=True)

    def progress(case: CrashCase) -> None:
        mark = "ok" if not case.violations else f"{len(case.violations)} violations"
        reached = "" if case.died else " (not reached)"
        print(
            f"  {case.point} at seq {case.seq}: {case.status}{reached}, {mark}", file=sys.stderr, flush=True
        )

    keep = False
    try:
        try:
            report: CrashReport = crash_test(
                agent, prompt, store_url=url, points=chosen, on_case=progress, approve=approve
            )
            code = 0
        except InvariantViolation as exc:
            report, code, keep = exc.report, EXIT_FAILED, True
        except (ValueError, RuntimeError, OSError) as exc:
            return _bad(str(exc) if "Fix:" in str(exc) else f"{exc}. Fix: check the command's arguments")
        print(report)
        for note in _waiting_notes(report, agent, prompt, approve):
            print(note)
        if keep and workdir is not None:
            print(f"the runs are kept in {url}: tether show RUN_ID --store {url}")
        return code
    finally:
        if workdir is not None and not keep:
            shutil.rmtree(workdir, ignore_errors=True)


def _bad(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return EXIT_BAD_INPUT


def _waiting_notes(report: CrashReport, agent: str, prompt: str, approve: str | None) -> list[str]:
    """What a run that ended ``waiting`` means, for the baseline and for the crashed cases."""
    again = f"tether crashtest {agent} {_quoted(prompt)} --approve all"
    notes: list[str] = []
    base = report.baseline
    if base is not None and base.status == "waiting":
        notes.append(
            "waiting: without a crash the run stops to wait for a decision on an approval, and a run waiting "
            "for a person has ended: nothing runs until someone decides. So only the boundaries up to that "
            "approval were crash-tested."
            + (f" Fix: {again} (a person who approves every call)" if approve is None else "")
        )
    waiting = [row for row in report.rows if row.status == "waiting"]
    if waiting and (base is None or base.status != "waiting"):
        notes.append(
            f"waiting: {len(waiting)} cases ended waiting for a decision: the crash fell between a request for "
            "approval and its answer, and a resumed run that waits is returned as it is (the person is not "
            "asked again). That is a correct end; a decision (tether approve) lets it go on."
            + (f" To answer those too: {again}" if approve is None else "")
        )
    return notes


def _quoted(text: str) -> str:
    return text if text and all(c.isalnum() or c in "-_./:" for c in text) else repr(text)
