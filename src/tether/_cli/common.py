"""What every ``tether`` command shares: the typer app, the store option, one-line errors, agent loading,
who is asking, and run ids in short form (``ids``).

Only the modules of ``_cli`` import this one; ``import tether`` never does.
"""

from __future__ import annotations

import dataclasses
import functools
import getpass
import os
import re
import shlex
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn, ParamSpec, TypeVar

import typer
from rich.console import Console
from rich.text import Text

from .. import __version__, _loading
from ..errors import TetherError
from ..state import State
from ..stores import RunInfo, Store, open_store
from . import ids

if TYPE_CHECKING:
    from ..agent import Agent

__all__ = [
    "DEFAULT_STORE",
    "EXIT_BAD_INPUT",
    "EXIT_FAILED",
    "STATUSES",
    "STATUS_STYLES",
    "STORE_ENV",
    "STORE_HELP",
    "ByOption",
    "JsonOption",
    "StoreOption",
    "app",
    "cli_advice",
    "console",
    "decide_lines",
    "decider",
    "fail",
    "friendly_errors",
    "load_agent",
    "names_for",
    "open_cli_store",
    "parse_duration",
    "require_store",
    "resolve_run",
    "resume_hint",
    "store_file",
    "store_flag",
    "store_url",
    "whoami",
]

DEFAULT_STORE = "sqlite:///.tether/runs.db"
"""The store used when neither ``--store`` nor ``$TETHER_STORE`` names one: a SQLite file in the current folder."""

STORE_ENV = "TETHER_STORE"
"""The environment variable holding the default store URL."""

EXIT_BAD_INPUT = 2
"""Bad input, or an error the command reports on one line (``error: ... Fix: ...``)."""
EXIT_FAILED = 1
"""The command ran and what it checked or drove failed (a failed run, a broken invariant)."""
STATUSES = ("running", "waiting", "completed", "failed", "cancelled", "stopped")
STATUS_STYLES = {
    "completed": "green",
    "running": "cyan",
    "waiting": "yellow",
    "failed": "red",
    "cancelled": "magenta",
    "stopped": "yellow",
}

app = typer.Typer(
    name="tether",
    help=(
        "Durable LLM agent runs: every step journaled, any process resumes, no tool runs twice.\n\n"
        "Run ids may be given in short form, as git takes commits: tether ls shows them. AGENT is "
        "module:attribute or path/file.py:attribute. docs/cli.md describes every command and its JSON."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"tether {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool,
        typer.Option(
            "--version", "-V", help="Print tether's version and exit.", is_eager=True, callback=_print_version
        ),
    ] = False,
) -> None:
    """The options of ``tether`` itself (``--version``); the commands are registered on ``app``."""


def console(*, stderr: bool = False) -> Console:
    """A console on the current stdout (or stderr); wide when it is not a terminal, so ids are never cut."""
    made = Console(stderr=stderr, highlight=False)
    if not made.is_terminal and "COLUMNS" not in os.environ:
        made.width = 500
    return made


STORE_HELP = (
    "Where runs are kept: a SQLite file (runs.db, sqlite:///PATH), a folder (file:PATH), "
    f"postgresql://USER@HOST/DB, or memory: [env {STORE_ENV}; default {DEFAULT_STORE}]"
)
StoreOption = Annotated[
    str,
    typer.Option(
        "--store",
        "-s",
        envvar=STORE_ENV,
        metavar="URL",
        help=STORE_HELP,
        show_default=False,
        show_envvar=False,
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON (docs/cli.md describes it).")]
ByOption = Annotated[
    str | None,
    typer.Option("--by", "-b", metavar="NAME", help="Who does it (journaled; default: your login name)."),
]

P = ParamSpec("P")
R = TypeVar("R")


def fail(message: str, fix: str | None = None) -> NoReturn:
    """Print ``error: message. Fix: fix`` on stderr and exit 2.

    A library message keeps its own Fix unless ``fix`` is given; advice meant for Python code is turned
    into the command to run (``cli_advice``).
    """
    if fix is not None:
        message = f"{message.partition(' Fix:')[0].rstrip().rstrip('.')}. Fix: {fix}"
    elif "Fix:" not in message:
        message = f"{message.rstrip('.')}. Fix: check the command's arguments (tether COMMAND --help)"
    console(stderr=True).print(Text(f"error: {cli_advice(message)}", style="red"), soft_wrap=True)
    raise typer.Exit(EXIT_BAD_INPUT)


_ADVICE: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"Fix: store\.load\([^)]*\)( again)?[^.]*"), "Fix: run the command again"),
    (re.compile(r"Fix: pass children=True\b[^.]*"), "Fix: add --children (-r) to delete the whole tree"),
    (re.compile(r"Fix: delete its root (\S+) with children=True[^.]*"), r"Fix: tether rm \1 --children"),
    (re.compile(r"Fix: pass run_id= to say which"), "Fix: name the run that holds the call (tether show ID)"),
    (
        re.compile(r"Fix: pick a call id( and run id)? from state\.pending_approvals"),
        "Fix: tether show ID lists them",
    ),
    (
        re.compile(r"run (\S+) belongs to agent (\S+); this is (\S+)\. Fix: resume it with \S+$"),
        r"run \1 belongs to agent \2; this is \3. Fix: tether resume AGENT \1 (AGENT: module:attribute of the "
        r"Agent named \2)",
    ),
    (
        re.compile(r"run (\S+) is a subagent of (\S+)\. Fix: resume (\S+)$"),
        r"run \1 is a subagent run of \2. Fix: tether resume AGENT \3 (the root of its tree)",
    ),
    (
        re.compile(r"Fix: resume it with the agent it was started with, or pass strict_resume=False"),
        "Fix: resume it with the agent it was started with",
    ),
]


