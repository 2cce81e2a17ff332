"""PostgresStore: runs shared by many processes and machines, through leases with fencing tokens.

``store.py`` is the store (psycopg 3 and its pools, imported with this package: both faces, the retries);
``_primitives.py`` each primitive's statements, written once for both faces over a connection of
``_conn.py``; ``_schema.py`` the migrations, the schema of its own and the old place; ``_sql.py`` the table
names, the migrations' statements and the SQL fragments and helpers the others share; ``_connect.py`` the
first connection and what its failure means; ``_listen.py`` a worker's ``LISTEN`` for work.
"""

from .store import SCHEMA_VERSION, PostgresStore, PostgresUnavailableError

__all__ = ["SCHEMA_VERSION", "PostgresStore", "PostgresUnavailableError"]
