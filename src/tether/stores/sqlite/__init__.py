"""SQLiteStore: runs in one SQLite file, WAL and ``synchronous=FULL`` (DESIGN 8.2).

``store.py`` is the store; ``_schema.py`` the tables, indexes, migrations and the SQL the store shares;
``_txn.py`` connections and the write lock's wait; ``_writers.py`` this process's writes, one at a time and
committed together; ``_catalog.py`` listing and removal; ``_rows.py`` reading rows.
"""

from .store import SCHEMA_VERSION, SQLiteStore

__all__ = ["SCHEMA_VERSION", "SQLiteStore"]
