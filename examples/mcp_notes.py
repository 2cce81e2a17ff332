"""An MCP server's tools as durable tools: ``notes_server.py`` run over stdio.

tether starts the server when the drive starts, offers its tools (``notes_save_note``,
``notes_list_notes``), and journals each call like a plain tool's. Kill this process after the call
started (TETHER_FAILPOINT=after_append:tool_started does it), then ``python mcp_notes.py`` again: the
run resumes, and the idempotent ``save_note`` is retried with the same idempotency key, which the server
uses so the note is saved once.

The model is scripted so the example runs offline.
"""

from __future__ import annotations

import sys

from tether import Agent, FileStore
from tether.mcp import MCPTools
from tether.testing import ScriptedModel, call

notes = MCPTools(sys.executable, ["notes_server.py"], prefix="notes")

agent = Agent(
    model=ScriptedModel(
        [call("notes_save_note", text="buy milk"), call("notes_list_notes"), "Saved: buy milk."]
    ),
    name="notes",
    tools=[notes],
    store=FileStore("runs"),
)

if __name__ == "__main__":
    state = agent.run("Remember to buy milk", id="notes-run", if_exists="resume")
    print("status:", state.status)
    print("answer:", state.answer)
