"""A pooled connection as PostgresStore's statements use it, in either face (see ``tether.stores._face``).

Each primitive of PostgresStore is one coroutine over a ``Cx`` (``_primitives.py``): ``AsyncCx`` awaits
psycopg's ``AsyncConnection``; ``SyncCx`` calls a sync ``Connection`` and never suspends, so
``run_sync`` drives the same coroutine on the calling thread. The SQL of each statement is written once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any, Protocol

import psycopg

__all__ = ["AsyncCx", "Cx", "SyncCx"]

Params = Sequence[Any]


class Cx(Protocol):
    """One connection: statements, each returning its rows or count, and transactions."""

    async def one(self, sql: str, params: Params = ()) -> Any:
        """The first row of the statement's result (None: no row)."""

    async def all(self, sql: str, params: Params = ()) -> list[Any]:
        """Every row of the statement's result."""

    async def count(self, sql: str, params: Params = ()) -> int:
        """Run the statement; how many rows it changed."""

    async def many(self, sql: str, rows: Sequence[Params]) -> None:
        """Run the statement once for each parameter row (one round trip, pipelined by psycopg)."""

    def transaction(self) -> contextlib.AbstractAsyncContextManager[Any]:
        """A transaction: committed when the block ends, rolled back when it raises."""


class SyncCx:
    """A sync psycopg connection behind coroutines that never suspend."""

    __slots__ = ("conn",)

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    async def one(self, sql: str, params: Params = ()) -> Any:
        return self.conn.execute(sql, params).fetchone()

    async def all(self, sql: str, params: Params = ()) -> list[Any]:
        return self.conn.execute(sql, params).fetchall()

    async def count(self, sql: str, params: Params = ()) -> int:
        return self.conn.execute(sql, params).rowcount

    async def many(self, sql: str, rows: Sequence[Params]) -> None:
        self.conn.cursor().executemany(sql, rows)

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        with self.conn.transaction():
            yield


class AsyncCx:
    """An async psycopg connection. A statement cancelled by its task is cancelled on the server too (the
    pool then discards the connection, whose state is unknown)."""

    __slots__ = ("conn",)

    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self.conn = conn

    async def one(self, sql: str, params: Params = ()) -> Any:
        cursor = await self._execute(sql, params)
        return await cursor.fetchone()

    async def all(self, sql: str, params: Params = ()) -> list[Any]:
        cursor = await self._execute(sql, params)
        return await cursor.fetchall()

    async def count(self, sql: str, params: Params = ()) -> int:
        return (await self._execute(sql, params)).rowcount

    async def many(self, sql: str, rows: Sequence[Params]) -> None:
        try:
            await self.conn.cursor().executemany(sql, rows)
        except asyncio.CancelledError:
            await self._cancel()
            raise

    def transaction(self) -> contextlib.AbstractAsyncContextManager[Any]:
        return self.conn.transaction()

    async def _execute(self, sql: str, params: Params) -> psycopg.AsyncCursor[Any]:
        try:
            return await self.conn.execute(sql, params)
        except asyncio.CancelledError:
            await self._cancel()
            raise

    async def _cancel(self) -> None:
        """Stop the statement on the server, and have the pool discard this connection."""
        with contextlib.suppress(Exception):
            await self.conn.cancel_safe(timeout=5.0)
        with contextlib.suppress(Exception):
            await self.conn.close()
