"""MCP servers as durable tools (DESIGN 16; extra ``mcp``).

``MCPTools`` is a tool source: put it in ``Agent(tools=[...])`` beside plain tools. Each drive opens one
session to the server before it takes its run (a server that cannot start fails the drive before any model
request) and closes it when the run is released. The server's tools are offered like any tool; each call
is journaled as a plain tool's and recovered by its effect, read from the tool's MCP annotations unless
``effects=`` says otherwise. The request's ``_meta`` carries ``tether/idempotency_key``, ``tether/run_id``
and ``tether/call_id``. A connection lost during a call is an interrupted attempt of that effect: retried
after reconnecting (``read_only``, ``idempotent``) or closed ``aborted`` (``unsafe``).

The server's stderr goes to a temporary file, never to the terminal; its tail is in ``MCPServerError``.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import logging
import re
import tempfile
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Literal, TextIO, cast

from .errors import TetherError
from .journal import Effect
from .messages import text_block
from .tools import Tool, ToolContext, ToolCutOff, ToolInputError, _to_text

try:
    import anyio
    from mcp import ClientSession, MCPError, StdioServerParameters, stdio_client
    from mcp import types as mcp_types
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError(f"tether.mcp needs the MCP SDK ({exc}). Fix: pip install 'tether[mcp]'") from exc

__all__ = ["Approval", "MCPServerError", "MCPTools"]

log = logging.getLogger("tether")

Approval = bool | Literal["destructive"] | Sequence[str]
"""Which of a server's tools wait for a person: none, all, those MCP calls destructive, or name globs."""

_EFFECTS = ("read_only", "idempotent", "unsafe")
_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_STDERR_TAIL = 2000
_CONNECT_TIMEOUT = 30.0  # seconds for a server to start and answer initialize
_CUT_OFF = (
    anyio.ClosedResourceError,
    anyio.BrokenResourceError,
    anyio.EndOfStream,
    ConnectionError,
    EOFError,
)


class MCPServerError(TetherError):
    """An MCP server could not be started or reached; the message names it and the tail of its stderr."""


