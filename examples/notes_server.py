"""A small MCP server (the official SDK's MCPServer, formerly FastMCP) for ``mcp_notes.py``.

``save_note`` is idempotent and honours the idempotency key tether sends in the request's ``_meta``:
a retried call with the same key stores nothing new. Every execution is appended to notes-calls.log,
to see how often a tool really ran.
"""

from __future__ import annotations

import json
import os

from mcp.server.mcpserver import Context, MCPServer
from mcp.types import ToolAnnotations

server = MCPServer("notes")
NOTES = "notes.json"


def _notes() -> dict[str, str]:
    if not os.path.exists(NOTES):
        return {}
    with open(NOTES, encoding="utf-8") as f:
        return dict(json.load(f))


@server.tool(annotations=ToolAnnotations(idempotentHint=True, destructiveHint=False))
def save_note(text: str, ctx: Context) -> str:
    """Save a note; saving again with the same idempotency key changes nothing.

    Args:
        text: The note.
    """
    key = str((ctx.request_context.meta or {}).get("tether/idempotency_key", text))
    with open("notes-calls.log", "a", encoding="utf-8") as log:
        log.write(f"save_note key={key} pid={os.getpid()}\n")
    notes = _notes()
    if key not in notes:
        notes[key] = text
        with open(NOTES, "w", encoding="utf-8") as f:
            json.dump(notes, f)
    return f"saved ({len(notes)} notes)"


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def list_notes() -> list[str]:
    """List the saved notes."""
    return list(_notes().values())


if __name__ == "__main__":
    server.run()
