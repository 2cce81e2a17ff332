"""A small MCP server for tests/test_mcp.py, written with the official SDK; run as a subprocess.

``python tests/_mcp_server.py LOG [http PORT]``: every execution is appended to LOG as a JSON line
(tool, arguments, the request's ``_meta``, pid). ``die_*`` tools make the server exit mid-call on the
first execution of a call (no result is sent), as a crashed server would.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.types import CallToolResult, ImageContent, TextContent, ToolAnnotations

LOG = sys.argv[1]
app = MCPServer("test-server")


def _record(tool: str, args: dict[str, Any], ctx: Context) -> list[dict[str, Any]]:
    meta = dict(ctx.request_context.meta or {})
    with open(LOG, "a", encoding="utf-8") as f:
        f.write(json.dumps({"tool": tool, "args": args, "meta": meta, "pid": os.getpid()}) + "\n")
    with open(LOG, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


@app.tool(annotations=ToolAnnotations(readOnlyHint=True))
def lookup(word: str, ctx: Context) -> str:
    """Look a word up."""
    print("lookup noise on stderr", file=sys.stderr, flush=True)
    _record("lookup", {"word": word}, ctx)
    return f"{word}: a word"


@app.tool(annotations=ToolAnnotations(idempotentHint=True, destructiveHint=False))
def put(key: str, value: str, ctx: Context) -> str:
    """Store a value."""
    _record("put", {"key": key, "value": value}, ctx)
    return "stored"


@app.tool()
def delete(key: str, ctx: Context) -> str:
    """Delete a value (no annotations: unsafe, destructive)."""
    _record("delete", {"key": key}, ctx)
    return "deleted"


@app.tool()
def broken(ctx: Context) -> CallToolResult:
    """Answer with isError."""
    _record("broken", {}, ctx)
    return CallToolResult(content=[TextContent(type="text", text="no such key")], is_error=True)


@app.tool()
def picture(ctx: Context) -> CallToolResult:
    """Answer with an image and structured content only."""
    _record("picture", {}, ctx)
    return CallToolResult(
        content=[ImageContent(type="image", data="aGVsbG8=", mime_type="image/png")],
        structured_content={"width": 1, "height": 2},
    )


def _die_once(tool: str, ctx: Context) -> None:
    seen = _record(tool, {}, ctx)
    key = (ctx.request_context.meta or {}).get("tether/idempotency_key")
    if sum(1 for e in seen if e["tool"] == tool and e["meta"].get("tether/idempotency_key") == key) == 1:
        os._exit(3)  # mid-call: the client never gets a result


@app.tool(annotations=ToolAnnotations(idempotentHint=True))
def die_idempotent(ctx: Context) -> str:
    """Crash the server on the first execution of a call."""
    _die_once("die_idempotent", ctx)
    return "survived"


@app.tool()
def die_unsafe(ctx: Context) -> str:
    """Crash the server on the first execution of a call (unsafe)."""
    _die_once("die_unsafe", ctx)
    return "survived"


def _kill_driver_once(tool: str, ctx: Context) -> str:
    """SIGKILL the driving process (this server's parent) mid-call, on a call's first execution."""
    seen = _record(tool, {}, ctx)
    key = (ctx.request_context.meta or {}).get("tether/idempotency_key")
    if sum(1 for e in seen if e["tool"] == tool and e["meta"].get("tether/idempotency_key") == key) == 1:
        os.kill(os.getppid(), signal.SIGKILL)
    return "finished"


@app.tool(annotations=ToolAnnotations(readOnlyHint=True))
def crash_read_only(ctx: Context) -> str:
    """Kill the driver mid-call on the first execution (read-only)."""
    return _kill_driver_once("crash_read_only", ctx)


@app.tool(annotations=ToolAnnotations(idempotentHint=True))
def crash_idempotent(ctx: Context) -> str:
    """Kill the driver mid-call on the first execution (idempotent)."""
    return _kill_driver_once("crash_idempotent", ctx)


@app.tool()
def crash_unsafe(ctx: Context) -> str:
    """Kill the driver mid-call on the first execution (unsafe)."""
    return _kill_driver_once("crash_unsafe", ctx)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[2] == "http":
        app.run("streamable-http", host="127.0.0.1", port=int(sys.argv[3]))
    else:
        app.run()