class MCPTools:
    """The tools of one MCP server, listed when each drive starts.

    Give ``command`` (and ``args``, ``env``, ``cwd``) for a stdio server, or ``url`` (and ``headers``) for
    a Streamable HTTP server.

    Args:
        command: the executable that starts a stdio server.
        args: its arguments.
        env: environment variables for the server, over the SDK's default environment.
        cwd: the server's working directory.
        url: a Streamable HTTP server's endpoint (``http://127.0.0.1:8000/mcp``).
        headers: HTTP headers sent with every request (authorization).
        prefix: offered names become ``{prefix}_{name}``.
        include: globs of the server's tool names to offer (default: all).
        exclude: globs of the server's tool names never offered.
        effects: ``{name: effect}`` overriding what the annotations say (``read_only``, ``idempotent``,
            ``unsafe``); names are the server's own.
        approval: which calls wait for a person: False (none), True (all), ``"destructive"`` (every tool
            not read-only whose ``destructiveHint`` is true or absent), or globs of server names.
        timeout: seconds a call may take (None: no limit), as ``@tool(timeout=)``.
        max_attempts: attempts of a read_only or idempotent call (timeouts, lost connections, crashes).

    Raises:
        ValueError: neither or both of ``command`` and ``url``, or an invalid option.
    """

    def __init__(
        self,
        command: str | None = None,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        *,
        url: str | None = None,
        headers: Mapping[str, str] | None = None,
        prefix: str | None = None,
        include: Sequence[str] | None = None,
        exclude: Sequence[str] | None = None,
        effects: Mapping[str, Effect] | None = None,
        approval: Approval = False,
        timeout: float | None = None,
        max_attempts: int = 3,
    ) -> None:
        if (command is None) == (url is None):
            raise ValueError(
                "MCPTools needs a command (stdio) or a url (Streamable HTTP), not both or neither. "
                "Fix: MCPTools('python', ['server.py']) or MCPTools(url='http://127.0.0.1:8000/mcp')"
            )
        if url is not None and (args or env or cwd):
            raise ValueError("args, env and cwd are for stdio servers. Fix: drop them, or pass a command")
        if command is not None and headers is not None:
            raise ValueError("headers are for HTTP servers. Fix: drop headers=, or pass url=")
        for name, effect in (effects or {}).items():
            if effect not in _EFFECTS:
                raise ValueError(
                    f"effects[{name!r}]={effect!r} is unknown. Fix: use one of {', '.join(_EFFECTS)}"
                )
        if not (isinstance(approval, bool) or approval == "destructive") and (
            isinstance(approval, str) or not all(isinstance(g, str) for g in approval)
        ):
            raise ValueError(
                f"approval={approval!r} is not known. Fix: pass False, True, 'destructive' or a list "
                "of name globs"
            )
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
            raise ValueError(
                f"max_attempts={max_attempts!r} is not an int of at least 1. Fix: pass 1 or more"
            )
        self.command = command
        self.args = list(args)
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self.url = url
        self.headers = dict(headers) if headers is not None else None
        self.prefix = prefix
        self.include = list(include) if include is not None else None
        self.exclude = list(exclude or ())
        self.effects = dict(effects or {})
        self.approval: Approval = approval if isinstance(approval, bool | str) else list(approval)
        self.timeout = timeout
        self.max_attempts = max_attempts

    @property
    def label(self) -> str:
        """The server as messages name it: its command line or its URL."""
        if self.url is not None:
            return self.url
        return " ".join([self.command or "", *self.args])

    def __repr__(self) -> str:
        return f"MCPTools({self.label!r})"

    @contextlib.asynccontextmanager
    async def open_tools(self) -> AsyncIterator[list[Tool]]:
        """Start (or connect to) the server, list its tools, yield them; close the session on exit.

        Raises:
            MCPServerError: the server cannot start, connect, or list its tools.
        """
        connection = _Connection(self)
        try:
            session = await connection.session()
            listed = await _list_tools(session)
        except MCPServerError:
            await connection.close()
            raise
        except Exception as exc:
            await connection.close()
            raise connection.error("could not list its tools", exc) from exc
        try:
            yield [self._tool(item, connection) for item in listed if self._offered(item.name)]
        finally:
            await connection.close()

    def _offered(self, name: str) -> bool:
        if self.include is not None and not any(fnmatch.fnmatchcase(name, g) for g in self.include):
            return False
        return not any(fnmatch.fnmatchcase(name, g) for g in self.exclude)

    def _tool(self, listed: mcp_types.Tool, connection: _Connection) -> MCPTool:
        hints = listed.annotations
        effect: Effect
        if listed.name in self.effects:
            effect = self.effects[listed.name]
        elif hints is not None and hints.read_only_hint:
            effect = "read_only"
        elif hints is not None and hints.idempotent_hint:
            effect = "idempotent"
        else:
            effect = "unsafe"
        if isinstance(self.approval, bool):
            approval = self.approval
        elif self.approval == "destructive":
            destructive = hints is None or hints.destructive_hint is None or bool(hints.destructive_hint)
            approval = effect != "read_only" and destructive
        else:
            approval = any(fnmatch.fnmatchcase(listed.name, g) for g in self.approval)
        name = f"{self.prefix}_{listed.name}" if self.prefix else listed.name
        if not _NAME_RE.match(name):
            raise connection.error(
                f"offers a tool named {name!r}, which providers refuse (1-64 letters, digits, '_' or '-')",
                None,
                fix="exclude it with exclude=[...], or choose a shorter prefix",
            )
        return MCPTool(
            name=name,
            server_name=listed.name,
            description=listed.description or "",
            parameters=_parameters(listed.input_schema),
            effect=effect,
            approval=approval,
            timeout=self.timeout,
            max_attempts=self.max_attempts,
            connection=connection,
        )


