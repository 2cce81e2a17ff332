"""PostgresStore's first connection of a process, and what its failure means (DESIGN 1.6).

Before a process opens its pool, it connects once, directly, within ``connect_timeout``: a server that is not
there, a database that does not exist and a login the server refuses are each one clear error at once,
instead of the pool's retries (a "error connecting" log line every second or so) until the pool and retry
timeouts run out. Connections lost later are the pool's and ``PostgresStore._run``'s to retry.
"""

from __future__ import annotations

import re

import psycopg
from psycopg.conninfo import conninfo_to_dict

from ...errors import TetherError
from ._sql import PostgresUnavailableError

__all__ = ["connect_error", "first_connect"]

_NO_DATABASE = re.compile(r'database "([^"]+)" does not exist')
_LOGIN = re.compile(
    r'role "[^"]+" does not exist|password authentication failed|no pg_hba\.conf entry|'
    r"password is required|permission denied for database"
)


def _where(conninfo: str) -> str:
    """``host:port`` of the connection string (libpq's defaults when it names none)."""
    params = conninfo_to_dict(conninfo)
    host = str(params.get("host") or params.get("hostaddr") or "localhost")
    return f"{host}:{params.get('port') or 5432}"


def _reason(exc: Exception) -> str:
    """libpq's words, without psycopg's "connection failed: connection to server at ... failed:" prefix."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    text = lines[0] if lines else type(exc).__name__
    text = re.sub(r"^connection failed: ", "", text)
    text = re.sub(r"^connection to server (at|on) .*?failed: ", "", text)
    return re.sub(r"^FATAL:\s+", "", text)


def connect_error(identity: str, conninfo: str, exc: Exception) -> TetherError:
    """The error of a first connection that failed with ``exc``, naming the server and the fix."""
    where, text = _where(conninfo), str(exc)
    missing = _NO_DATABASE.search(text)
    if missing:
        name = missing.group(1)
        return TetherError(
            f"PostgreSQL at {where} has no database {name} ({identity}). Fix: create it (createdb {name}, "
            "or CREATE DATABASE in psql), or name an existing database in the URL"
        )
    if _LOGIN.search(text):
        return TetherError(
            f"PostgreSQL at {where} refused the login: {_reason(exc)} ({identity}). Fix: check the user and "
            "password in the URL, and that the server's pg_hba.conf lets that user in"
        )
    return PostgresUnavailableError(
        f"no PostgreSQL server answers at {where}: {_reason(exc)} ({identity}). Fix: start the server, or "
        "correct the host and port in the URL"
    )


def first_connect(conninfo: str, identity: str) -> None:
    """Connect once (and close) within the connection string's ``connect_timeout``.

    Raises:
        TetherError: the database does not exist, or the login was refused.
        PostgresUnavailableError: no server answered at the host and port.
    """
    try:
        psycopg.connect(conninfo, autocommit=True).close()
    except psycopg.OperationalError as exc:
        raise connect_error(identity, conninfo, exc) from None
