"""What the benchmarks that measure PostgresStore share: whether a server answers at a DSN."""

from __future__ import annotations


def postgres_answers(dsn: str, fix: str) -> bool:
    """Whether a PostgreSQL server answers at ``dsn``; if not, says so (with ``fix``) and returns False."""
    import psycopg

    try:
        psycopg.connect(dsn, connect_timeout=3).close()
    except psycopg.OperationalError as exc:
        print(f"postgres: no server at {dsn} ({str(exc).strip()[:120]}); skipped. Fix: {fix}")
        return False
    return True
