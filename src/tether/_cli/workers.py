"""``tether submit``, ``worker``, ``db migrate`` and ``crashtest``: runs for workers, and proving recovery."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.text import Text

from ..stores import open_store
from .agents import AgentStoreOption, _with_store
from .common import DEFAULT_STORE, StoreOption, app, console, friendly_errors, load_agent

__all__ = ["crashtest", "db_migrate", "submit", "worker"]


@app.command()
@friendly_errors
def submit(
    agent_spec: Annotated[
        str, typer.Argument(metavar="AGENT", help="The Agent: module:attribute or path/file.py:attribute.")
    ],
    prompt: Annotated[str, typer.Argument(metavar="PROMPT", help="The run's first message.")],
    run_id: Annotated[
        str | None, typer.Option("--id", metavar="ID", help="The run's id (default: a new one).")
    ] = None,
    store: AgentStoreOption = None,
) -> None:
    """Create a run that no process drives yet, and print its id: a worker (tether worker) picks it up."""
    agent = load_agent(agent_spec)
    _with_store(agent, store, must_exist=False)
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
    concurrency: Annotated[int, typer.Option("--concurrency", min=1, help="Runs driven at once.")] = 4,
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
    runs = _with_store(agents[0], store, must_exist=False)
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
def db_migrate(store: StoreOption = DEFAULT_STORE) -> None:
    """Create or upgrade the store's schema (PostgreSQL; a SQLite file is migrated whenever it is opened)."""
    runs = open_store(store)
    migrate = getattr(runs, "migrate", None)
    version = migrate() if callable(migrate) else None
    done = f"tether schema {version}" if version is not None else "nothing to migrate (done when opened)"
    console().print(Text(f"{runs.identity}: {done}"))
    runs.close()


@app.command()
def crashtest(
    agent: Annotated[
        str,
        typer.Argument(
            metavar="AGENT",
            help="module:attribute or path/file.py:attribute: an Agent, or a function returning one.",
        ),
    ],
    prompt: Annotated[str, typer.Argument(metavar="PROMPT", help="The prompt each run starts with.")],
    points: Annotated[
        list[str] | None,
        typer.Option(
            "--points",
            metavar="POINT[,POINT]",
            help="Failpoints to try at each boundary: before_append, after_append, torn_append (default: all).",
        ),
    ] = None,
    store: StoreOption = DEFAULT_STORE,
) -> None:
    """Kill AGENT's run at every journal boundary, resume it in new processes, check the invariants.

    Exits 1 when an invariant breaks, 2 on bad input.
    """
    from .._harness.crash.crash_test import cli_main

    raise typer.Exit(cli_main(agent, prompt, store, points or []))
