"""PostgresStore: runs shared by many processes and machines, through leases with fencing tokens.

``store.py`` is the store (psycopg 3 and its pool, imported with this package); ``_sql.py`` the schema,
migrations and the SQL the store shares.
"""

from .store import SCHEMA_VERSION, PostgresStore, PostgresUnavailableError

__all__ = ["SCHEMA_VERSION", "PostgresStore", "PostgresUnavailableError"]