def cli_advice(message: str) -> str:
    """``message`` with a Fix written for Python code (``children=True``, ``store.load``) as a command."""
    for pattern, replacement in _ADVICE:
        message = pattern.sub(replacement, message)
    return message


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
        except BrokenPipeError:  # the reader went away (| head): stop quietly, as git does
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.close(devnull)
            raise typer.Exit(141) from None
        except (TetherError, ValueError, KeyError) as exc:
            fail(_message(exc))
        except OSError as exc:
            where = f" ({exc.filename})" if exc.filename else ""
            fail(f"{exc.strerror or exc}{where}. Fix: check the store path and its permissions")

    return wrapper


_SQLITE_SUFFIXES = (".db", ".sqlite", ".sqlite3")


def store_url(text: str) -> str:
    """The store URL that ``--store TEXT`` means: a plain path ending in .db, .sqlite or .sqlite3 is a SQLite
    file (``sqlite:///PATH``); any other plain path is a folder (``file:PATH``); a URL is itself."""
    scheme, sep, _ = text.partition(":")
    plain = not sep or "/" in scheme or "\\" in scheme or len(scheme) == 1
    if plain and text.lower().endswith(_SQLITE_SUFFIXES):
        return f"sqlite:///{text}"
    if plain and text.strip():
        return f"file:{text}"
    return text


def store_file(url: str) -> tuple[Path, str] | None:
    """The path a ``file:`` or ``sqlite:`` store URL names, and what it is (``folder`` or ``file``)."""
    scheme, sep, rest = url.partition(":")
    if scheme == "file" and sep:
        path = rest[2:] if rest.startswith("//") else rest
        return (Path(path), "folder") if path else None
    if scheme == "sqlite" and sep:
        path = rest[3:] if rest.startswith("///") else rest
        return (Path(path), "file") if path else None
    return None


def open_cli_store(url: str | None, *, missing_ok: bool = False) -> Store | None:
    """The store at ``url``; looking creates nothing, so a file store's folder (or SQLite file) must exist.

    Args:
        url: the store URL (None: ``DEFAULT_STORE``).
        missing_ok: return None, instead of raising, when that folder or file does not exist yet.

    Raises:
        ValueError: the URL is bad, or names a folder or file that does not exist.
    """
    url = store_url(url if url is not None else DEFAULT_STORE)
    found = store_file(url)
    if found is not None:
        path, kind = found
        usable = path.is_dir() if kind == "folder" else path.is_file()
        if not usable:
            if missing_ok and not path.exists():
                return None
            problem = f"is not a {kind}" if path.exists() else "does not exist"
            raise ValueError(
                f"store {kind} {path} {problem}, so it holds no runs. Fix: pass --store with the store your "
                f"agent writes (or set {STORE_ENV}), e.g. --store runs.db"
            )
    return open_store(url)


def require_store(url: str | None) -> Store:
    """The store at ``url``, which must exist (see ``open_cli_store``)."""
    store = open_cli_store(url)
    assert store is not None
    return store