class MCPTool(Tool):
    """One tool of an MCP server, as a drive offers and invokes it (made by ``MCPTools``).

    Its schema is the server's; its invocation is a ``tools/call`` through the drive's session.
    """

    server_name: str
    connection: _Connection

    def __init__(
        self,
        *,
        name: str,
        server_name: str,
        description: str,
        parameters: dict[str, Any],
        effect: Effect,
        approval: bool,
        timeout: float | None,
        max_attempts: int,
        connection: _Connection,
    ) -> None:
        self.name = name
        self.server_name = server_name
        self.description = description
        self.effect = effect
        self.approval = approval
        self.timeout = float(timeout) if timeout is not None else None
        self.max_attempts = max_attempts
        self.fn = self._not_callable
        self.is_async = True
        self.parameters = parameters
        self.schema = {"name": name, "description": description, "parameters": parameters}
        self._fields = {}
        self._ctx_param = None
        self._defaults = {}
        self.connection = connection

    def __repr__(self) -> str:
        return f"MCPTool(name={self.name!r}, server={self.connection.label!r}, effect={self.effect!r})"

    def _not_callable(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(f"MCP tool {self.name} runs through a drive. Fix: let the agent call it")

    def arguments(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """The arguments as given (the server fills its own defaults)."""
        return dict(kwargs)

    def validate(self, args: Any) -> dict[str, Any]:
        """Check the arguments are a JSON object; the server validates them against its schema."""
        if not isinstance(args, dict):
            raise ToolInputError(
                f"invalid arguments for {self.name}: expected a JSON object, got {_to_text(args)[:80]}. "
                f"Fix: call {self.name} again with an object of arguments matching its schema"
            )
        return dict(args)

    def invoke_sync(self, kwargs: dict[str, Any], ctx: ToolContext) -> Any:
        """MCP tools are async. Raises TypeError."""
        raise TypeError(f"tool {self.name} is async. Fix: await tool.invoke_async(kwargs, ctx)")

    async def invoke_async(self, kwargs: dict[str, Any], ctx: ToolContext) -> Any:
        """Call the tool on the server; returns content blocks.

        Raises:
            MCPToolError: the server answered ``isError`` (the outcome is ``error``).
            ToolCutOff: the connection was lost before the result came (reconnected on the next attempt).
        """
        meta = {
            "tether/idempotency_key": ctx.idempotency_key,
            "tether/run_id": ctx.run_id,
            "tether/call_id": ctx.call_id,
        }
        try:
            session = await self.connection.session()
        except MCPServerError as exc:
            raise ToolCutOff(f"the MCP server could not be reached again: {exc}") from exc
        try:
            result = await session.call_tool(self.server_name, kwargs, meta=cast(Any, meta))
        except _CUT_OFF as exc:
            self.connection.lost()
            raise ToolCutOff(f"the connection to MCP server {self.connection.label} was lost") from exc
        except MCPError as exc:
            if exc.code == mcp_types.CONNECTION_CLOSED or self.connection.is_dead():
                self.connection.lost()
                raise ToolCutOff(f"the connection to MCP server {self.connection.label} was lost") from exc
            raise
        blocks = result_blocks(result)
        if result.is_error:
            raise MCPToolError(" ".join(b["text"] for b in blocks if b["type"] == "text") or "(no text)")
        return blocks


class MCPToolError(Exception):
    """The server answered a call with ``isError``: the call's outcome is ``error``, this its text."""


def result_blocks(result: mcp_types.CallToolResult) -> list[dict[str, Any]]:
    """A ``CallToolResult`` as tether's content blocks.

    Text stays text, images become image blocks, anything else (audio, resources) its JSON text; structured
    content becomes JSON text when the result has no text block of its own (a server sends both, the text
    being the same data, when it follows the spec's advice).
    """
    blocks: list[dict[str, Any]] = []
    for item in result.content:
        if isinstance(item, mcp_types.TextContent):
            blocks.append(text_block(item.text))
        elif isinstance(item, mcp_types.ImageContent):
            blocks.append({"type": "image", "media_type": item.mime_type, "data": item.data})
        else:
            blocks.append(
                text_block(_to_text(item.model_dump(mode="json", by_alias=True, exclude_none=True)))
            )
    if result.structured_content is not None and not any(b["type"] == "text" for b in blocks):
        blocks.append(text_block(_to_text(result.structured_content)))
    return blocks or [text_block("")]


def _parameters(schema: dict[str, Any]) -> dict[str, Any]:
    """The server's input schema as offered to the model (without its top-level title)."""
    out = {k: v for k, v in schema.items() if k != "title"}
    out.setdefault("type", "object")
    out.setdefault("properties", {})
    return out


async def _list_tools(session: ClientSession) -> list[mcp_types.Tool]:
    tools: list[mcp_types.Tool] = []
    cursor: str | None = None
    while True:
        params = mcp_types.PaginatedRequestParams(cursor=cursor) if cursor else None
        page = await session.list_tools(params=params)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            return tools


class _Connection:
    """One drive's session to a server, owned by a task of its own (anyio scopes exit where they entered).

    ``session()`` connects on first use and again after ``lost()``; ``close()`` ends the session and, for
    stdio, stops the server.
    """

    def __init__(self, source: MCPTools) -> None:
        self.source = source
        self.label = source.label
        self._task: asyncio.Task[None] | None = None
        self._stop: asyncio.Event | None = None
        self._session: ClientSession | None = None
        self._lock = asyncio.Lock()
        self._ready: asyncio.Future[ClientSession] | None = None
        self._stderr: TextIO | None = None

    async def session(self) -> ClientSession:
        async with self._lock:
            if self._session is not None and not self.is_dead():
                return self._session
            await self.close()
            loop = asyncio.get_running_loop()
            ready: asyncio.Future[ClientSession] = loop.create_future()
            self._ready = ready
            self._stop = asyncio.Event()
            self._task = asyncio.create_task(self._serve(ready, self._stop))
            try:
                self._session = await asyncio.wait_for(asyncio.shield(ready), _CONNECT_TIMEOUT)
            except TimeoutError as exc:
                await self.close()
                raise self.error(f"did not answer initialize within {_CONNECT_TIMEOUT:.0f}s", exc) from exc
            except Exception as exc:
                await self.close()
                verb = "could not connect" if self.source.url else "could not start"
                raise self.error(verb, exc) from exc
            return self._session

    def is_dead(self) -> bool:
        return self._task is None or self._task.done()

    def lost(self) -> None:
        """The connection failed under a call: the next ``session()`` reconnects."""
        self._session = None

    async def close(self) -> None:
        task, self._task, self._session = self._task, None, None
        if self._stop is not None:
            self._stop.set()
        if task is not None and (self._ready is None or not self._ready.done()):
            task.cancel()  # still starting (initialize unanswered): nothing waits for the stop event yet
        if task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(task), 10)
            except (Exception, asyncio.CancelledError):
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        if self._ready is not None and self._ready.done() and not self._ready.cancelled():
            self._ready.exception()  # read, so asyncio does not log a failed start no one awaited

    async def _serve(self, ready: asyncio.Future[ClientSession], stop: asyncio.Event) -> None:
        try:
            async with contextlib.AsyncExitStack() as stack:
                streams = await stack.enter_async_context(self._transport())
                session = await stack.enter_async_context(ClientSession(streams[0], streams[1]))
                await session.initialize()
                if not ready.done():
                    ready.set_result(session)
                await stop.wait()
        except BaseException as exc:  # reported to the waiter, or logged
            if not ready.done():
                ready.set_exception(exc if isinstance(exc, Exception) else RuntimeError(repr(exc)))
            else:
                log.debug("MCP server %s: session ended (%s)", self.label, exc)
            if not isinstance(exc, Exception):
                raise
        finally:
            if not ready.done():
                ready.set_exception(RuntimeError("the session ended before it started"))

    def _transport(self) -> contextlib.AbstractAsyncContextManager[Any]:
        source = self.source
        if source.url is not None:
            client = create_mcp_http_client(headers=source.headers)
            return streamable_http_client(source.url, http_client=client)
        if self._stderr is None:
            self._stderr = cast(TextIO, tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace"))  # noqa: SIM115
        params = StdioServerParameters(
            command=source.command or "", args=source.args, env=source.env, cwd=source.cwd
        )
        return stdio_client(params, errlog=self._stderr)

    def stderr_tail(self) -> str:
        """The last characters the server wrote to its stderr (every start of this drive's)."""
        if self._stderr is None:
            return ""
        try:
            self._stderr.flush()
            self._stderr.seek(0)
            text = self._stderr.read()
            self._stderr.seek(0, 2)
        except (OSError, ValueError):
            return ""
        return text[-_STDERR_TAIL:].strip()

    def error(self, what: str, exc: BaseException | None, fix: str | None = None) -> MCPServerError:
        """An MCPServerError naming the server, what failed, the cause and the tail of its stderr."""
        cause = f": {_describe(exc)}" if exc is not None else ""
        tail = self.stderr_tail()
        stderr = f"; its stderr ends with:\n{tail}\n" if tail else "; it wrote nothing to stderr. "
        if fix is None:
            fix = (
                f"check that `{self.label}` runs on its own and speaks MCP over stdio"
                if self.source.url is None
                else f"check that an MCP server listens at {self.label} (Streamable HTTP)"
            )
        return MCPServerError(f"MCP server {self.label} {what}{cause}{stderr}Fix: {fix}")


def _describe(exc: BaseException) -> str:
    """An exception's type and message, looking inside exception groups (anyio's task groups)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
