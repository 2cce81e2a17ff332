"""What every ``tether`` command shares: the typer app, the store option, one-line errors, agent loading.

Only the modules of ``_cli`` import this one; ``import tether`` never does.
"""

from __future__ import annotations

import functools
import getpass
import os
import re
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn, ParamSpec, TypeVar

import typer
from rich.console import Console
from rich.text import Text

from .. import _loading
from ..errors import TetherError
from ..stores import Store, open_store

if TYPE_CHECKING:
    from ..agent import Agent

__all__ = [
    "DEFAULT_STORE",
    "EXIT_BAD_INPUT",
    "STATUSES",
    "STATUS_STYLES",
    "STORE_ENV",
    "JsonOption",
    "StoreOption",
    "app",
    "console",
    "fail",
    "friendly_errors",
    "load_agent",
    "open_cli_store",
    "parse_duration",
    "require_store",
    "store_file",
    "whoami",
]

DEFAULT_STORE = "sqlite:///.tether/runs.db"
"""The store used when neither ``--store`` nor ``$TETHER_STORE`` names one: a SQLite file in the current folder."""

STORE_ENV = "TETHER_STORE"
"""The environment variable holding the default store URL."""

EXIT_BAD_INPUT = 2
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
    help="Durable LLM agent runs: every step journaled, any process resumes, no tool runs twice.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def console(*, stderr: bool = False) -> Console:
    """A console on the current stdout (or stderr); wide when it is not a terminal, so ids are never cut."""
    made = Console(stderr=stderr, highlight=False)
    if not made.is_terminal and "COLUMNS" not in os.environ:
        made.width = 500
    return made


StoreOption = Annotated[
    str,
    typer.Option(
        "--store",
        envvar=STORE_ENV,
        metavar="URL",
        help=f"Where runs are kept: sqlite:///PATH, file:PATH, memory: [env {STORE_ENV}; default {DEFAULT_STORE}]",
        show_default=False,
        show_envvar=False,
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]

P = ParamSpec("P")
R = TypeVar("R")


def fail(message: str, fix: str | None = None) -> NoReturn:
    """Print ``error: message`` on stderr (with ``fix``, or a generic Fix when it has none) and exit 2."""
    if "Fix:" not in message:
        fix = fix or "check the command's arguments (tether --help)"
        message = f"{message.rstrip('.')}. Fix: {fix}"
    console(stderr=True).print(Text(f"error: {message}", style="red"), soft_wrap=True)
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
    url = url if url is not None else DEFAULT_STORE
    found = store_file(url)
    if found is not None:
        path, kind = found
        usable = path.is_dir() if kind == "folder" else path.is_file()
        if not usable:
            if missing_ok and not path.exists():
                return None
            problem = f"is not a {kind}" if path.exists() else "does not exist"
            example = "sqlite:///PATH" if kind == "file" else "file:PATH"
            raise ValueError(
                f"store {kind} {path} {problem}, so it holds no runs. Fix: pass --store {example} (or set "
                f"{STORE_ENV}) to the store your agent writes"
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


def load_agent(spec: str) -> Agent:
    """The Agent that ``spec`` names: ``module:attribute`` or ``path/file.py:attribute``.

    The attribute (dots allowed) is an Agent, or a callable taking no arguments that returns one. A module
    is imported with the current folder on ``sys.path``; a file is loaded as a module of its own, with its
    folder on ``sys.path`` so it can import its neighbours.

    Raises:
        ValueError: the spec is malformed, the module or file cannot be found, the attribute is missing, or
            it is not an Agent.
    """
    return _loading.load_agent(spec, _loading.CLI)
