"""SQLiteStore: runs in one SQLite file, WAL and ``synchronous=FULL`` (DESIGN 8.2).

``store.py`` is the store; ``_schema.py`` the tables, indexes, migrations and the SQL the store shares.
"""

from .store import SCHEMA_VERSION, SQLiteStore

__all__ = ["SCHEMA_VERSION", "SQLiteStore"]