def whoami() -> str | None:
    """The login name, or None when it cannot be told."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return None


def decider(by: str | None) -> str:
    """``--by``, else the login name."""
    who = by if by is not None else whoami()
    if not who:
        fail("your login name cannot be told", "pass --by NAME")
    return who


def resolve_run(store: Store, text: str, url: str | None) -> str:
    """The id of the run that ``text`` (an id, or a short form of one) names in ``store``.

    Raises:
        ValueError: it names none, or several (the message says which).
    """
    where = store_url(url) if url is not None else DEFAULT_STORE
    try:
        return ids.resolve(store, text, where)
    except ValueError as exc:
        if "Fix:" in str(exc):
            raise
        raise ValueError(f"{exc}. Fix: tether ls --store {where} lists its runs") from None


def _identity(url: str) -> str:
    """What ``Store.identity`` would say for ``url``, without opening it (which could create it)."""
    url = store_url(url)
    found = store_file(url)
    if found is not None:
        path, kind = found
        return f"sqlite:///{path.resolve()}" if kind == "file" else f"file:{path.resolve()}"
    return re.sub(r"//([^:/@]+):[^@]*@", r"//\1@", url)  # a DSN's identity has no password


def store_flag(store: Store, given: str | None = None) -> str:
    """What a printed command needs to reach ``store``: nothing when ``tether`` finds it without ``--store``
    (it is ``$TETHER_STORE``, or the default), else `` --store URL`` (``given``, the URL the user typed)."""
    default = os.environ.get(STORE_ENV) or DEFAULT_STORE
    if given is not None and store_url(given) == store_url(default):
        return ""
    if store.identity == _identity(default):
        return ""
    return f" --store {shlex.quote(given if given is not None else store.identity)}"


def resume_hint(run_id: str, agent: str | None, flag: str = "") -> str:
    """The command that continues a run, with AGENT explained when the Agent's module is not known here.

    ``flag`` is ``store_flag``'s: what the command needs to reach the store.
    """
    named = f" (AGENT: module:attribute of the Agent named {agent})" if agent else ""
    return f"tether resume AGENT {run_id}{flag}{named}"


def names_for(store: Store, *also: Sequence[RunInfo]) -> ids.Names:
    """Short forms of the run ids of ``store`` (every run's, or the newest ones' and ``also``'s)."""
    known, complete = ids.known_runs(store)
    names = ids.Names((info.id for info in known), complete=complete)
    for more in also:
        names.add(info.id for info in more)
    return names


def decide_lines(run_id: str, call_id: str, flag: str = "") -> list[str]:
    """The commands that decide a pending call, as ``show``, ``follow`` and ``run`` print them (they work as
    printed; ``flag`` is ``store_flag``'s)."""
    return [
        f"approve: tether approve {run_id} {call_id}{flag}",
        f"deny:    tether deny {run_id} {call_id}{flag} -m WHY",
    ]


_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str) -> timedelta:
    """``30d``, ``12h``, ``90m``, ``45s`` or ``2w`` (also combined: ``1d12h``) as a timedelta.

    Raises:
        ValueError: anything else.
    """
    cleaned = text.strip().lower()
    parts = _DURATION.findall(cleaned)
    if not parts or "".join(n + u for n, u in parts) != cleaned:
        raise ValueError(
            f"duration {text!r} is not understood. Fix: use a number and a unit, e.g. 30d, 12h, 90m"
        )
    return timedelta(seconds=sum(float(n) * _UNITS[u] for n, u in parts))


_WORDING = dataclasses.replace(
    _loading.CLI,
    malformed=(
        "agent {spec!r} is not MODULE:ATTRIBUTE or PATH/FILE.py:ATTRIBUTE. Fix: name it like "
        "myapp.agents:support or agents.py:support"
    ),
)


def load_agent(spec: str) -> Agent:
    """The Agent that ``spec`` names: ``module:attribute`` or ``path/file.py:attribute``.

    The attribute (dots allowed) is an Agent, or a callable taking no arguments that returns one. A module
    is imported with the current folder on ``sys.path``; a file is loaded as a module of its own, with its
    folder on ``sys.path`` so it can import its neighbours.

    Raises:
        ValueError: the spec is malformed, the module or file cannot be found, the attribute is missing, or
            it is not an Agent.
    """
    return _loading.load_agent(spec, _WORDING)


TREE_LIMIT = 100_000
"""At most this many runs of one tree are listed."""


def print_line(out: Console, line: str, style: str = "") -> None:
    """Print one line as it is: no markup, never cut (a terminal wraps it)."""
    out.print(Text(line, style=style), overflow="ignore", crop=False, soft_wrap=True)


def info_of(state: State, tree: Sequence[RunInfo]) -> RunInfo:
    """The listing record of ``state``: from ``tree`` when it is there, else made from the fold."""
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
