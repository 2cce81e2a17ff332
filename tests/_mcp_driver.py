"""Drives one run whose single call is an MCP tool of tests/_mcp_server.py; run as a subprocess.

``python tests/_mcp_driver.py STORE LOG TOOL run|resume`` prints the run's outcomes as JSON.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tether import Agent, FileStore
from tether.mcp import MCPTools
from tether.testing import ScriptedModel, call

store_dir, log, tool, mode = sys.argv[1:5]
server = str(Path(__file__).with_name("_mcp_server.py"))
agent = Agent(
    ScriptedModel([call(tool), "done"]),
    tools=[MCPTools(sys.executable, [server, log])],
    store=FileStore(store_dir),
)
state = agent.run("go", id="crash") if mode == "run" else agent.resume("crash")
finished = [e for e in state.history if e.kind == "tool_finished"]
starts = [e for e in state.history if e.kind == "tool_started"]
print(
    json.dumps(
        {
            "status": state.status,
            "outcomes": [e.outcome for e in finished],
            "texts": [e.content[0]["text"] for e in finished],
            "attempts": [e.attempt for e in starts],
            "keys": sorted({e.idempotency_key for e in starts}),
        }
    )
)
