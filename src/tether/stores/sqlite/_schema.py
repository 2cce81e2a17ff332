"""SQLiteStore's schema (its migrations, in order) and the SQL fragments it is queried with.

See ``tether.stores.sqlite``.
"""

from __future__ import annotations

__all__ = [
    "FREE",
    "HELD",
    "INSERT_ENTRY",
    "INSERT_METADATA",
    "LISTED",
    "METADATA_PAIR",
    "MIGRATIONS",
    "NEXT",
    "SCHEMA_VERSION",
    "WORK",
]

WORK = "parent_id IS NULL AND (status IN ('running', 'waiting') OR inbox_len > inbox_consumed + 1)"
"""Roots that may need work; the partial index ``runs_work`` covers exactly these (its text must match)."""

NEXT = (
    f"SELECT id FROM runs AS r INDEXED BY runs_work WHERE {WORK} AND (lease_owner IS NULL OR "
    "lease_expires_at <= ?) AND (status = 'running' OR inbox_len > inbox_consumed + 1 OR (status = 'waiting' "
    "AND EXISTS (SELECT 1 FROM runs AS c WHERE c.root_id = r.id AND c.id <> r.id AND "
    "(c.lease_owner IS NULL OR c.lease_expires_at <= ?) AND (c.inbox_len > c.inbox_consumed + 1 OR "
    "(c.status <> 'waiting' AND c.updated_at > r.updated_at)))))"
)
"""Roots needing work (parameters: now, now), as ``Store.claim_next`` says: free, and running, with
unconsumed inbox items, or waiting while a free run of its tree has unconsumed items or is no longer waiting
and was updated after the root."""

MIGRATIONS: list[tuple[str, ...]] = [
    (  # 1: the first schema
        "CREATE TABLE runs (id TEXT PRIMARY KEY, agent TEXT, status TEXT NOT NULL DEFAULT 'running', "
        "turn INTEGER NOT NULL DEFAULT 0, first_message TEXT, created_at TEXT, updated_at TEXT, "
        "parent_id TEXT, root_id TEXT, info TEXT NOT NULL DEFAULT '{}', length INTEGER NOT NULL DEFAULT 0, "
        "inbox_len INTEGER NOT NULL DEFAULT 0, inbox_consumed INTEGER NOT NULL DEFAULT -1, lease_owner TEXT, "
        "lease_token INTEGER NOT NULL DEFAULT 0, lease_expires_at REAL)",
        "CREATE TABLE entries (run_id TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE, "
        "seq INTEGER NOT NULL, body BLOB NOT NULL, PRIMARY KEY (run_id, seq))",
        "CREATE TABLE inbox (run_id TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE, "
        "inbox_seq INTEGER NOT NULL, item_id TEXT NOT NULL, body BLOB NOT NULL, "
        "PRIMARY KEY (run_id, inbox_seq), UNIQUE (run_id, item_id))",
        "CREATE INDEX runs_updated ON runs (updated_at DESC, id DESC)",
        "CREATE INDEX runs_status ON runs (status, updated_at DESC, id DESC)",
        "CREATE INDEX runs_agent ON runs (agent, updated_at DESC, id DESC)",
        "CREATE INDEX runs_parent ON runs (parent_id)",
        "CREATE INDEX runs_root ON runs (root_id)",
        f"CREATE INDEX runs_work ON runs (updated_at, id) WHERE {WORK}",
    ),
    (  # 2: listing a tree or a parent's children newest first, without a sort
        "DROP INDEX runs_parent",
        "DROP INDEX runs_root",
        "CREATE INDEX runs_parent ON runs (parent_id, updated_at DESC, id DESC)",
        "CREATE INDEX runs_root ON runs (root_id, updated_at DESC, id DESC)",
    ),
    (  # 3: run metadata (DESIGN 18), one row per pair, indexed by pair for list(metadata=...). Runs made
        # before it have none: the listing record held no metadata until this schema.
        "CREATE TABLE run_metadata (run_id TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE, "
        "key TEXT NOT NULL, value TEXT NOT NULL, PRIMARY KEY (run_id, key))",
        "CREATE INDEX run_metadata_pairs ON run_metadata (key, value, run_id)",
    ),
]
SCHEMA_VERSION = len(MIGRATIONS)
"""The schema this tether writes; a file with a higher ``user_version`` is refused."""

HELD = "length, lease_token, lease_owner, lease_expires_at"
FREE = "(lease_owner IS NULL OR COALESCE(lease_expires_at <= ?, 0))"
"""Not held (parameter: now); never NULL, so it may be negated."""
LISTED = (
    "id, agent, status, first_message, created_at, updated_at, turn, parent_id, root_id, lease_owner, "
    "lease_expires_at, length, inbox_len, inbox_consumed, "
    "CASE WHEN json_valid(info) THEN json_extract(info, '$.metadata') END"
)
INSERT_METADATA = "INSERT INTO run_metadata (run_id, key, value) VALUES (?, ?, ?)"
"""One metadata pair of a new run (parameters: run id, key, value); metadata never changes after create."""
METADATA_PAIR = "id IN (SELECT run_id FROM run_metadata WHERE key = ? AND value = ?)"
"""A listing filter: the run's metadata holds this pair (parameters: key, value)."""

INSERT_ENTRY = "INSERT INTO entries (run_id, seq, body) VALUES (?, ?, ?)"
