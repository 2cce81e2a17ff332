"""PostgresStore's schema, SQL fragments and pure helpers (see ``tether.stores.postgres``).

psycopg is imported here too: import this module only through ``tether.stores.postgres``.
"""

from __future__ import annotations

import builtins
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import orjson
import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.types.json import Jsonb

from ... import journal as j
from ...errors import TetherError
from .. import base
from ..base import Owner, RunInfo

Conn = psycopg.Connection[Any]

DEFAULT_SCHEMA = "tether"
"""Where PostgresStore keeps its tables when neither the argument nor the URL names a schema."""
_SCHEMA_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")

CHANNEL = "tether_work"
"""The NOTIFY channel: posts, submitted runs, runs released with work left (payload: the root's id)."""

WORK = "parent_id IS NULL AND (status IN ('running', 'waiting') OR inbox_len > inbox_consumed + 1)"
"""Roots that may need work; the partial index ``runs_work`` covers exactly these (its text must match)."""
LIVE = "(lease_owner IS NOT NULL AND lease_expires_at > now())"
FREE = "(lease_owner IS NULL OR lease_expires_at <= now())"
EPOCH = "extract(epoch FROM lease_expires_at)::float8"
_COLLATE = 'COLLATE "C"'

LISTED = (
    "id, agent, status, first_message, created_at, updated_at, turn, parent_id, root_id, lease_owner, "
    f"{EPOCH}, {LIVE}, length, inbox_len, inbox_consumed, info -> 'metadata'"
)
HAS_METADATA = "info -> 'metadata' @> %s"
"""A listing filter: the run's metadata holds every pair of the parameter (a JSONB object); uses
``runs_metadata``."""
SET_LISTING = (
    "agent = %s, status = %s, turn = %s, first_message = %s, created_at = %s, updated_at = %s, "
    "parent_id = %s, root_id = %s, info = %s"
)


class PostgresUnavailableError(TetherError, ConnectionError):
    """The server could not be reached (or kept dropping the connection) for ``retry_timeout`` seconds."""


def clean(value: Any) -> Any:
    """Drop NUL characters, which PostgreSQL text and JSONB cannot hold (listing fields only)."""
    if isinstance(value, str):
        return value.replace("\x00", "")
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    return [*map(clean, value)] if isinstance(value, builtins.list | tuple) else value


def _dumps(value: Any) -> bytes:
    """JSON bytes of ``value`` without NUL characters (``clean``, only when its JSON holds an escaped one)."""
    data = orjson.dumps(value, default=str)
    return orjson.dumps(clean(value), default=str) if b"\\u0000" in data else data


def as_json(value: Any) -> Jsonb:
    """``value`` as a JSONB parameter, NUL characters dropped (``clean``)."""
    return Jsonb(value, dumps=_dumps)


def holding(raw: Any, live: bool) -> Owner | None:
    """The lease's owner while it holds: unexpired, and not a process of this host known to be dead."""
    owner = Owner.from_dict(raw) if raw is not None and live else None
    return None if owner is None or base.pid_alive(owner.pid, owner.host) is False else owner


@dataclass(frozen=True, slots=True)
class Tables:
    """The store's tables, each name qualified by the schema and quoted (``psycopg.sql.Identifier``)."""

    schema: str
    """The schema's name, as given (validated)."""
    quoted: str
    runs: str
    entries: str
    inbox: str
    versions: str
    """``tether_schema``: the migrations applied."""

    @classmethod
    def of(cls, schema: str) -> Tables:
        quoted = sql.Identifier(schema).as_string(None)
        return cls(
            schema, quoted, *(f"{quoted}.{name}" for name in ("runs", "entries", "inbox", "tether_schema"))
        )

    @property
    def needs(self) -> str:
        """A root needing work (``Store.claim_next``): running, with unconsumed items, or waiting on a free run
        of its tree that has unconsumed items or moved on since the root was updated (``r``: the root)."""
        return (
            "(status = 'running' OR inbox_len > inbox_consumed + 1 OR (status = 'waiting' AND EXISTS (SELECT 1 "
            f"FROM {self.runs} AS c WHERE c.root_id = r.id AND c.parent_id IS NOT NULL AND (c.lease_owner IS NULL "
            "OR c.lease_expires_at <= now()) AND (c.inbox_len > c.inbox_consumed + 1 OR (c.status <> 'waiting' "
            "AND c.updated_at > r.updated_at)))))"
        )


