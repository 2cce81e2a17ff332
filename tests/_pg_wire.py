"""A counting TCP proxy in front of PostgreSQL: client round trips, transactions and statements, read off
the wire (the tests' assertions on an append's cost and ``bench/turns_postgres.py`` both use it).

Every byte between the client and the server passes through, unchanged. What is counted:

- round trips: each time the client sends after the server has answered (or for the first time): a
  burst of client bytes the client then waits on. Pipelined statements sent together count once.
- transactions: each ``ReadyForQuery`` reporting idle after at least one ``CommandComplete`` since the
  last one: an explicit ``BEGIN … COMMIT`` counts once, and so does each statement in autocommit.
- statements: the client's ``Query`` (simple protocol) and ``Execute`` (extended protocol) messages.
- prepares: the client's ``Parse`` messages naming a statement (psycopg prepares a statement on the server
  the sixth time a connection runs it, in a round trip of its own: once per connection and statement).

Connections through it must not ask for SSL or GSS encryption (``sslmode=disable gssencmode=disable``:
``WireCounter.dsn`` adds them), so both directions are plain protocol messages from the first byte.
"""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

__all__ = ["Counts", "WireCounter"]


@dataclass(frozen=True, slots=True)
class Counts:
    """What crossed the proxy."""

    round_trips: int = 0
    transactions: int = 0
    statements: int = 0
    prepares: int = 0

    def __sub__(self, other: Counts) -> Counts:
        return Counts(
            self.round_trips - other.round_trips,
            self.transactions - other.transactions,
            self.statements - other.statements,
            self.prepares - other.prepares,
        )


class _Messages:
    """Splits one direction's bytes into protocol messages (type byte, then a length counting itself)."""

    def __init__(self, startup: bool) -> None:
        self.buffer = bytearray()
        self.startup = startup  # the client's first message has no type byte

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        self.buffer += data
        out: list[tuple[int, bytes]] = []
        while True:
            if self.startup:
                if len(self.buffer) < 4:
                    return out
                (size,) = struct.unpack_from("!i", self.buffer)
                if len(self.buffer) < size:
                    return out
                del self.buffer[:size]
                self.startup = False
                continue
            if len(self.buffer) < 5:
                return out
            kind, size = self.buffer[0], struct.unpack_from("!i", self.buffer, 1)[0]
            if len(self.buffer) < 1 + size:
                return out
            out.append((kind, bytes(self.buffer[5 : 1 + size])))
            del self.buffer[: 1 + size]


class _Link:
    """One proxied connection's counters (its two pumping threads share them)."""

    def __init__(self, counter: WireCounter) -> None:
        self.counter = counter
        self.client = _Messages(startup=True)
        self.server = _Messages(startup=False)
        self.server_spoke = True  # the client's first send is a round trip
        self.completed = False

    def from_client(self, data: bytes) -> None:
        statements = prepares = 0
        for kind, body in self.client.feed(data):
            statements += kind in (ord("Q"), ord("E"))
            prepares += kind == ord("P") and body[:1] != b"\x00"
        with self.counter.lock:
            if self.server_spoke:
                self.counter.round_trips += 1
                self.server_spoke = False
            self.counter.statements += statements
            self.counter.prepares += prepares

    def from_server(self, data: bytes) -> None:
        done = 0
        for kind, body in self.server.feed(data):
            if kind == ord("C"):
                self.completed = True
            elif kind == ord("Z") and body[:1] == b"I" and self.completed:
                done += 1
                self.completed = False
        with self.counter.lock:
            self.server_spoke = True
            self.counter.transactions += done


class WireCounter:
    """A proxy on 127.0.0.1 (a free port) to ``host:port``, counting what its connections send.

    Use as a context manager; ``dsn(url)`` points a ``postgresql://`` URL at the proxy, ``counts()`` reads
    the totals so far (subtract two readings for what happened between them).
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 5432) -> None:
        self.target = (host, port)
        self.lock = threading.Lock()
        self.round_trips = self.transactions = self.statements = self.prepares = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = []
        self._closed = False

    def __enter__(self) -> WireCounter:
        threading.Thread(target=self._accept, name="wire-counter", daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._closed = True
        self._listener.close()
        for sock in self._sockets:
            try:
                sock.close()
            except OSError:
                pass

    def dsn(self, url: str) -> str:
        """``url`` (``postgresql://…``) through this proxy, without SSL or GSS encryption."""
        parts = urlsplit(url)
        user = parts.netloc.rpartition("@")[0] + "@" if "@" in parts.netloc else ""
        query = [(k, v) for k, v in parse_qsl(parts.query) if k not in ("sslmode", "gssencmode")]
        query += [("sslmode", "disable"), ("gssencmode", "disable")]
        netloc = f"{user}127.0.0.1:{self.port}"
        return urlunsplit(parts._replace(netloc=netloc, query=urlencode(query)))

    def counts(self) -> Counts:
        with self.lock:
            return Counts(self.round_trips, self.transactions, self.statements, self.prepares)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            for sock in (client, server):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._sockets += [client, server]
            link = _Link(self)
            threading.Thread(target=self._pump, args=(client, server, link.from_client), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, link.from_server), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket, seen: Callable[[bytes], None]) -> None:
        try:
            while data := source.recv(65536):
                seen(data)
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