def migrations(t: Tables) -> builtins.list[tuple[str, ...]]:
    """The schema's migrations, in order: the statements of migration n are ``migrations(t)[n - 1]``."""
    return [
        (  # 1: the first schema
            f"CREATE TABLE {t.runs} (id TEXT {_COLLATE} PRIMARY KEY, agent TEXT, status TEXT NOT NULL DEFAULT "
            f"'running', turn INTEGER NOT NULL DEFAULT 0, first_message TEXT, created_at TEXT {_COLLATE}, "
            f"updated_at TEXT {_COLLATE} NOT NULL, parent_id TEXT, root_id TEXT, info JSONB NOT NULL DEFAULT "
            "'{}', length INTEGER NOT NULL DEFAULT 0, inbox_len INTEGER NOT NULL DEFAULT 0, inbox_consumed "
            "INTEGER NOT NULL DEFAULT -1, lease_owner JSONB, lease_token BIGINT NOT NULL DEFAULT 0, "
            "lease_expires_at TIMESTAMPTZ)",
            f"CREATE TABLE {t.entries} (run_id TEXT NOT NULL REFERENCES {t.runs}(id) ON DELETE CASCADE, "
            "seq INTEGER NOT NULL, body BYTEA NOT NULL, PRIMARY KEY (run_id, seq))",
            f"CREATE TABLE {t.inbox} (run_id TEXT NOT NULL REFERENCES {t.runs}(id) ON DELETE CASCADE, inbox_seq "
            "INTEGER NOT NULL, item_id TEXT NOT NULL, body BYTEA NOT NULL, PRIMARY KEY (run_id, inbox_seq), "
            "UNIQUE (run_id, item_id))",
            f"CREATE INDEX runs_updated ON {t.runs} (updated_at DESC, id DESC)",
            f"CREATE INDEX runs_status ON {t.runs} (status, updated_at DESC, id DESC)",
            f"CREATE INDEX runs_agent ON {t.runs} (agent, updated_at DESC, id DESC)",
            f"CREATE INDEX runs_parent ON {t.runs} (parent_id, updated_at DESC, id DESC)",
            f"CREATE INDEX runs_root ON {t.runs} (root_id, updated_at DESC, id DESC)",
            f"CREATE INDEX runs_work ON {t.runs} (updated_at, id) WHERE {WORK}",
        ),
        (  # 2: run metadata (DESIGN 18): list(metadata=...) is ``info -> 'metadata' @> pairs`` on this index
            f"CREATE INDEX runs_metadata ON {t.runs} USING GIN ((info -> 'metadata') jsonb_path_ops)",
        ),
    ]


SCHEMA_VERSION = len(migrations(Tables.of(DEFAULT_SCHEMA)))
"""The schema this tether writes; a database with a higher version in ``tether_schema`` is refused."""


def split_schema(dsn: str, schema: str | None) -> tuple[str, str, bool]:
    """The DSN without tether's ``schema`` URL parameter, the schema to use (validated), and whether it was
    named (False: ``tether`` by default).

    The schema is ``schema`` when given, else the URL's ``?schema=NAME``, else ``tether``. A ``search_path``
    in the DSN's ``options`` does not choose it: every statement names the schema.

    Raises:
        ValueError: the name is not a plain identifier, or the argument and the URL disagree.
    """
    in_url = None
    if dsn.startswith(("postgresql://", "postgres://")):
        parts = urlsplit(dsn)
        query = parse_qsl(parts.query, keep_blank_values=True)
        found = [value for key, value in query if key == "schema"]
        if found:
            in_url = found[-1]
            dsn = urlunsplit(parts._replace(query=urlencode([(k, v) for k, v in query if k != "schema"])))
    if schema is not None and in_url is not None and schema != in_url:
        raise ValueError(f"PostgresStore got schema={schema!r} and a URL with ?schema={in_url}. Fix: name the "
                         "schema once")  # fmt: skip
    named = schema or in_url
    return dsn, valid_schema(named or DEFAULT_SCHEMA), named is not None


def valid_schema(name: str) -> str:
    """``name`` when it is a plain PostgreSQL identifier (quoted all the same, by ``psycopg.sql.Identifier``).

    Raises:
        ValueError: it is not.
    """
    if not _SCHEMA_NAME.fullmatch(name):
        raise ValueError(f"schema {name!r} is not a plain PostgreSQL name. Fix: use letters, digits and _ "
                         "(a digit not first), at most 63 characters, e.g. schema='tether'")  # fmt: skip
    return name


def redact(dsn: str, schema: str | None = None) -> str:
    """The DSN as a ``postgresql://`` URL without its password (parameters sorted, ``schema`` among them)."""
    params = {k: str(v) for k, v in conninfo_to_dict(dsn).items() if v is not None and k != "password"}
    if schema is not None:
        params["schema"] = schema
    user, host, port, dbname = (params.pop(k, "") for k in ("user", "host", "port", "dbname"))
    if host.startswith("/") or "," in host:  # a socket folder or several hosts: kept as parameters
        params.update(host=host, **({"port": port} if port else {}))
        host = port = ""
    netloc = (f"{quote(user, safe='')}@" if user else "") + host + (f":{port}" if port else "")
    query = urlencode(sorted(params.items()))
    return f"postgresql://{netloc}/{quote(dbname, safe='')}" + (f"?{query}" if query else "")


def listing_of(info: dict[str, Any]) -> tuple[Any, ...]:
    """The listing columns from the writer's info: agent … root_id, then the info JSON."""
    return (
        clean(info.get("agent")), str(info.get("status") or "running"), int(info.get("turn") or 0),
        clean(info.get("first_message")), info.get("created_at"), info.get("updated_at") or j.now_iso(),
        clean(info.get("parent_id")), clean(info.get("root_id")), as_json(info),
    )  # fmt: skip


def info_of(row: Sequence[Any]) -> RunInfo:
    owner = holding(row[9], row[11])
    return RunInfo(
        id=row[0], agent=row[1], status=row[2], first_message=row[3], created_at=row[4], updated_at=row[5],
        turn=int(row[6]), parent_id=row[7], root_id=row[8],
        lease_owner=f"{owner.host}:{owner.pid}" if owner else None, lease_expires_at=row[10] if owner else None,
        length=int(row[12]), inbox_len=int(row[13]), inbox_consumed=int(row[14]),
        metadata=dict(row[15]) if isinstance(row[15], dict) else {},
    )  # fmt: skip


def refuse_newer(identity: str, version: int) -> None:
    if version > SCHEMA_VERSION:
        raise TetherError(f"{identity} was written by a newer tether (schema {version}; this tether knows up to "
                          f"{SCHEMA_VERSION}). Fix: upgrade tether")  # fmt: skip
